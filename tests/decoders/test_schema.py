"""decoders.schema: a table built from column lists or from a DataFrame has exactly its schema — integers stay
integers where values are missing, categories and pandas strings become `string`, an empty frame's columns keep
their types — and a frame that does not fit says so instead of being written."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dlcsniff.decoders.schema import BOOL, F64, I32, I64, LIST_I64, STR, TABLES, table

SMALL = table("small", "decode", "test row", [
    ("rank", I32, "a rank"), ("ts_first_ns", I64, "a time"), ("kind", STR, "a label"), ("complete", BOOL, "a flag"),
    ("ratio", F64, "a ratio"), ("sizes_bytes", LIST_I64, "a list"),
])


def test_a_frame_of_pandas_dtypes_becomes_the_schema():
    frame = pd.DataFrame({
        "kind": pd.Categorical(["a", "b", None]),
        "rank": [1.0, np.nan, 3.0],                          # what pandas makes of a nullable integer
        "ts_first_ns": pd.array([1_700_000_000_000_000_001, None, 3], dtype="Int64"),
        "complete": [True, None, False],
        "ratio": [0.5, np.nan, 1.0],
        "sizes_bytes": [[1, 2], None, []],
    })
    written = SMALL.from_frame(frame)
    assert written.schema.equals(SMALL.schema)
    assert written.column("rank").to_pylist() == [1, None, 3]
    assert written.column("ts_first_ns").to_pylist() == [1_700_000_000_000_000_001, None, 3]
    assert written.column("kind").to_pylist() == ["a", "b", None]
    assert written.column("complete").to_pylist() == [True, None, False]
    assert written.column("sizes_bytes").to_pylist() == [[1, 2], None, []]


def test_pandas_strings_are_string_not_large_string():
    frame = pd.DataFrame({name: [None] for name in SMALL.names}).assign(kind=pd.array(["x"], dtype="string"))
    assert SMALL.from_frame(frame).schema.field("kind").type == pa.string()


def test_an_empty_frame_keeps_every_type():
    written = SMALL.from_frame(pd.DataFrame(columns=list(SMALL.names)))
    assert written.num_rows == 0 and written.schema.equals(SMALL.schema)


def test_a_fraction_in_an_integer_column_is_refused():
    frame = pd.DataFrame({name: [None] for name in SMALL.names}).assign(rank=[1.5])
    with pytest.raises(pa.ArrowInvalid):
        SMALL.from_frame(frame)


def test_a_missing_or_unknown_column_is_refused():
    frame = pd.DataFrame({name: [None] for name in SMALL.names})
    with pytest.raises(ValueError, match=r"\['ratio'\] missing"):
        SMALL.from_frame(frame.drop(columns="ratio"))
    with pytest.raises(ValueError, match=r"\['extra'\] not in its schema"):
        SMALL.from_frame(frame.assign(extra=1))


def test_columns_in_any_order_are_written_in_the_schema_order():
    frame = pd.DataFrame({name: [None] for name in reversed(SMALL.names)})
    assert SMALL.from_frame(frame).schema.names == list(SMALL.names)


def test_column_lists_fill_what_a_decoder_did_not():
    written = TABLES["nodes"].from_columns({"node_id": [1, 8], "role": ["scheduler", "server"]})
    assert written.schema.equals(TABLES["nodes"].schema)
    assert written.column("hostname").to_pylist() == [None, None]
    assert TABLES["zmtp"].from_columns({}).schema.equals(TABLES["zmtp"].schema)
