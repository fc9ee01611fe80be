"""One event per message of a job (decoders.timeline): real MXNet and BytePS jobs decoded from every host's capture
(BytePS's colocated jobs run a server and a worker on each host), against the messages ps-lite itself logged
at both ends; one node's capture alone; and small hand-built captures for the corner cases (a message one
capture missed, repeats of one identity, an observer's capture)."""
from __future__ import annotations

import io

import collections

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlcsniff.analysis import AnalysisError, load_job_view
from dlcsniff.decoders.clocks import CLOCK_COLUMNS
from dlcsniff.decoders.output_dir import read_manifest
from dlcsniff.decoders.schema import CLOCKS, EVENTS
from dlcsniff.decoders.timeline import EVENT_COLUMNS, job_view
from dlcsniff.decoders.protocols.pslite import decoder as pslite
from dlcsniff.decoders.output import write_decode_output
from dlcsniff.decoders.job import decode_paths
from tests.conftest import PCAPS
from tests.support.groundtruth import KEMPTY, load_job, mxnet_jobs

JOBS = [*mxnet_jobs(), "byteps_3s3w", "byteps_colocated_2x2", "byteps_server_colocated_2x2"]


def _none(value):
    return None if value is None or value is pd.NA or (isinstance(value, float) and value != value) else value


def logged_messages(job) -> collections.Counter:
    """Every message of the job once, as (sender, recver, request, timestamp, control command, push,
    simple_app, head, app_id, customer_id): a message is logged as sent by its sender and as received by
    its receiver, so the job's messages are the larger of the two counts per key (ps-lite's Van::Stop
    sends TERMINATE to itself without logging the send: only its receipt is there)."""
    by_address = {(node["ip"], node["port"]): node["pslite_id"] for node in job.nodes}
    seen = {"send": collections.Counter(), "recv": collections.Counter()}
    for node in job.nodes:
        own = node["pslite_id"]
        for row in job.log(node["name"]).itertuples():
            if row.direction == "send":
                sender, recver = own, int(row.recver_id)
            else:
                # a node without an id yet is logged as "?": its ADD_NODE names its address
                sender = _none(row.sender_id)
                sender = by_address[row.nodes[0]["ip"], row.nodes[0]["port"]] if sender is None else int(sender)
                recver = own if row.recver_id == KEMPTY else int(row.recver_id)
            cmd = _none(row.control_cmd)
            control = cmd is not None
            seen[row.direction][(
                sender, recver, bool(row.request), _none(row.timestamp),
                None if cmd in (None, "EMPTY") else pslite.CONTROL_CMD_NAMES.index(cmd),
                None if control else bool(row.push), None if control else bool(row.simple_app),
                _none(row.head), None if control else _none(row.app_id), None if control else _none(row.customer_id),
            )] += 1
    return seen["send"] | seen["recv"]


def event_keys(events: pd.DataFrame) -> collections.Counter:
    found = collections.Counter()
    for row in events.itertuples():
        control = _none(row.control_cmd) is not None
        found[(
            int(row.sender_id), int(row.recver_id), bool(row.request), _none(row.ps_timestamp),
            int(row.control_cmd) if control else None, None if control else bool(row.push),
            None if control else bool(row.simple_app), _none(row.head),
            None if control else _none(row.app_id), None if control else _none(row.customer_id),
        )] += 1
    return found


def _job_inputs(decode_dir):
    """What the timeline is computed from, read back from a decode output."""
    from dlcsniff.analysis.load import read_columns
    from dlcsniff.decoders.timeline import MESSAGE_READ_COLUMNS, NODE_READ_COLUMNS, STREAM_READ_COLUMNS
    return (read_columns(decode_dir / "messages.parquet", MESSAGE_READ_COLUMNS),
            read_columns(decode_dir / "streams.parquet", STREAM_READ_COLUMNS),
            read_columns(decode_dir / "nodes.parquet", NODE_READ_COLUMNS))


@pytest.fixture(scope="module", params=JOBS)
def job_and_view(request, decoded_job):
    out = decoded_job(request.param)
    return load_job(PCAPS / request.param), load_job_view(out), out


