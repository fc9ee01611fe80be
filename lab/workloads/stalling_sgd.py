"""MXNet's SGD, able to stall one ps-lite server's update (a slow server, for lab/record.py's fault jobs).

A worker hands the optimizer to the servers pickled (kvstore.set_optimizer); each server unpickles it (this
module is on its path: it runs lab/workloads/mxnet_job.py) and runs its update for every tensor once the
round's pushes are merged (dist_sync), before it answers them. A server whose environment holds STALL_ENV
("ITERATION:SECONDS", set by mxnet_job.py --stall-batch on a server) sleeps SECONDS in the first update of
training iteration ITERATION (the ITERATION-th update of a tensor, counted from 0), so that every answer of
that round waits; FAULTS keeps what it did for the server's record. Without STALL_ENV it is SGD.
"""

from __future__ import annotations

import os
import time

from mxnet.optimizer import SGD, register

STALL_ENV = "DLCSNIFF_LAB_STALL_UPDATE"
FAULTS: list[dict] = []
_updates_per_tensor: dict[int, int] = {}


@register
class StallingSGD(SGD):
    def update_multi_precision(self, index, weight, grad, state):
        first = index[0] if isinstance(index, (list, tuple)) else index
        iteration = _updates_per_tensor.get(first, 0)
        _updates_per_tensor[first] = iteration + 1
        plan = os.environ.get(STALL_ENV)
        if plan and not FAULTS:
            stall_iteration, stall_s = plan.split(":")
            if iteration == int(stall_iteration):
                fault = {"kind": "stall_update", "iteration": iteration, "tensor_key": int(first),
                         "stall_s": float(stall_s), "start_ns": time.time_ns()}
                time.sleep(float(stall_s))
                fault["end_ns"] = time.time_ns()
                FAULTS.append(fault)
        super().update_multi_precision(index, weight, grad, state)
