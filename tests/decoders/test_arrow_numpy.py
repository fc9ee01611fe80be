"""decoders.arrow_numpy against pyarrow.compute, the kernels it stands in for on the decode path: the same values,
the same nulls and the same types, on columns of every kind the decode tables hold (numbers of each width,
booleans, strings, lists), with nulls or none, in several chunks and sliced (an array's offset into its buffers)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dlcsniff.decoders.arrow_numpy import as_arrow, filled, take, take_rows, valid

RNG = np.random.default_rng(22)
N = 203        # not a multiple of 8: the bitmaps' last byte is partial


def _values(data_type: pa.DataType, n: int) -> list:
    if pa.types.is_boolean(data_type):
        return RNG.integers(0, 2, n).astype(bool).tolist()
    if pa.types.is_integer(data_type):
        info = np.iinfo(data_type.to_pandas_dtype())
        return RNG.integers(info.min, info.max, n, endpoint=True).tolist()
    if pa.types.is_floating(data_type):
        return RNG.normal(size=n).tolist()
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return [f"s{value}" * int(value % 3) for value in RNG.integers(0, 100, n)]
    return [_values(data_type.value_type, int(length)) for length in RNG.integers(0, 4, n)]


def _columns(data_type: pa.DataType):
    """The column three ways: without nulls, a third null, all null; each in chunks, and sliced."""
    for null_share in (0.0, 0.33, 1.0):
        values = [None if RNG.random() < null_share else value for value in _values(data_type, N)]
        chunked = pa.chunked_array([pa.array(values[:70], data_type), pa.array(values[70:], data_type)])
        yield chunked
        yield chunked.combine_chunks().slice(13, N - 20)


NUMBERS = [pa.bool_(), pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.float64()]
EVERY_TYPE = NUMBERS + [pa.string(), pa.large_string(), pa.list_(pa.int64()), pa.list_(pa.string())]


@pytest.mark.parametrize("data_type", NUMBERS, ids=str)
def test_a_column_as_numpy_is_its_values_with_nulls_filled(data_type):
    for column in _columns(data_type):
        assert valid(column).tolist() == pc.is_valid(column).to_pylist()
        fill = False if pa.types.is_boolean(data_type) else 7
        values = filled(column, fill)
        assert values.dtype == np.dtype(data_type.to_pandas_dtype())
        assert values.tolist() == pc.fill_null(column, pa.scalar(fill, data_type)).to_pylist()


def test_a_column_without_a_type_is_all_fill():
    column = pa.array([None, None, None])
    assert valid(column).tolist() == [False] * 3
    assert filled(column, -1).tolist() == [-1] * 3
    with pytest.raises(TypeError):
        filled(pa.array(["a"]), 0)


@pytest.mark.parametrize("data_type", NUMBERS, ids=str)
def test_numbers_with_their_validity_become_the_array_pyarrow_builds(data_type):
    values = np.array(_values(data_type, N), dtype=data_type.to_pandas_dtype())
    is_valid = RNG.random(N) > 0.3
    built = as_arrow(values, data_type, is_valid)
    built.validate(full=True)
    assert built.type == data_type and built.null_count == int((~is_valid).sum())
    assert built.equals(pa.array([value if ok else None for value, ok in zip(values.tolist(), is_valid)], data_type))
    assert as_arrow(values, data_type).equals(pa.array(values.tolist(), data_type))


@pytest.mark.parametrize("data_type", EVERY_TYPE, ids=str)
def test_taking_rows_is_pyarrows_take(data_type):
    for column in _columns(data_type):
        rows = RNG.integers(0, len(column), 2 * len(column))
        taken = take(column, rows)
        taken.validate(full=True)
        expected = pc.take(column, pa.array(rows.tolist(), pa.int64()))
        if isinstance(expected, pa.ChunkedArray):
            expected = expected.combine_chunks()
        assert taken.type == data_type and taken.equals(expected)
        assert take(column, []).equals(pa.array([], data_type))


def test_taking_rows_of_a_decode_table_keeps_its_schema(tmp_path):
    """The messages of a real decode (every column type the decode writes), taken as the human summary takes
    them: the events' rows, in their order."""
    from dlcsniff.decoders.decode_run import decode_to_dir
    from tests.conftest import PCAPS

    decode_to_dir([PCAPS / "mxnet_sparse"], tmp_path / "out")
    messages = pq.read_table(tmp_path / "out" / "messages.parquet")
    rows = pq.read_table(tmp_path / "out" / "events.parquet")["message_row"].to_numpy()
    assert messages.num_rows > len(set(rows.tolist())) > 0       # some messages seen at both ends: rows left out
    taken = take_rows(messages, rows[::-1])
    assert taken.schema.equals(messages.schema, check_metadata=True)
    assert taken.equals(messages.take(pa.array(rows[::-1].tolist(), pa.int64())))
