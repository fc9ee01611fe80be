"""The job's messages with the training iteration and the tensor each belongs to, at their sender with the DLC
operation, for the Python API (`Decoded.messages_by_iteration`, whose docstring lists the columns); the
iteration is the decode's (messages.parquet, decoders.protocols.pslite.job), through the DLC trace's records."""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.export_chrome_collectives import COLLECTIVE_PROTOCOLS
from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.names import node_labels, rank_label
from dlcsniff.analysis.operations import CATEGORY_DATA, INIT_ITERATION, pslite_trace

COLUMNS = ("protocol", "ts_ns", "sender", "receiver", "worker_rank", "server_rank", "tensor_key", "iteration",
           "operation", "collective", "seq", "size_bytes")
INTEGER_COLUMNS = ("ts_ns", "worker_rank", "server_rank", "tensor_key", "iteration", "seq", "size_bytes")
EVENT_COLUMNS = ("protocol", "send_ts_first_aligned_ns", "ts_first_ns", "src_rank", "dst_rank", "collective", "seq",
                 "size_bytes")


def _pslite(job: JobModel) -> pd.DataFrame:
    trace = pslite_trace(job.pslite)
    if trace is None:
        return pd.DataFrame(columns=list(COLUMNS))
    sent = trace.records[trace.records["is_send"].to_numpy(bool)]
    data = (sent["category"] == CATEGORY_DATA).to_numpy(bool)
    iteration = sent["iteration"].to_numpy(np.int64)
    return pd.DataFrame({
        "protocol": "pslite", "ts_ns": sent["ts_ns"].to_numpy(np.int64),
        "sender": node_labels(sent["node_id"].to_numpy()), "receiver": node_labels(sent["peer_id"].to_numpy()),
        "worker_rank": pd.array(np.where(data, sent["worker_rank"], -1), dtype="Int64"),
        "server_rank": pd.array(np.where(data, sent["server_rank"], -1), dtype="Int64"),
        "tensor_key": pd.array(sent["tensor_key"].to_numpy(np.float64, na_value=np.nan), dtype="Int64"),
        "iteration": pd.array(np.where(data & (iteration >= INIT_ITERATION), iteration, -99), dtype="Int64"),
        "operation": sent["operation"].astype(str).to_numpy(), "collective": None, "seq": pd.NA,
        "size_bytes": sent["length"].to_numpy(np.int64),
    }).replace({"worker_rank": {-1: pd.NA}, "server_rank": {-1: pd.NA}, "iteration": {-99: pd.NA}})


def _collectives(job: JobModel) -> pd.DataFrame:
    events = job.table("events", EVENT_COLUMNS)
    events = events[events["protocol"].isin(COLLECTIVE_PROTOCOLS).to_numpy(bool)]
    ranks = {side: events[column].astype("Int64") for side, column in (("sender", "src_rank"), ("receiver", "dst_rank"))}
    return pd.DataFrame({
        "protocol": events["protocol"].astype(str).to_numpy(),
        "ts_ns": events["send_ts_first_aligned_ns"].astype("Int64").fillna(events["ts_first_ns"].astype("Int64")),
        **{side: [rank_label(rank) if rank is not pd.NA else None for rank in values] for side, values in ranks.items()},
        "worker_rank": pd.NA, "server_rank": pd.NA, "tensor_key": pd.NA, "iteration": pd.NA, "operation": None,
        "collective": events["collective"].astype(object).to_numpy(), "seq": events["seq"].astype("Int64"),
        "size_bytes": events["size_bytes"].astype("Int64"),
    }).reset_index(drop=True)


def messages_by_iteration(job: JobModel) -> pd.DataFrame:
    """COLUMNS, one row per message of the job, in time order (see Decoded.messages_by_iteration)."""
    parts = [part for part in (_pslite(job), _collectives(job)) if len(part)]
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(COLUMNS))
    frame = frame.astype({name: "Int64" for name in INTEGER_COLUMNS})
    frame = frame.astype({name: "string" for name in ("protocol", "sender", "receiver", "operation", "collective")})
    return frame.sort_values("ts_ns", kind="stable", ignore_index=True)[list(COLUMNS)]
