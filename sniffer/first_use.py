"""Modules the capture daemon loads once packets are being captured, not before: what only the probes need
(libbpf, ELF symbols, /proc, the probe-event format, the objects' build) costs the capture's first moment
nothing. Each root helper loads what it needs for itself when told to go; the daemon loads all of them right
after its "capturing on" (`load_deferred`), while it may still read the files they are in (its Python may lie
where its user cannot look), then gives up its last capabilities. tests/sniffer/test_daemon_start.py checks
what is loaded at READY=1."""
from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

_deferred: list[str] = []


def on_first_use(name: str) -> ModuleType:
    """Module `name`, executed when one of its attributes is first read (importlib.util.LazyLoader), or by
    `load_deferred`; the module itself when it was imported already."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _deferred.append(name)
    return module


def load_deferred() -> None:
    """Execute every module deferred so far, and those they defer in turn."""
    while _deferred:
        getattr(sys.modules[_deferred.pop(0)], "__name__")
