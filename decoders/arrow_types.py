"""The Arrow types the decode tables use (decoders.schema and each protocol's columns), one name each."""
from __future__ import annotations

import pyarrow as pa

I32 = pa.int32()
I64 = pa.int64()
U64 = pa.uint64()
F64 = pa.float64()
STR = pa.string()
BOOL = pa.bool_()
LIST_I64 = pa.list_(I64)
LIST_U64 = pa.list_(U64)
