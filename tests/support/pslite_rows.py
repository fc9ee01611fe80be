"""Hand-built ps-lite message rows of a tiny job (two servers, two workers, the decode output's columns), for the analysis unit tests."""
from __future__ import annotations

import pandas as pd
from dlcsniff.analysis.load import MESSAGE_COLUMNS, NODE_COLUMNS, Dataset


W0, W1, S0, S1, SCHED = 9, 11, 8, 10, 1            # ps-lite ids: worker r = 9 + 2r, server r = 8 + 2r


T0 = 1_700_000_000_000_000_000


WIRE = 40_000


def message(capture, ts, sender, recver, *, request, push=False, pull=False, stamp=0, size=100, key=None,
            complete=True, simple_app=False, control_cmd=None, last=None, simple_app_cmd=None) -> dict:
    return {"capture": capture, "ts_first_ns": T0 + ts, "ts_last_ns": T0 + (ts if last is None else last),
            "sender_id": sender, "recver_id": recver, "request": request, "push": push, "pull": pull,
            "simple_app": simple_app, "ps_timestamp": stamp, "app_id": 0, "customer_id": 0,
            "control_cmd": control_cmd, "size_bytes": size, "tensor_key": key, "req_type": "default",
            "rows": None, "simple_app_cmd": simple_app_cmd, "complete": complete, "flavor": "dmlc"}


def seen_by_both(sender_capture, recver_capture, ts, sender, recver, **fields) -> list[dict]:
    """A message in its sender's capture and, WIRE later, in its receiver's."""
    return [message(sender_capture, ts, sender, recver, **fields),
            message(recver_capture, ts + WIRE, sender, recver, **fields)]


CAPTURE = {W0: "w0", W1: "w1", S0: "s0", S1: "s1", SCHED: "sched"}


def dataset(rows: list[dict], *, without: tuple[str, ...] = ()) -> Dataset:
    """The messages, plus each node's registration with the scheduler (an ADD_NODE request, in the node's
    capture and the scheduler's, as in every real job), minus the captures `without`."""
    nodes = sorted({row["sender_id"] for row in rows} | {row["recver_id"] for row in rows} - {SCHED})
    registration = [row for node in nodes for row in seen_by_both(
        CAPTURE[node], CAPTURE[SCHED], -10_000_000 + node, node, SCHED, request=True, control_cmd=2, size=57)]
    kept = [row for row in registration + rows if row["capture"] not in without]
    messages = pd.DataFrame(kept, columns=list(MESSAGE_COLUMNS))
    for column in ("tensor_key", "control_cmd", "rows"):
        messages[column] = messages[column].astype("float64")
    return Dataset(messages=messages, nodes=pd.DataFrame(columns=list(NODE_COLUMNS)), source="test")


def exchange(worker_capture, server_capture, ts, worker, server, *, stamp, key, push, pull, rtt=500_000,
             request_size=1000, response_size=1000) -> list[dict]:
    """A request and its response, each seen at both ends."""
    response_key = key if response_size > 18 else None
    return (seen_by_both(worker_capture, server_capture, ts, worker, server, request=True, push=push, pull=pull,
                         stamp=stamp, size=request_size, key=key)
            + seen_by_both(server_capture, worker_capture, ts + rtt, server, worker, request=False, push=push,
                           pull=pull, stamp=stamp, size=response_size, key=response_key))
