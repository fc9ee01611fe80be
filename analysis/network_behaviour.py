"""What network studies of training traffic measure, beside SketchDLC's statistics: the ranks' arrival spread and
each operation's completion, burstiness and ON/OFF periods, incast, flow and message sizes, RoCEv2's paths and the
congestion signals per collective, and the diagnosis (analysis/diagnosis.py) they come with. `dlcsniff stats`
writes its tables and its summary sections ("network", "diagnosis"); the report opens with the diagnosis.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlcsniff.analysis.arrivals import operation_spread
from dlcsniff.analysis.describe import describe
from dlcsniff.analysis.diagnosis import WIRE_STREAM_COLUMNS, Diagnosis, diagnose
from dlcsniff.analysis.incast import incast
from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.load import WireView
from dlcsniff.analysis.operations import Trace
from dlcsniff.analysis.roce_paths import roce_collective_signals, roce_paths
from dlcsniff.analysis.size_distributions import size_distributions
from dlcsniff.analysis.traffic_shape import iteration_period_ns, traffic_shape


@dataclass(frozen=True, slots=True)
class NetworkBehaviour:
    """The network-behaviour tables of a job and its diagnosis."""

    diagnosis: Diagnosis
    arrival_spread: pd.DataFrame
    burstiness: pd.DataFrame
    on_off: pd.DataFrame
    incast: pd.DataFrame
    size_distributions: pd.DataFrame
    roce_paths: pd.DataFrame
    roce_collectives: pd.DataFrame

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"arrivals": self.diagnosis.arrivals, "arrival_spread": self.arrival_spread,
                "link_health": self.diagnosis.link_health, "burstiness": self.burstiness, "on_off": self.on_off,
                "incast": self.incast, "size_distributions": self.size_distributions, "roce_paths": self.roce_paths,
                "roce_collectives": self.roce_collectives}

    def summary(self) -> dict:
        """summary.json's "network" section: each measure in a few figures."""
        spread = self.arrival_spread
        one_ms = self.burstiness[self.burstiness["bin_ns"] == self.burstiness["bin_ns"].min()]
        period = iteration_period_ns(self.diagnosis.arrivals)
        return {
            "arrival_spread_ns": describe(spread["arrival_spread_ns"].to_numpy(np.float64)),
            "completion_ns": describe(spread["completion_ns"].astype("Float64").to_numpy(np.float64,
                                                                                      na_value=np.nan)),
            "iteration_period_ns": None if not np.isfinite(period) else period,
            "peak_to_mean": {f"{int(width / 1e6)}ms": describe(rows["peak_to_mean"].to_numpy(np.float64))
                             for width, rows in self.burstiness.groupby("bin_ns")},
            "on_fraction": describe(self.on_off["on_fraction"].to_numpy(np.float64)),
            "max_fan_in": int(self.incast["max_fan_in"].max()) if len(self.incast) else None,
            "busiest_host_1ms": None if not len(one_ms) else str(
                one_ms.loc[one_ms["peak_rate_gb_per_s"].idxmax(), "node"]),
            "roce_port_entropy_ratio": describe(self.roce_paths["port_entropy_ratio"].to_numpy(np.float64)),
            "roce_signals": {name: int(self.roce_collectives[name].sum())
                             for name in ("cnps", "naks", "retransmitted_packets")},
        }


def network_behaviour(wire: WireView, trace: Trace | None, captures: dict[str, str] | None = None
                      ) -> NetworkBehaviour:
    """Every network-behaviour table of a job, and its diagnosis (`captures`: each capture's file)."""
    diagnosis = diagnose(wire, trace, captures)
    burstiness, on_off = traffic_shape(wire.events, wire.streams, diagnosis.arrivals)
    return NetworkBehaviour(
        diagnosis=diagnosis, arrival_spread=operation_spread(diagnosis.arrivals), burstiness=burstiness,
        on_off=on_off, incast=incast(wire.events, wire.streams),
        size_distributions=size_distributions(wire.events, wire.streams), roce_paths=roce_paths(wire.streams),
        roce_collectives=roce_collective_signals(wire.streams, wire.collectives, wire.clocks))


def network_behaviour_of(job: JobModel, trace: Trace | None) -> NetworkBehaviour:
    """The network behaviour of a job (`trace`: its ps-lite trace, or None)."""
    return network_behaviour(job.wire(WIRE_STREAM_COLUMNS), trace, job.captures)
