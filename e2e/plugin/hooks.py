"""Post-import hooks: run a function on a module right after it is first imported.

Why not import the targets at plugin load: `vllm.platforms.rocm` initialises CUDA when imported on
an NVIDIA build (it asks torch for the device's gcnArchName) and raises on a CPU build. Importing it
from the plugin, before the worker has chosen its device, would put a CUDA context on GPU 0 from
every rank. So patches and counters attach when vLLM itself imports a module, or at once when it is
imported already. A hook that raises makes that import fail: a broken patch is never silent.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]

_hooks: dict[str, list[Hook]] = {}
_lock = threading.RLock()
_finder: _HookFinder | None = None


def when_imported(name: str, hook: Hook) -> bool:
    """Run hook(module) once module `name` is imported; now if it already is.

    Returns True if the module was already imported (the hook has run), False if it is deferred.
    """
    with _lock:
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__spec__", None) is not None and not _initialising(mod):
            hook(mod)
            return True
        _hooks.setdefault(name, []).append(hook)
        _install_finder()
        return False


def pending() -> list[str]:
    """Modules with hooks still waiting for their import."""
    with _lock:
        return sorted(n for n, hs in _hooks.items() if hs)


def _initialising(mod: ModuleType) -> bool:
    spec = getattr(mod, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _run_hooks(name: str, mod: ModuleType) -> None:
    with _lock:
        hooks = _hooks.pop(name, [])
    for h in hooks:
        h(mod)


def _install_finder() -> None:
    global _finder
    if _finder is None:
        _finder = _HookFinder()
        sys.meta_path.insert(0, _finder)


class _HookFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it, then wraps the loader of hooked modules."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookLoader(spec.loader, name)
                return spec
        return None


class _HookLoader(importlib.abc.Loader):
    """Delegates everything to the real loader; runs the hooks after the module body."""

    def __init__(self, inner: importlib.abc.Loader, name: str):
        self._inner = inner
        self._name = name

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _run_hooks(self._name, module)

    def __getattr__(self, item: str) -> Any:  # get_source, get_code, is_package, ...: the real loader's
        return getattr(self._inner, item)