def test_every_message_of_the_job_is_one_event(job_and_view):
    job, view, _ = job_and_view
    logged = logged_messages(job)
    events = view.events
    assert len(events) == sum(logged.values()) == events["event_id"].nunique()
    found = event_keys(events)
    assert found == logged, (list((logged - found).items())[:3], list((found - logged).items())[:3])


def test_both_ends_of_every_message_are_kept(job_and_view):
    job, view, _ = job_and_view
    events = view.events
    captures = {node["pslite_id"]: job.capture_name(node["name"]) for node in job.nodes}
    # every host has its capture: each message was seen by its sender's and its receiver's, once if they
    # share a host (a node's message to itself, a server's answer to the worker beside it)
    assert (events["send_capture"].astype(str) == events["sender_id"].map(captures)).all()
    assert (events["recv_capture"].astype(str) == events["recver_id"].map(captures)).all()
    one_host = events["sender_id"].map(captures) == events["recver_id"].map(captures)
    assert (events["observations"] == np.where(one_host, 1, 2)).all()
    assert events["observer_capture"].isna().all()
    assert view.losses["events_seen_at_both_ends"] == len(events) and view.losses["side_seen_twice"] == 0
    assert view.clocks["aligned"].all() and view.losses["captures_not_aligned"] == 0
    # a message's last byte arrives after its first byte left, on the one timeline (within the clocks' bound)
    bound = int(view.clocks["error_bound_ns"].max()) * 2
    assert ((events["ts_last_ns"] - events["ts_first_ns"]) >= -bound).all()
    assert (events["transit_ns"] >= -bound).all()
    assert events["ts_first_ns"].is_monotonic_increasing
    assert list(events.columns) == list(EVENT_COLUMNS)


def test_events_keep_the_observations_fields(job_and_view):
    _, view, decode_dir = job_and_view
    messages = pd.read_parquet(decode_dir / "messages.parquet")
    events = view.events
    source = messages.iloc[events["message_row"].to_numpy(np.int64)].reset_index(drop=True)
    assert (source["capture"].to_numpy() == events["send_capture"].astype(str).to_numpy()).all()
    assert (source["ts_first_ns"].to_numpy() == events["send_ts_first_ns"].to_numpy(np.int64)).all()
    for column in ("size_bytes", "sender_id", "recver_id", "request", "push"):
        assert (source[column].to_numpy() == events[column].to_numpy()).all(), column


def test_decode_output_writes_both_tables(job_and_view):
    job, view, decode_dir = job_and_view
    summary = read_manifest(decode_dir)["job_view"]
    events = pd.read_parquet(decode_dir / "events.parquet")
    clocks = pd.read_parquet(decode_dir / "clocks.parquet")
    assert list(events.columns) == list(EVENT_COLUMNS) and list(clocks.columns) == list(CLOCK_COLUMNS)
    assert len(events) == summary["events"] == len(view.events)
    assert summary["reference"] == "scheduler" and len(clocks) == len({node["capture"] for node in job.nodes})
    recomputed = job_view(*_job_inputs(decode_dir))
    # the events and clocks as written are those recomputed from the tables (through Parquet, in their schema)
    for table, written_frame, frame in ((EVENTS, events, recomputed.events), (CLOCKS, clocks, recomputed.clocks)):
        written = io.BytesIO()
        pq.write_table(table.from_frame(frame), written)
        pd.testing.assert_frame_equal(written_frame, pd.read_parquet(written))
    assert summary["losses"] == recomputed.losses


def test_one_capture_alone_merges_nothing(tmp_path):
    """worker0's capture only: each of its messages is one event, seen at one end (both for one to itself)."""
    job = load_job(PCAPS / "mxnet_async")
    write_decode_output(decode_paths([job.capture_path("worker0")]), tmp_path)
    view = load_job_view(tmp_path)
    messages = pd.read_parquet(tmp_path / "messages.parquet")
    events = view.events
    assert len(events) == len(messages)
    own = job.node("worker0")["pslite_id"]
    sent, received = events["sender_id"] == own, events["recver_id"] == own
    assert (events["send_capture"].notna() == sent).all() and (events["recv_capture"].notna() == received).all()
    clocks = view.clocks
    assert len(clocks) == 1 and clocks.loc[0, "capture"] == "worker0" == clocks.loc[0, "reference"]
    assert clocks.loc[0, "offset_ns"] == 0
    # times are worker0's own
    assert (events.loc[sent, "ts_first_ns"] == events.loc[sent, "send_ts_first_ns"]).all()


