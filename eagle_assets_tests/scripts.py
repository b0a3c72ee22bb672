"""Load a file that is not a package module (a benchmark script, the engine's site file) as a module."""

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The module that `path` defines, executed once per call, named `name` (default its stem)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
