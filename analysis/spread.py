"""Robust measures of a job's own spread, for the judgements that must not fire on a healthy job: one outlier
among many values moves neither the median of the others nor the median absolute deviation."""
from __future__ import annotations

import numpy as np
import pandas as pd

MAD_TO_SIGMA = 1.4826          # a normal distribution's standard deviation per median absolute deviation


def robust_sigma(values: np.ndarray) -> float:
    """1.4826 × the median absolute deviation of the finite values (0 when there are none)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not len(values):
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(values - np.median(values))))


def others_median(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per value, the median of the other finite values of its group (NaN where there are none).

    With its group's finite values sorted (w[0..n-1]) and a value at position k among them, the others are w
    without w[k]: their j-th is w[j] below k, w[j + 1] from k on. A value that is not finite is no other's and
    has all n for its others."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    frame = pd.DataFrame({"group": pd.factorize(np.asarray(group, dtype=object))[0], "value": values,
                          "finite": finite, "row": np.arange(len(values))})
    ordered = frame.sort_values(["group", "finite", "value"], ascending=[True, False, True], kind="stable")
    group_id = ordered["group"].to_numpy()
    position = ordered.groupby("group", sort=False).cumcount().to_numpy()
    count = ordered.groupby("group", sort=False)["finite"].transform("sum").to_numpy()
    new_group = np.r_[True, group_id[1:] != group_id[:-1]]
    first = np.maximum.accumulate(np.where(new_group, np.arange(len(group_id)), 0))     # the group's w[0]
    sorted_values = ordered["value"].to_numpy()
    is_finite = ordered["finite"].to_numpy()
    k = np.where(is_finite, position, count)             # not finite: nothing of the group's removed
    others = np.where(is_finite, count - 1, count)

    def nth(j: np.ndarray) -> np.ndarray:
        index = first + np.where(j < k, j, j + 1)
        return sorted_values[np.clip(index, 0, len(sorted_values) - 1)]

    half = others // 2
    median = np.where(others % 2 == 1, nth(half), (nth(np.maximum(half - 1, 0)) + nth(half)) / 2)
    median = np.where(others > 0, median, np.nan)
    out = np.empty(len(values))
    out[ordered["row"].to_numpy()] = median
    return out
