"""`dlcsniff simulate`: replay a decoded job on a network simulator, as captured or on another network.

The job's model comes from the capture (analysis.simulate_pslite for parameter-server jobs,
analysis.simulate_collectives for collective-library jobs), the network's from the capture too
(analysis.simulate_network); the what-if options change the network (every node's link rate, the latency) or
the job's shape (workers, servers: parameter-server jobs). The replay runs on SimGrid or ns-3
(analysis.simulate_engines). Its messages are dated as a capture dates them and measured by the very function
`stats` measures the capture with (analysis.iterations), so `iteration_s_mean` and
`measured_iteration_s_mean` are the same quantity, of the simulation and of the capture.

SIMDIR gets summary.json, iterations.parquet (the simulation's, ITERATION_COLUMNS), measured_iterations.parquet
(the capture's), keys.parquet (parameter-server jobs: the simulation's per-key server overheads),
messages.parquet (every simulated message: nodes, size, issue, first and last byte) and manifest.json.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

import dlcsniff.analysis.simulate_collectives as co
import dlcsniff.analysis.simulate_pslite as ps
from dlcsniff.analysis.describe import describe
from dlcsniff.analysis.iterations import worker_iterations
from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.load import AnalysisError
from dlcsniff.analysis.operations import build_records
from dlcsniff.analysis.outputs import claim, label
from dlcsniff.analysis.overheads import key_overheads
from dlcsniff.analysis.simulate_network import Calibration, calibrate
from dlcsniff.analysis.simulate_replay import Program, ReplayError, message_times
from dlcsniff.analysis.summary import ITERATION_STATISTICS, json_value

DEFAULT_ENGINE = "simgrid"


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The network and job shape to simulate; None everywhere replays the captured network and job."""

    bandwidth_bit_s: float | None = None
    latency_s: float | None = None
    workers: int | None = None
    servers: int | None = None

    def is_replay(self) -> bool:
        return all(value is None for value in (self.bandwidth_bit_s, self.latency_s, self.workers, self.servers))


@dataclass(frozen=True, slots=True)
class Simulation:
    summary: dict
    iterations: pd.DataFrame                 # simulated, ITERATION_COLUMNS
    measured_iterations: pd.DataFrame
    messages: pd.DataFrame
    keys: pd.DataFrame | None = None
    tables_written: list[Path] = field(default_factory=list)

    def tables(self) -> dict[str, pd.DataFrame]:
        found = {"iterations": self.iterations, "measured_iterations": self.measured_iterations,
                 "messages": self.messages}
        if self.keys is not None:
            found["keys"] = self.keys
        return found


@dataclass(frozen=True, slots=True)
class _Job:
    """A captured job ready to replay: its program under a what-if, and how to read a replay back."""

    kind: str                                # "pslite" or "collectives"
    measured: pd.DataFrame                   # the capture's iterations
    measured_span_s: float                   # first byte of the first modelled message to the last byte of the last
    calibration: Calibration
    node_names: list[str]
    model_summary: dict
    build: object                            # what_if -> (Program, copy_of nodes, reader of times)


