"""pyarrow without pandas, for a process that decodes (issue 22: importing pandas cost a small decode more than
tshark's whole pass over its capture).

pyarrow imports pandas, when it is installed, the first time it converts anything (`pa.array` of a list asks
whether it is a pandas object), and keeps the answer. After `skip_pandas()` pandas cannot be imported, so pyarrow
takes it to be absent: the decoders hand it lists and numpy arrays only. Code that does need pandas imports it
with `pandas()`, which lifts the ban and turns pyarrow's pandas support back on (without it pyarrow would take a
pandas object for a plain sequence); any other import of pandas fails loudly meanwhile.
"""
from __future__ import annotations

import importlib.abc
import sys
from types import ModuleType


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "pandas":
            raise ImportError("pandas is imported by dlcsniff.decoders.arrow_without_pandas.pandas() only")
        return None


_BAN = _NoPandas()


def skip_pandas() -> None:
    """Ban pandas from this process until `pandas()` is called, unless pandas is imported already. For a command's
    process, not a library's: its caller may hand pyarrow pandas objects."""
    if "pandas" not in sys.modules and _BAN not in sys.meta_path:
        sys.meta_path.insert(0, _BAN)


def pandas() -> ModuleType:
    """pandas, with pyarrow's support of pandas objects on (after skip_pandas, pyarrow took pandas to be absent)."""
    if _BAN in sys.meta_path:
        sys.meta_path.remove(_BAN)
        if "pyarrow" in sys.modules:
            import pyarrow as pa

            pa.array([], pa.int8()).to_pandas()      # pyarrow imports pandas again, and its pandas support with it
    import pandas as pd

    return pd
