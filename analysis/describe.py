"""Distribution summaries (count, mean, percentiles), shared by every statistic."""
from __future__ import annotations

import numpy as np
import pandas as pd

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def describe(values: pd.Series | np.ndarray) -> dict | None:
    """count, mean, min, percentiles and max of the finite values; None when there are none."""
    array = np.asarray(values, dtype=np.float64)
    array = array[np.isfinite(array)]
    if len(array) == 0:
        return None
    found = {"count": int(len(array)), "mean": float(array.mean()), "min": float(array.min())}
    found.update({name: float(np.quantile(array, q)) for name, q in QUANTILES.items()})
    found["max"] = float(array.max())
    return found