def _pslite_job(model: JobModel, captured_rate_bit_s: float | None) -> _Job | None:
    dataset = model.pslite
    if len(dataset.messages) == 0:
        return None
    trace = build_records(dataset)
    model = ps.pslite_model(trace)
    topology = trace.topology
    nodes = topology.workers + topology.servers
    calibration = calibrate(ps.network_ends(dataset, topology), ps.network_pairs(ps.data_messages(trace), topology),
                            nodes, captured_rate_bit_s)
    names = [f"worker{w}" for w in range(topology.workers)] + [f"server{s}" for s in range(topology.servers)]

    def build(what_if: WhatIf):
        built = ps.build_program(model, what_if.workers, what_if.servers)
        shape = built.topology
        copy_of = np.concatenate([np.arange(shape.workers) % topology.workers,
                                  topology.workers + np.arange(shape.servers) % topology.servers])

        def read(times: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
            simulated = ps.simulated_trace(built, times, model.mode, model.origin_ns)
            messages = built.messages.assign(src=built.program.messages["src"], dst=built.program.messages["dst"])
            return worker_iterations(simulated), key_overheads(simulated), messages
        return built.program, copy_of, read

    summary = {"kind": "parameter server", "workers": topology.workers, "servers": topology.servers,
               "mode": model.mode, "requests": int(len(model.requests)),
               "iterations_per_worker": int(model.requests["iteration"].max() + 1),
               "requests_queued_on_their_connection": model.queued_requests,
               "answers_queued_on_their_connection": model.queued_answers,
               "bigarray_bound_elements": model.bigarray_bound}
    messages = ps.data_messages(trace)
    span = (np.nanmax(messages["recv_ns"].to_numpy(np.float64)) - model.origin_ns) / 1e9
    return _Job("pslite", worker_iterations(trace), span, calibration, names, summary, build)


def _collective_job(job: JobModel, captured_rate_bit_s: float | None) -> _Job:
    model = co.collective_model(job)
    measured = worker_iterations(co.rank_trace(model.messages, model.ranks, model.messages["send_ns"].to_numpy(),
                                               model.messages["recv_ns"].to_numpy()))
    calibration = calibrate(co.network_ends(model), co.network_pairs(model), model.ranks, captured_rate_bit_s)
    program = co.build_program(model)                        # the same at every what-if a collective job takes

    def build(what_if: WhatIf):
        if what_if.workers is not None or what_if.servers is not None:
            raise AnalysisError("--workers and --servers apply to parameter-server jobs: a collective job's "
                                "messages are its library's algorithm for its number of ranks")

        def read(times: pd.DataFrame):
            send = model.origin_ns + np.round(times["start_s"].to_numpy() * 1e9).astype(np.int64)
            recv = model.origin_ns + np.round(times["end_s"].to_numpy() * 1e9).astype(np.int64)
            messages = model.messages[["src", "dst", "pg", "kind", "seq", "iteration", "size_bytes"]]
            return worker_iterations(co.rank_trace(model.messages, model.ranks, send, recv)), None, messages
        return program, np.arange(model.ranks), read

    summary = {"kind": "collectives", "ranks": model.ranks, "messages": int(len(model.messages)),
               "collectives_per_iteration": model.period, "collectives_repeat": model.repeats,
               "message_ends_unmatched": model.unmatched,
               "notes": [note for note in (co.clock_note(model),) if note],
               "messages_sent_in_parts": int((program.messages["message"].value_counts() > 1).sum())}
    span = (model.messages["recv_ns"].max() - model.origin_ns) / 1e9
    return _Job("collectives", measured, float(span), calibration, [f"rank{r}" for r in range(model.ranks)], summary,
                build)


def replay_job(model: JobModel, captured_rate_bit_s: float | None = None) -> _Job:
    """The job of the model, ready to replay (its ps-lite traffic, else its collectives)."""
    try:
        return _pslite_job(model, captured_rate_bit_s) or _collective_job(model, captured_rate_bit_s)
    except ValueError as exc:
        raise AnalysisError(f"{model.path}: nothing to simulate: {exc}") from None


def _per_worker(iterations: pd.DataFrame) -> pd.DataFrame:
    return iterations.groupby("worker_rank").agg(
        iteration_s_mean=("iteration_s", "mean"), communication_s_mean=("communication_s", "mean"),
        computation_s_mean=("computation_s", "mean"), overlap_ratio_mean=("overlap_ratio", "mean"),
        iterations=("iteration", "size"))


def _mean(values: pd.Series) -> float | None:
    finite = values.to_numpy(np.float64)
    finite = finite[np.isfinite(finite)]
    return float(finite.mean()) if len(finite) else None


def _summary(job: _Job, what_if: WhatIf, engine: str, simulated: pd.DataFrame, messages: pd.DataFrame,
             times: pd.DataFrame, links, wall_s: float, source: str) -> dict:
    predicted, measured = _mean(simulated["iteration_s"]), _mean(job.measured["iteration_s"])
    sim_workers, meas_workers = _per_worker(simulated), _per_worker(job.measured)
    per_worker = []
    for rank, row in sim_workers.iterrows():
        entry = {"worker_rank": int(rank), **{name: row[name] for name in sim_workers.columns}}
        if rank in meas_workers.index:
            entry.update({f"measured_{name}": meas_workers.loc[rank, name] for name in meas_workers.columns})
        per_worker.append(entry)
    return json_value({
        "source": source, "engine": engine, "replay": what_if.is_replay(),
        "parameters": {"engine": engine, "bandwidth_bit_s": what_if.bandwidth_bit_s, "latency_s": what_if.latency_s,
                       "workers": what_if.workers, "servers": what_if.servers,
                       "captured_bandwidth_bit_s": job.calibration.captured_rate_bit_s,
                       "up_bit_s": [float(rate) for rate in links.up_bit_s],
                       "down_bit_s": [float(rate) for rate in links.down_bit_s],
                       "host_bit_s": [None if rate >= 1e12 else float(rate) for rate in links.host_bit_s],
                       "latency_used_s": links.latency_s},
        "iteration_s_mean": predicted, "measured_iteration_s_mean": measured,
        "relative_difference": None if predicted is None or not measured else (predicted - measured) / measured,
        "communication_s_mean": _mean(simulated["communication_s"]),
        "measured_communication_s_mean": _mean(job.measured["communication_s"]),
        "overlap_ratio_mean": _mean(simulated["overlap_ratio"]),
        "measured_overlap_ratio_mean": _mean(job.measured["overlap_ratio"]),
        "span_s": float(np.nanmax(times["end_s"])) if len(times) else None,
        "measured_span_s": job.measured_span_s,
        "per_worker": per_worker,
        "statistics": {name: describe(simulated[name]) for name in ITERATION_STATISTICS},
        "measured_statistics": {name: describe(job.measured[name]) for name in ITERATION_STATISTICS},
        "model": job.model_summary,
        "network": job.calibration.summary(job.node_names),
        "simulation": {"messages": int(len(messages)), "wall_s": wall_s},
    })


def _prepare(job: _Job, what_if: WhatIf) -> tuple[Program, object, object]:
    program, copy_of, read = job.build(what_if)
    links = job.calibration.links.with_nodes(copy_of).with_rate(what_if.bandwidth_bit_s).with_latency(what_if.latency_s)
    return program, links, read


def simulate_job(model: JobModel, what_if: WhatIf = WhatIf(), *, engine: str = DEFAULT_ENGINE,
                 captured_rate_bit_s: float | None = None) -> Simulation:
    from dlcsniff.analysis.simulate_engines import simulate_all

    job = replay_job(model, captured_rate_bit_s)
    program, links, read = _prepare(job, what_if)
    began = time.monotonic()
    try:
        (times,) = simulate_all(engine, [(program, links)])
    except ReplayError as exc:
        raise AnalysisError(str(exc)) from None
    wall = time.monotonic() - began
    times = message_times(program, times)
    simulated, keys, messages = read(times)
    messages = messages.reset_index(drop=True).assign(**{name: times[name].to_numpy() for name in times.columns})
    summary = _summary(job, what_if, engine, simulated, messages, times, links, wall, model.source)
    return Simulation(summary, simulated, job.measured, messages, keys)


def _predict(job: _Job, what_ifs: list[WhatIf], engine: str, processes: int | None) -> pd.DataFrame:
    from dlcsniff.analysis.simulate_engines import simulate_all

    prepared = [_prepare(job, what_if) for what_if in what_ifs]
    try:
        results = simulate_all(engine, [(program, links) for program, links, _ in prepared], processes)
    except ReplayError as exc:
        raise AnalysisError(str(exc)) from None
    predicted = [_mean(read(message_times(program, times))[0]["iteration_s"])
                 for (program, _, read), times in zip(prepared, results)]
    return pd.DataFrame({"iteration_s_mean": [np.nan if p is None else p for p in predicted],
                         "wall_s": [times.attrs.get("wall_s", np.nan) for times in results]})


def _captured(job: _Job) -> dict:
    return {"measured_iteration_s_mean": _mean(job.measured["iteration_s"]),
            "link_bit_s": float(np.median(job.calibration.links.down_bit_s))}


def predict(model: JobModel, what_ifs: list[WhatIf], *, engine: str = DEFAULT_ENGINE,
            captured_rate_bit_s: float | None = None, processes: int | None = None) -> tuple[pd.DataFrame, dict]:
    """The mean iteration time each what-if predicts (one replay each, side by side): a frame of
    iteration_s_mean and wall_s (the simulation's) per what-if; and the capture's own figures
    ({"measured_iteration_s_mean", "link_bit_s"}: its measured iteration time and median calibrated link)."""
    job = replay_job(model, captured_rate_bit_s)
    return _predict(job, what_ifs, engine, processes), _captured(job)


def bandwidth_curve(model: JobModel, rates_bit_s: list[float], *, engine: str = DEFAULT_ENGINE
                    ) -> tuple[pd.DataFrame, dict]:
    """Predicted mean iteration time (rate_bit_s, iteration_s_mean) at each link rate and at the captured
    network's own (its median calibrated link), and the capture's own figures (see `predict`)."""
    job = replay_job(model)
    if job.model_summary.get("collectives_repeat") is False:
        raise AnalysisError("the job's collectives do not repeat, so it has no training iteration to time (`dlcsniff "
                            "simulate` takes each collective as a step)")
    captured = _captured(job)
    rates = sorted({*map(float, rates_bit_s), captured["link_bit_s"]})
    frame = _predict(job, [WhatIf(bandwidth_bit_s=rate) for rate in rates], engine, None)
    return frame.assign(rate_bit_s=rates)[["rate_bit_s", "iteration_s_mean"]], captured


def write_simulation(model: JobModel, out_dir: str | Path, what_if: WhatIf = WhatIf(), *, force: bool = False,
                     engine: str = DEFAULT_ENGINE, captured_rate_bit_s: float | None = None) -> Simulation:
    """`dlcsniff simulate`: the replay's tables and summary.json in out_dir (and manifest.json)."""
    import json

    out_dir = claim(out_dir, model.path, kind="simulate", force=force)
    simulation = simulate_job(model, what_if, engine=engine, captured_rate_bit_s=captured_rate_bit_s)
    written = []
    try:
        for name, table in simulation.tables().items():
            path = out_dir / f"{name}.parquet"
            table.to_parquet(path, index=False)
            written.append(path)
        path = out_dir / "summary.json"
        path.write_text(json.dumps(simulation.summary, indent=2, allow_nan=False) + "\n")
        written.append(path)
    except OSError as exc:
        raise AnalysisError(f"cannot write to {out_dir}: {exc.strerror or exc}") from exc
    label(out_dir, "simulate", model, written, parameters=simulation.summary["parameters"])
    return Simulation(simulation.summary, simulation.iterations, simulation.measured_iterations, simulation.messages,
                      simulation.keys, written)
