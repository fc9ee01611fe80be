"""The decode's training iterations (messages.parquet and events.parquet `iteration`,
decoders.protocols.pslite.job), held to what the bundled MXNet jobs' workers recorded themselves (pcaps/<job>/worker*.json: each kvstore call with the
tensors it moved, and each batch's start and end)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

import dlcsniff
from tests.conftest import PCAPS


def _recorded_requests(job: str) -> pd.DataFrame:
    """(worker_id, iteration, tensor_key) of every tensor a worker's kvstore call moved: training push-pulls
    numbered by the batch they were called in, the initial broadcast -1."""
    rows = []
    for path in sorted((PCAPS / job).glob("worker*.json")):
        record = json.loads(path.read_text())
        worker_id = 9 + 2 * record["rank"]                   # ps-lite: worker rank r is node 9 + 2r
        batches = record["batches"]
        for op in record["operations"]:
            if op["op"] == "broadcast":
                iteration = -1
            elif op["op"] in ("pushpull", "push"):
                iteration = next(b["index"] for b in batches if b["start_ns"] <= op["call_ns"] <= b["end_ns"])
            else:
                continue
            rows += [(worker_id, iteration, tensor["key"]) for tensor in op["tensors"]]
    return pd.DataFrame(rows, columns=["worker_id", "iteration", "tensor_key"]).drop_duplicates()


@pytest.mark.parametrize("job", ["mxnet_sync", "mxnet_lossy", "mxnet_lossy_heavy"])
def test_every_request_is_numbered_with_the_batch_its_worker_called_it_in(decoded_job, job):
    """Each worker's requests to the servers and their responses, as the job's events hold them, carry the
    iteration and tensor of the worker's own kvstore call, and every call is there. mxnet_lossy's server capture
    lost two of a worker's pushes (batches 2 and 3 of tensor 3), which numbered per capture put its batch-4 push
    in round 2; in mxnet_lossy_heavy no capture saw three of a worker's requests, only their responses, which
    still open their rounds (the worker's later pushes were numbered three rounds early)."""
    job_view = dlcsniff.load(decoded_job(job))
    events = job_view.table("events")
    data = events[(events["protocol"] == "pslite") & events["control_cmd"].isna() & ~events["simple_app"].fillna(False)]
    request = data["request"].fillna(False)
    seen = pd.DataFrame({"worker_id": data["sender_id"].where(request, data["recver_id"]),
                         "iteration": data["iteration"], "tensor_key": data["tensor_key"]})
    assert seen.notna().all().all()
    seen = seen.astype("int64").drop_duplicates()
    recorded = _recorded_requests(job)
    merged = recorded.merge(seen, how="outer", indicator=True)
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"]
    # every capture's sighting of a message carries its event's iteration
    messages = job_view.table("messages")
    pslite = messages[messages["protocol"] == "pslite"]
    per_event = pslite.groupby("event_id")["iteration"].nunique(dropna=False)
    assert (per_event == 1).all()
    assert pslite["event_id"].nunique() == (events["protocol"] == "pslite").sum()


def test_iteration_and_tensor_key_have_one_dtype_in_every_protocol(decoded_job):
    """Nullable integers for ps-lite and the collective libraries alike (Arrow int32 with nulls, as the stats
    tables' iteration; tensor_key int64); a Gloo message has no training iteration (its collective and seq say
    where it belongs)."""
    for table in ("messages", "events"):
        mxnet = dlcsniff.load(decoded_job("mxnet_sync")).table(table)
        gloo = dlcsniff.load(decoded_job("gloo")).table(table)
        for frame in (mxnet, gloo):
            assert str(frame["iteration"].dtype) == "Int32" and str(frame["tensor_key"].dtype) == "Int64"
            assert str(frame["collective"].dtype) == "string"
        assert gloo["iteration"].isna().all() and gloo["seq"].notna().any()
        commands = mxnet["simple_app"].fillna(False) | mxnet["control_cmd"].notna()
        assert mxnet.loc[commands, "iteration"].isna().all() and mxnet.loc[~commands, "iteration"].notna().all()

