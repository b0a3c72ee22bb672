"""Load a file that is not a package module (a benchmark script, the engine's site file) as a module."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """The module that `path` defines, named by its stem and executed once per call. It is in
    sys.modules while it runs, as an imported module is: a dataclass there looks its module up."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
