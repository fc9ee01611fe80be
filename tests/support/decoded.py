"""Reading a decode output the way the statistics and exports read it, written out independently for checks;
and a bundled job's decode tables."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dlcsniff.decoders.job import decode_paths


def decoded_tables(job_dir: Path) -> tuple[dict[str, pd.DataFrame], dict]:
    """The decode tables of a job's captures as DataFrames, and the decode summary (as `dlcsniff decode`)."""
    dataset = decode_paths([job_dir])
    return {name: table.to_pandas() for name, table in dataset.tables.items()}, dataset.summary


def on_reference_clock(messages: pd.DataFrame, clocks: pd.DataFrame) -> pd.DataFrame:
    """Message times read with each capture's clock from clocks.parquet (offset, then drift from the epoch),
    as the statistics and exports read them."""
    clock = clocks.set_index("capture").loc[messages["capture"]]
    out = messages.copy()
    for column in ("ts_first_ns", "ts_last_ns"):
        raw = messages[column].to_numpy(np.int64)
        drift = np.rint(clock["drift_ppm"].to_numpy(float) * 1e-6 * (raw - clock["epoch_ts_ns"].to_numpy(np.int64)))
        out[column] = raw + clock["offset_ns"].to_numpy(np.int64) + drift.astype(np.int64)
    return out
