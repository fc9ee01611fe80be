"""End-to-end truth for BytePS's ps-lite: the decode of real captures of bytedance/ps-lite (the copy in the BytePS
0.2.5.post15 sdist) against what ps-lite itself logged and what the programs recorded.

Each job in pcaps/byteps_* was recorded by lab/byteps/record.py (`make pcaps`): a scheduler, servers and
workers in network namespaces, one capture per host, PS_VERBOSE=2. The workers and, but for BytePS's own
server, the servers run lab/byteps/kv_app.cc, which records every request (JSON lines). Checked here, for
every node: the messages its log lists are exactly those decoded from its host's capture, field by field;
every request and answer the workers recorded is decoded, with its keys, lens, sizes, tensor, part, server
rank and (BytePS protocol) dtype, in the worker's capture and in the server's; and each request leaves after
it was issued and each answer arrives before the worker saw it (the namespaces share one clock).
"""
from __future__ import annotations

import collections

import pandas as pd
import pytest

from tests.conftest import PCAPS
from tests.support.decoded import decoded_tables
from tests.support.groundtruth import KvMessage, _none, kv_app_messages, load_job, unmatched_messages

# job → ZMTP version: kv_app against Debian's libzmq 4.3.4 (3.1) or the sdist's bundled 4.1.4 (3.0)
JOBS = {"byteps_3s3w": "3.1", "byteps_colocated_2x2": "3.1", "byteps_zmq414_2s2w": "3.0",
        "byteps_server_2s2w": "3.0", "byteps_server_colocated_2x2": "3.0"}
# pcap timestamps are microseconds
CAPTURE_RESOLUTION_NS = 1_000


@pytest.fixture(scope="module", params=sorted(JOBS))
def job_and_tables(request):
    return (load_job(PCAPS / request.param), *decoded_tables(PCAPS / request.param))


def test_every_logged_message_is_decoded_field_by_field(job_and_tables):
    """Both ends of a message between a server and the worker beside it are in their host's one capture."""
    job, tables, _ = job_and_tables
    for node in job.nodes:
        assert not job.log(node["name"]).attrs["unparsed_lines"]
        missing, extra = unmatched_messages(tables["messages"], job, node["name"])
        assert not missing and not extra, (
            f"{job.name}/{node['name']}: logged, not decoded {list(missing)[:3]}; decoded, not logged "
            f"{list(extra)[:3]}")


def decoded_kv_messages(messages: pd.DataFrame, capture: str, with_dtype: bool) -> list[KvMessage]:
    kv = messages[(messages["capture"] == capture) & messages["control_cmd"].isna()]
    return [KvMessage(
        int(row.sender_id), int(row.recver_id), bool(row.request), bool(row.push), int(row.ps_timestamp),
        int(row.app_id), int(row.customer_id), int(row.head), tuple(int(k) for k in row.keys),
        None if row.lens is None else tuple(int(n) for n in row.lens), tuple(int(s) for s in row.data_sizes),
        _none(row.tensor_key), _none(row.part), int(row.server_rank),
        (row.req_type, row.dtype) if with_dtype else None) for row in kv.itertuples()]


def test_every_recorded_request_and_answer_is_decoded_at_both_ends(job_and_tables):
    job, tables, _ = job_and_tables
    expected = kv_app_messages(job)
    with_dtype = any(m.head_says is not None for m in expected)
    assert with_dtype == job.meta["workers_program"].endswith("--protocol byteps")
    for node in job.nodes:
        if node["role"] == "scheduler":
            continue
        own = node["pslite_id"]
        want = collections.Counter(m for m in expected if own in (m.sender, m.recver))
        got = collections.Counter(m for m in decoded_kv_messages(tables["messages"], job.capture_name(node["name"]),
                                                                 with_dtype) if own in (m.sender, m.recver))
        assert sum(want.values()) > 0
        missing, extra = want - got, got - want
        assert not missing and not extra, (f"{job.name}/{node['name']}: recorded, not decoded {list(missing)[:2]}; "
                                           f"decoded, not recorded {list(extra)[:2]}")


