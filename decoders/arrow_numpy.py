"""A pyarrow column as numpy, its nulls kept apart (which rows are valid, what stands in for the others), and back.

For the decode's job steps, timeline and summary: pyarrow's own kernels (pyarrow.compute, and the Array and Table
methods that call it: fill_null, cast, filter, take, sort_by...) cost a small decode a large share of its time
just to import (issue 22), and the decode's tables are columns of fixed-width numbers, booleans and strings that
numpy handles as well. Types and validity are kept exactly: an int32 column with nulls taken stays int32 with the
same nulls.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa


def _array(column) -> pa.Array:
    """One array (a chunked column's chunks joined); any other sequence as pyarrow converts it."""
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks()
    return column if isinstance(column, pa.Array) else pa.array(column, from_pandas=True)


def _bits(buffer: pa.Buffer, offset: int, length: int) -> np.ndarray:
    """An Arrow bitmap (least significant bit first) as one bool per row."""
    bits = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), bitorder="little")
    return bits[offset:offset + length].astype(bool)


def _fixed_width(array: pa.Array) -> bool:
    return pa.types.is_boolean(array.type) or pa.types.is_integer(array.type) or pa.types.is_floating(array.type)


def valid(column) -> np.ndarray:
    """Which rows hold a value (pyarrow.compute.is_valid)."""
    array = _array(column)
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    if pa.types.is_null(array.type):
        return np.zeros(len(array), dtype=bool)
    return _bits(array.buffers()[0], array.offset, len(array))


def filled(column, fill) -> np.ndarray:
    """A column of numbers or booleans as numpy of its own type (bool, int32...), nulls as `fill`; an all-null
    column without a type as an array of `fill`s."""
    array = _array(column)
    if pa.types.is_null(array.type):
        return np.full(len(array), fill)
    if not _fixed_width(array):
        raise TypeError(f"not a column of numbers or booleans: {array.type}")
    if pa.types.is_boolean(array.type):
        values = _bits(array.buffers()[1], array.offset, len(array))
    else:
        dtype = np.dtype(array.type.to_pandas_dtype())
        values = np.frombuffer(array.buffers()[1], dtype=dtype, count=array.offset + len(array))[array.offset:]
    if array.null_count:
        values = np.where(valid(array), values, np.array(fill).astype(values.dtype))
    return values


def as_arrow(values: np.ndarray, data_type: pa.DataType, is_valid: np.ndarray | None = None) -> pa.Array:
    """Numbers or booleans as a pyarrow array of data_type, null where not `is_valid` (pyarrow.array of a numpy
    array imports numpy.ma, to ask whether it is a masked one)."""
    values = np.ascontiguousarray(values)
    bitmap, nulls = (None, 0) if is_valid is None else _bitmap(is_valid)
    data = (pa.py_buffer(np.packbits(values.astype(bool), bitorder="little")) if pa.types.is_boolean(data_type)
            else pa.py_buffer(values.astype(data_type.to_pandas_dtype(), copy=False)))
    return pa.Array.from_buffers(data_type, len(values), [bitmap, data], null_count=nulls)


def _bitmap(is_valid: np.ndarray) -> tuple[pa.Buffer | None, int]:
    """An Arrow validity bitmap (None: no nulls), and the number of nulls."""
    nulls = len(is_valid) - int(np.count_nonzero(is_valid))
    return (pa.py_buffer(np.packbits(is_valid, bitorder="little")) if nulls else None), nulls


def _offsets_type(data_type: pa.DataType) -> type | None:
    """The width of the offsets of a type whose values are runs of bytes or of a child's elements (None: not)."""
    if pa.types.is_string(data_type) or pa.types.is_binary(data_type) or pa.types.is_list(data_type):
        return np.int32
    if (pa.types.is_large_string(data_type) or pa.types.is_large_binary(data_type)
            or pa.types.is_large_list(data_type)):
        return np.int64
    return None


def take(column, rows: Sequence[int] | np.ndarray) -> pa.Array:
    """The column's rows at `rows`, in that order, of the column's type (pyarrow.compute.take): numbers and
    booleans, and strings and lists (of anything take takes) by their offsets."""
    array = _array(column)
    rows = np.asarray(rows, dtype=np.int64)
    if pa.types.is_null(array.type):
        return pa.nulls(len(rows))
    if _fixed_width(array):
        return as_arrow(filled(array, 0)[rows], array.type, valid(array)[rows])
    offsets_type = _offsets_type(array.type)
    if offsets_type is None:
        raise TypeError(f"cannot take rows of {array.type}")
    is_valid = valid(array)[rows]
    offsets = np.frombuffer(array.buffers()[1], dtype=offsets_type, count=array.offset + len(array) + 1)
    offsets = offsets[array.offset:]
    starts = offsets[rows]
    lengths = np.where(is_valid, offsets[rows + 1] - starts, 0)      # a null's run may be any length
    taken_offsets = np.zeros(len(rows) + 1, dtype=offsets_type)
    np.cumsum(lengths, out=taken_offsets[1:])
    # the position of each byte (each child element) taken, in the order taken
    elements = np.repeat(starts - taken_offsets[:-1], lengths) + np.arange(taken_offsets[-1], dtype=offsets_type)
    bitmap, nulls = _bitmap(is_valid)
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        # the offsets index the whole child, whatever the array's own offset
        return pa.Array.from_buffers(array.type, len(rows), [bitmap, pa.py_buffer(taken_offsets)], null_count=nulls,
                                     children=[take(array.values, elements)])
    data = np.frombuffer(array.buffers()[2], dtype=np.uint8)[elements] if len(elements) else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(array.type, len(rows), [bitmap, pa.py_buffer(taken_offsets), pa.py_buffer(data)],
                                 null_count=nulls)


def take_rows(table: pa.Table, rows: Sequence[int] | np.ndarray) -> pa.Table:
    """The table's rows at `rows`, in that order, with its schema (pyarrow.Table.take)."""
    return pa.Table.from_arrays([take(column, rows) for column in table.columns], schema=table.schema)
