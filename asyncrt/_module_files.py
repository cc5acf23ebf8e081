"""A Python file imported as a module of a given name: the kernel modules a
user names on the command line (``--import my_kernels.py``) and the kernel
sources the compiled engine generates."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ("import_file",)


def import_file(name: str, path: Path) -> ModuleType:
    """Execute ``path`` as module ``name``, registered in ``sys.modules``
    (where numba's disk cache and pickling look modules up by name), and
    removed from it again if executing the file raises.

    :raises ImportError: if ``path`` is not a Python module.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python module: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
