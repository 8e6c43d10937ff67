"""The GPU libraries' one test seam: an environment variable naming a Python file that stands in for
the vendor's module (pynvml, amdsmi), loaded once per process. Tests use it because no GPU fault can
be produced on a CPU machine (tests/support/fake_nvml.py, fake_amdsmi.py)."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def stand_in(var: str, name: str) -> ModuleType | None:
    """The module the file in $var holds (cached in sys.modules as `name`), or None when $var is unset."""
    path = os.environ.get(var)
    if not path:
        return None
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise RuntimeError(f"{var}={path!r}: not a Python file")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
    return sys.modules[name]
