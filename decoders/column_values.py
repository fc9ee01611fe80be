"""A column's values as Python objects (missing ones None), whatever holds it: a pyarrow array, a pandas Series,
a numpy array or a list. For the code both sides call: the decoders with their Arrow tables, analysis/ with its
DataFrames (the timeline's clocks and hosts, ps-lite's vantage points)."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa


def column_values(column) -> list:
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        return column.to_pylist()
    if isinstance(column, list):
        return column
    if isinstance(column, np.ndarray):
        # as pyarrow reads it (NaN: missing), without pyarrow: its conversion of numpy imports numpy.ma
        return [None if isinstance(value, float) and math.isnan(value) else value for value in column.tolist()]
    return pa.array(column, from_pandas=True).to_pylist()
