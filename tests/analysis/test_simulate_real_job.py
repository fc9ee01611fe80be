"""What-ifs checked against real runs. The communication-bound MXNet MLP (a 5 MB layer split over both servers)
recorded at two link rates (tbf each way on every node, lab.record): the capture at one rate predicts the other's
mean iteration time within issue 14's 15 %. The same job behind a shaper whose bucket lets 4 MB bursts through (a
cloud's burst allowance: the links carry more than their rate), told the rate it was captured at: the replay
reproduces it, a what-if at that rate gives back the replay, and half the rate changes it as much as it changed
the job (issue 19, item 14: the stated rate replaced the calibrated links, the replay 71 % slower than the
capture). A Gloo all-reduce training loop recorded once: what its model keeps
at any link rate, the time no faster network removes, is the computation the workload's own record shows (its
steps' matrix products), neither the network's waits nor nothing. (`make bench`, section simulate, runs the
whole matrix: rates up to the fastest this machine sustains, LeNet, Gloo, more workers and servers, both
simulators.)"""
from __future__ import annotations

import json
import statistics

import pytest

from dlcsniff.analysis.job_model import load_job_model
from dlcsniff.analysis.simulate import WhatIf, predict, replay_job
from dlcsniff.analysis.simulate_network import EFFICIENCY
from dlcsniff.decoders.job import decode_paths
from dlcsniff.decoders.output import write_decode_output
from lab.record import GlooTraining, MXNetJobSpec, record_gloo_job, record_mxnet_job
from tests.conftest import require_root, require_workloads

pytestmark = pytest.mark.root

CAPTURED_MBIT, PREDICTED_MBIT = 50, 100
BATCHES = 4
GLOO_MBIT, GLOO_RANKS = 200, 4
# computation the workload records: about 60 ms a step on these cores
GLOO_TRAINING = GlooTraining(steps=6, grad_elements=2_621_440, compute_matmuls=64)
FASTEST_BIT_S = 100e9
# what the library does a step beside the workload's computation, which the record does not separate: reducing and
# copying the 10 MiB gradient, four ranks on two cores (the floor came 6-12 ms above the computation in trial
# runs with 24 and 64 products); the model before its fix kept 130 ms more
LIBRARY_WORK_S = 0.020


def _decoded(job_dir, tmp_path, name):
    decoded = tmp_path / f"{name}.decoded"
    write_decode_output(decode_paths([job_dir]), decoded)
    return load_job_model(decoded)


def _recorded(tmp_path, rate_mbit: int, burst_bytes: int | None = None, batches: int = BATCHES):
    name = f"wide_{rate_mbit}" + ("" if burst_bytes is None else f"_burst{burst_bytes}")
    spec = MXNetJobSpec(name, "dist_sync", "wide_mlp", batches, bigarray_bound=65536, rate_mbit=rate_mbit,
                        link_burst_bytes=burst_bytes)
    job_dir = record_mxnet_job(spec, tmp_path, str(require_workloads()), timeout_s=300)
    return _decoded(job_dir, tmp_path, name)


def test_a_capture_at_one_rate_predicts_the_job_at_another(tmp_path):
    require_root()
    captured = _recorded(tmp_path, CAPTURED_MBIT)
    measured = replay_job(_recorded(tmp_path, PREDICTED_MBIT)).measured["iteration_s"].mean()
    frame, own = predict(captured, [WhatIf(), WhatIf(bandwidth_bit_s=PREDICTED_MBIT * 1e6)],
                         captured_rate_bit_s=CAPTURED_MBIT * 1e6)
    replayed, predicted = frame["iteration_s_mean"]
    # the job is network-bound at both rates: twice the rate, nearly half the time
    assert measured < 0.7 * own["measured_iteration_s_mean"]
    assert replayed == pytest.approx(own["measured_iteration_s_mean"], rel=0.15)
    assert predicted == pytest.approx(measured, rel=0.15)


def test_behind_a_bursty_shaper_a_what_if_at_the_captured_rate_gives_back_the_replay(tmp_path):
    require_root()
    shaped_mbit, half_mbit, burst_bytes, batches = 50, 25, 4_000_000, 5
    captured = _recorded(tmp_path, shaped_mbit, burst_bytes, batches)
    measured_half = replay_job(_recorded(tmp_path, half_mbit, burst_bytes, batches)).measured["iteration_s"].mean()
    frame, own = predict(captured, [WhatIf(), WhatIf(bandwidth_bit_s=shaped_mbit * 1e6),
                                    WhatIf(bandwidth_bit_s=half_mbit * 1e6)], captured_rate_bit_s=shaped_mbit * 1e6)
    replayed, at_shaped, at_half = frame["iteration_s_mean"]
    measured = own["measured_iteration_s_mean"]
    figures = dict(measured=measured, measured_half=measured_half, replayed=replayed, at_shaped=at_shaped,
                   at_half=at_half, link_bit_s=own["link_bit_s"])
    # the bursts are real: the links carried more than the rate they were shaped to (trial runs: about twice)
    assert own["link_bit_s"] > 1.3 * shaped_mbit * 1e6, figures
    assert replayed == pytest.approx(measured, rel=0.15), figures
    assert at_shaped == pytest.approx(replayed, rel=0.05), figures
    # what the what-if changes is what the job shows (trial runs: the ratio within 5 %, on cores 7-10 times
    # oversubscribed), and so is its time
    assert at_half / at_shaped == pytest.approx(measured_half / measured, rel=0.08), figures
    assert at_half == pytest.approx(measured_half, rel=0.15), figures


def test_a_gloo_all_reduce_keeps_at_any_rate_the_computation_the_workload_recorded(tmp_path):
    require_root()
    job_dir = record_gloo_job(tmp_path, str(require_workloads()), name="gloo_train", rate_mbit=GLOO_MBIT,
                              training=GLOO_TRAINING, timeout_s=300)
    steps = [json.loads((job_dir / f"rank{rank}.json").read_text())["steps"] for rank in range(GLOO_RANKS)]
    # the workload's record: a step computes, then all-reduces; the all-reduce waits for the slowest rank
    computation_s = statistics.mean(max(rank_steps[step]["all_reduce_ns"] - rank_steps[step]["start_ns"]
                                        for rank_steps in steps) / 1e9 for step in range(1, GLOO_TRAINING.steps))
    # a bandwidth-optimal all-reduce (Gloo's ring) sends 2 (K-1)/K of the gradient from every rank
    sent_bytes = 2 * (GLOO_RANKS - 1) / GLOO_RANKS * GLOO_TRAINING.grad_elements * 4
    at_fastest_s = sent_bytes * 8 / (FASTEST_BIT_S * EFFICIENCY)
    frame, own = predict(_decoded(job_dir, tmp_path, "gloo_train"), [WhatIf(), WhatIf(bandwidth_bit_s=FASTEST_BIT_S)],
                         captured_rate_bit_s=GLOO_MBIT * 1e6)
    replayed, floor = frame["iteration_s_mean"]
    assert replayed == pytest.approx(own["measured_iteration_s_mean"], rel=0.15)
    # the capture's step is mostly the link's, and none of that may stay at 100 Gbit/s (the model that took every
    # wait before a send for computation kept 0.19 s of this job's 0.72 s), nor may the computation go
    assert own["measured_iteration_s_mean"] > 4 * computation_s
    assert computation_s <= floor <= computation_s + at_fastest_s + LIBRARY_WORK_S, (floor, computation_s)
