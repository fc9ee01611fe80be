"""Reading a decode output the way the statistics and exports read it, written out independently for checks."""
from __future__ import annotations

import numpy as np
import pandas as pd


def on_reference_clock(messages: pd.DataFrame, clocks: pd.DataFrame) -> pd.DataFrame:
    """Message times read with each capture's clock from clocks.parquet (offset, then drift from the epoch),
    as the statistics and exports read them."""
    clock = clocks.set_index("capture").loc[messages["capture"]]
    out = messages.copy()
    for column in ("ts_first_ns", "ts_last_ns"):
        raw = messages[column].to_numpy(np.int64)
        drift = np.rint(clock["drift_ppm"].to_numpy(float) * 1e-6 * (raw - clock["epoch_ns"].to_numpy(np.int64)))
        out[column] = raw + clock["offset_ns"].to_numpy(np.int64) + drift.astype(np.int64)
    return out