# --- hand-built captures ------------------------------------------------------------------------------

T0 = 1_700_000_000_000_000_000
SCHEDULER, WORKER, SERVER, OTHER_WORKER = 1, 9, 8, 11
ADDRESSES = {SCHEDULER: ("10.0.0.9", 7000), WORKER: ("10.0.0.2", 5000), SERVER: ("10.0.0.1", 9000),
             OTHER_WORKER: ("10.0.0.3", 5000)}
ROLES = {SCHEDULER: "scheduler", WORKER: "worker", SERVER: "server", OTHER_WORKER: "worker"}


def message(capture: str, sender: int, recver: int, ps_timestamp: int, ts: int, *, request: bool = True) -> dict:
    """A push (request or response) as `capture` saw it, at T0 + ts, 100 ns long on the wire."""
    return {"protocol": "pslite", "capture": capture, "flow_id": hash((capture, sender, recver)) % 2**31, "ts_first_ns": T0 + ts,
            "ts_last_ns": T0 + ts + 100, "sender_id": sender, "recver_id": recver, "sender_role": ROLES[sender],
            "recver_role": ROLES[recver], "request": request, "push": True, "pull": False, "simple_app": False,
            "ps_timestamp": ps_timestamp, "head": 0, "app_id": 0, "customer_id": 0, "control_cmd": None,
            "size_bytes": 100, "tensor_key": 0, "server_rank": 0, "req_type": "default", "dtype": "float32",
            "rows": None, "simple_app_cmd": None, "barrier_group": None, "flavor": "dmlc", "complete": True}


def own_capture(capture: str, node: int) -> dict:
    """A message to the scheduler, which only `node`'s own capture sees: it makes the capture `node`'s
    (in a capture of two nodes talking only to each other either could be the owner)."""
    return message(capture, node, SCHEDULER, 1000 + node, 0) | {"control_cmd": pslite.BARRIER}


