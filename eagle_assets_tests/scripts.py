"""Load a file that is not a package module (a benchmark script, the engine's site file) as a module."""

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """The module that `path` defines, named by its stem and executed once per call."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
