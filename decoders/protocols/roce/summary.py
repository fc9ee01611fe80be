"""RoCE's part of the decode summary (decoders.protocols.job_step): its streams' counters, the packets of streams
that showed no RoCE (unclaimed after all), the warning about streams claimed without a verified ICRC."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlcsniff.decoders.arrow_numpy import filled
from dlcsniff.decoders.protocols.roce.decoder import ROCE_V2_UDP_PORT, unverified_warning

if TYPE_CHECKING:
    import pyarrow as pa

COUNTERS = ("packets", "bytes", "bad_icrc", "cnp", "retransmitted_packets", "naks", "lost_packets")


def summary(streams: pa.Table, tables: dict[str, pa.Table]) -> dict:
    roce = np.array([protocol == "roce" for protocol in streams["protocol"].to_pylist()], dtype=bool)
    return {"roce": {name: int(filled(streams[name], 0)[roce].astype(np.int64).sum()) for name in COUNTERS}
            if roce.any() else {}}


def says(summary: dict) -> dict[str, str]:
    said = {"flow_kinds": ", RoCE queue pairs each way"} if "roce" in summary["flows_by_protocol"] else {}
    if summary["roce"]:
        said["counters"] = "RoCE: " + ", ".join(f"{name.replace('_', ' ')} {n:,}"
                                                for name, n in summary["roce"].items())
    return said


def unclaimed(counts: dict[str, int]) -> tuple[dict[int, int], int]:
    """RoCE datagrams (v2) and packets (v1) none of whose stream's packets passed the ICRC check."""
    unproven = counts.get("roce_v2_datagrams_unproven", 0)
    return {ROCE_V2_UDP_PORT: unproven} if unproven else {}, counts.get("roce_v1_packets_unproven", 0)


def warnings(capture: str, counts: dict[str, int]) -> list[str]:
    return [warning] if (warning := unverified_warning(capture, counts)) is not None else []