def frames(rows: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(messages, streams, nodes): one stream per (capture, flow), its addresses the sender's and receiver's;
    every node at its address."""
    seen = {(r["capture"], r["flow_id"]): (r["sender_id"], r["recver_id"]) for r in rows}
    streams = pd.DataFrame([{"capture": c, "flow_id": f, "src_ip": ADDRESSES[s][0], "src_port": ADDRESSES[s][1],
                             "dst_ip": ADDRESSES[r][0], "dst_port": ADDRESSES[r][1]}
                            for (c, f), (s, r) in seen.items()])
    nodes = pd.DataFrame([{"node_id": node, "hostname": ip} for node, (ip, _) in ADDRESSES.items()])
    return pd.DataFrame(rows), streams, nodes


def test_a_message_one_capture_missed_is_still_one_event():
    # the worker's capture saw pushes 1, 2, 3 and their answers; the server's lost push 2 and its answer
    rows = [own_capture("w", WORKER), own_capture("s", SERVER)]
    rows += [message("w", WORKER, SERVER, stamp, 1000 * stamp) for stamp in (1, 2, 3)]
    rows += [message("s", WORKER, SERVER, stamp, 1000 * stamp + 300) for stamp in (1, 3)]
    rows += [message("s", SERVER, WORKER, stamp, 1000 * stamp + 500, request=False) for stamp in (1, 3)]
    rows += [message("w", SERVER, WORKER, stamp, 1000 * stamp + 800, request=False) for stamp in (1, 2, 3)]
    view = job_view(*frames(rows))
    events = view.events[view.events["control_cmd"].isna()]
    assert len(events) == 6
    lost = events[events["ps_timestamp"] == 2]
    assert len(lost) == 2 and (lost["observations"] == 1).all()
    assert lost["recv_capture"].isna().iloc[0] and lost["send_capture"].isna().iloc[1]
    both = events[events["ps_timestamp"] != 2]
    assert (both["observations"] == 2).all() and both["recv_capture"].notna().all()
    # 300 ns each way: the server's clock needs no correction, and every transit is 300 ns
    assert view.clocks.set_index("capture").loc["s", "offset_ns"] == 0
    assert (both["transit_ns"] == 300).all()


def test_repeats_of_one_identity_pair_up_in_order():
    """The same identity on one connection twice (ps-lite timestamps restart with a new customer): the first
    sighting in one capture is the first in the other, though the server's clock is 7 ms behind."""
    rows = [own_capture("w", WORKER), own_capture("s", SERVER)]
    rows += [message("w", WORKER, SERVER, 5, ts) for ts in (0, 10_000)]
    rows += [message("s", WORKER, SERVER, 5, ts - 7_000_000) for ts in (200, 10_200)]
    rows += [message("s", SERVER, WORKER, 6, ts - 7_000_000, request=False) for ts in (5_000, 15_000)]
    rows += [message("w", SERVER, WORKER, 6, ts, request=False) for ts in (5_200, 15_200)]
    view = job_view(*frames(rows))
    events = view.events[view.events["control_cmd"].isna()]
    assert len(events) == 4 and (events["observations"] == 2).all()
    assert (events["transit_ns"] == 200).all()
    # no scheduler capture: the first capture by name is the reference
    clocks = view.clocks.set_index("capture")
    assert clocks.loc["s", "reference"] == "s" and clocks.loc["w", "offset_ns"] == -7_000_000


def test_an_observers_capture_is_counted_once_and_said_so():
    """A capture nobody owns (a mirror port seeing two workers, a server and the scheduler) and the
    worker's own."""
    rows = [own_capture("w", WORKER), message("w", WORKER, SERVER, 1, 0), message("tap", WORKER, SERVER, 1, 50),
            message("tap", SERVER, WORKER, 1, 700, request=False), message("w", SERVER, WORKER, 1, 750, request=False),
            message("tap", OTHER_WORKER, SERVER, 9, 900), own_capture("tap", OTHER_WORKER) | {"ts_first_ns": T0}]
    view = job_view(*frames(rows))
    events = view.events[view.events["control_cmd"].isna()].set_index("ps_timestamp")
    assert len(events) == 3
    other = events.loc[[9]].iloc[0]
    assert other["observer_capture"] == "tap" and pd.isna(other["send_capture"]) and pd.isna(other["recv_capture"])
    assert other["ts_first_ns"] == T0 + 900 and other["observations"] == 1
    assert view.losses["events_seen_by_observers_only"] == 2      # the other worker's two messages
    assert (events.loc[[1], "observations"] == 2).all()
    # no message was seen at both ends: the reference (first by name) and w cannot be related
    clocks = view.clocks.set_index("capture")
    assert clocks.loc["w", "reference"] == "tap" and not clocks.loc["w", "aligned"]


def test_a_directory_that_is_no_decode_output_is_a_clear_error(tmp_path):
    with pytest.raises(AnalysisError, match="not a directory"):
        load_job_view(tmp_path / "missing")
    tmp_path.joinpath("messages.parquet").write_bytes(b"not parquet")
    with pytest.raises(AnalysisError, match="messages.parquet: not a readable Parquet file"):
        load_job_view(tmp_path)


def test_captures_without_pslite_merge_into_nothing(tmp_path):
    """The pyzmq job (no ps-lite): decode still gets its (empty) events and clocks tables."""
    summary = write_decode_output(decode_paths([PCAPS / "zmq"]), tmp_path)
    assert summary["events"] == 0 and summary["reference"] is None
    assert list(pd.read_parquet(tmp_path / "events.parquet").columns) == list(EVENT_COLUMNS)
    assert list(pd.read_parquet(tmp_path / "clocks.parquet").columns) == list(CLOCK_COLUMNS)