def test_requests_leave_after_they_were_issued_and_answers_arrive_before_they_were_seen(job_and_tables):
    """In the worker's capture: a request's first byte after kv_app issued it (ZPush, ZPull, Request), its
    answer's last byte before Wait returned."""
    job, tables, _ = job_and_tables
    messages = tables["messages"]
    checked = 0
    for node in job.nodes:
        if node["role"] != "worker":
            continue
        own = node["pslite_id"]
        mine = messages[(messages["capture"] == job.capture_name(node["name"])) & messages["control_cmd"].isna()
                        & ((messages["sender_id"] == own) | (messages["recver_id"] == own))]
        seen = {(bool(row.request), int(row.customer_id), int(row.ps_timestamp),
                 int(row.recver_id if row.request else row.sender_id)): row for row in mine.itertuples()}
        for entry in job.records[node["name"]]:
            if entry["event"] != "request":
                continue
            servers = entry["recvers"] if entry["op"] == "simple" else [8 + 2 * m["server"] for m in entry["messages"]]
            for server in servers:
                request = seen[(True, entry["customer"], entry["ts"], server)]
                answer = seen[(False, entry["customer"], entry["ts"], server)]
                assert request.ts_first_ns + CAPTURE_RESOLUTION_NS >= entry["issue_ns"], (node["name"], entry)
                assert answer.ts_last_ns <= entry["done_ns"] + CAPTURE_RESOLUTION_NS, (node["name"], entry)
                checked += 1
    assert checked > 0


def test_nodes_and_streams_match_the_job(job_and_tables):
    job, tables, summary = job_and_tables
    nodes = tables["nodes"].set_index("node_id")
    for node in job.nodes:
        got = nodes.loc[node["pslite_id"]]
        assert (got["role"], got["hostname"], got["port"]) == (node["role"], node["ip"], node["port"])
        if node["role"] != "scheduler":
            assert got["rank"] == node["rank"]
    # every ps-lite stream named after its one sender, who lives at its source address, also where a server
    # and a worker share one (their answers travel on the worker's connection, named by routing frames)
    ip_of = {node["pslite_id"]: node["ip"] for node in job.nodes}
    streams = tables["streams"]
    ps = streams[streams["protocol"] == "pslite"]
    assert ps["node_id"].notna().all() and (ps["node_id"].map(ip_of) == ps["src_ip"]).all()
    messages = tables["messages"]
    senders = messages.merge(ps[["flow_id", "node_id"]], on="flow_id")
    assert (senders["sender_id"] == senders["node_id"]).all() and len(senders) == len(messages)
    assert set(ps["zmtp_version"]) == {JOBS[job.name]}
    assert set(messages["flavor"]) == {"byteps"}
    assert summary["missing_bytes"] == 0 and summary["incomplete_messages"] == 0
    assert summary["undecoded_messages"] == 0 and summary["unattributed_messages"] == 0
    assert summary["messages_without_node_ids"] == 0


def test_metas_have_the_layout_gpp_gave_this_ps_lite(job_and_tables):
    """RawMeta and RawNode as lab/byteps/meta_layout.cc printed them for the ps-lite the job ran (88 and 168
    bytes: bytedance/ps-lite 51f7248's layout): a KV meta is a RawMeta and one int32 data type per frame, a
    control meta a RawMeta and its nodes."""
    job, tables, _ = job_and_tables
    layout = job.meta["raw_meta_layout"]
    meta_size, node_size = layout["RawMeta"]["sizeof"], layout["RawNode"]["sizeof"]
    assert (meta_size, node_size) == (88, 168)
    messages = tables["messages"]
    kv = messages[messages["control_cmd"].isna() & ~messages["simple_app"]]
    assert (kv["meta_bytes"] == meta_size + 4 * kv["data_sizes"].map(len)).all()
    control = messages[messages["control_cmd"].notna()]
    assert ((control["meta_bytes"] - meta_size) % node_size == 0).all()
