"""The compiled parts of the decoders (C extensions pip builds from pyproject.toml's ext-modules), each the faster
twin of a pure-Python or numpy function that stays as the fallback and the reference its tests hold it to.

    decoders/inputs/record_walk.c  -> dlcsniff.decoders.inputs._record_walk   (decoders.inputs.record_walk)
    decoders/tcp_headers.c         -> dlcsniff.decoders._tcp_headers          (decoders.tcp_driver._Headers)
    decoders/protocols/zmtp_scan.c -> dlcsniff.decoders.protocols._zmtp_scan (decoders.protocols.zmtp._ZmtpScanner)

DLCSNIFF_PURE_PYTHON=1 in the environment makes every one of them fall back (tests, benchmarks).
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_PYTHON_VARIABLE = "DLCSNIFF_PURE_PYTHON"


def compiled_module(name: str) -> ModuleType | None:
    """The compiled module `name` (e.g. "dlcsniff.decoders._tcp_headers"), or None when it is not built or
    DLCSNIFF_PURE_PYTHON=1 asks for the pure-Python path."""
    if os.environ.get(PURE_PYTHON_VARIABLE) == "1":
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
