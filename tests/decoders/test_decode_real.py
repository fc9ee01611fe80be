"""End-to-end truth: the decode of real MXNet captures against what ps-lite itself logged.

Each job in pcaps/ was recorded by lab/record.py: scheduler, 2 servers and 2 workers, each in its own
network namespace with its own capture, and PS_VERBOSE=2 so that ps-lite logged every message it sent and
received. For every node, the messages decoded from that node's own capture must be exactly the messages
its log lists — as a multiset, field by field — with nothing missing and nothing extra.
"""
from __future__ import annotations

import collections

import pandas as pd
import pytest

from tests.conftest import PCAPS
from tests.support.decoded import decoded_tables
from tests.support.groundtruth import (decoded_message_keys, event_message_keys, load_job, logged_message_keys,
                                      logged_sends, mxnet_jobs, unmatched_messages)

JOBS = mxnet_jobs()


@pytest.fixture(scope="module", params=JOBS)
def job_and_tables(request):
    return (load_job(PCAPS / request.param), *decoded_tables(PCAPS / request.param))


def test_every_logged_message_is_decoded_field_by_field(job_and_tables):
    job, tables, _ = job_and_tables
    messages = tables["messages"]
    assert messages["sender_id"].notna().all() and messages["recver_id"].notna().all()
    for node in job.meta["nodes"]:
        missing, extra = unmatched_messages(messages, job, node["name"])
        assert not missing and not extra, (
            f"{job.name}/{node['name']}: {sum(missing.values())} logged messages not decoded, e.g. "
            f"{list(missing)[:3]}; {sum(extra.values())} decoded but not logged, e.g. {list(extra)[:3]}")


def test_nodes_roles_and_addresses_match_the_job(job_and_tables):
    job, tables, _ = job_and_tables
    nodes = tables["nodes"].set_index("node_id")
    for node in job.meta["nodes"]:
        got = nodes.loc[node["pslite_id"]]
        assert got["role"] == node["role"]
        assert got["hostname"] == node["ip"] and got["port"] == node["port"]
        if node["role"] != "scheduler":
            assert got["rank"] == node["rank"]


def test_streams_name_their_sender_and_are_whole(job_and_tables):
    job, tables, summary = job_and_tables
    streams = tables["streams"]
    by_ip = {n["ip"]: n["pslite_id"] for n in job.meta["nodes"]}
    ps = streams[(streams["protocol"] == "pslite") & streams["node_id"].notna()]
    assert len(ps) > 0
    assert (ps["src_ip"].map(by_ip) == ps["node_id"]).all()
    assert (ps["zmtp_version"] == "3.0").all(), "MXNet 1.9.1 bundles libzmq 4.2.2: ZMTP 3.0"
    assert summary["missing_bytes"] == 0 and summary["incomplete_messages"] == 0
    assert summary["undecoded_messages"] == 0 and summary["messages_without_node_ids"] == 0


def test_tensor_attribution_matches_the_workload_record(job_and_tables):
    job, tables, _ = job_and_tables
    messages = tables["messages"]
    worker = next(n["name"] for n in job.meta["nodes"] if n["role"] == "worker")
    params = {p["key"]: p for p in job.records[worker]["parameters"]}
    kv = messages[messages["tensor_key"].notna()]
    assert set(kv["tensor_key"].astype(int)) == set(params)
    dense = kv[(kv["req_type"] == "default") & kv["push"] & kv["request"]]
    num_servers = job.meta["num_servers"]
    # A dense push carries the tensor's values: all parts of one key at one timestamp add up to its bytes.
    parts = dense.groupby(["capture", "flow_id", "tensor_key", "ps_timestamp"])
    for (_, _, key, _), group in parts:
        vals = group["data_sizes"].map(lambda s: s[1]).sum()
        assert vals <= params[key]["nbytes"]
    whole = dense.groupby(["capture", "tensor_key", "ps_timestamp"], as_index=False).agg(
        vals=("data_sizes", lambda col: sum(s[1] for s in col)), parts=("server_rank", "nunique"))
    whole = whole[whole["capture"].str.startswith("worker")]
    for row in whole.itertuples():
        assert row.vals == params[row.tensor_key]["nbytes"], row
        assert 1 <= row.parts <= num_servers
    assert set(dense["dtype"]) == {"float32"}


# Captures that lost packets (pcaps/mxnet_lossy: tcpdump dropped 25 % of server0's packets and 12 % of
# worker0's; mxnet_lossy_heavy: 48 %, 44 %, 15 %, 11 % and 6 % of its nodes'): the share of the messages ps-lite
# logged that come out of each node's own capture, and of the job's messages out of all captures together (the
# issue's targets on the first; on the second, where both ends of a message often lost it, 97.3 % of the logged
# messages and 97.6 % of the data messages job-wide).
LOSSY_TARGETS = {"mxnet_lossy": (0.96, 0.99), "mxnet_lossy_heavy": (0.96, 0.97)}


@pytest.fixture(scope="module", params=mxnet_jobs(lossy=True))
def lossy_job(request, decoded_job):
    decode_dir = decoded_job(request.param)
    return (load_job(PCAPS / request.param), pd.read_parquet(decode_dir / "messages.parquet"),
            pd.read_parquet(decode_dir / "events.parquet"))


def test_lossy_captures_give_what_they_saw_and_nothing_else(lossy_job):
    job, messages, _ = lossy_job
    single, _ = LOSSY_TARGETS[job.name]
    cut_short = messages[~messages["complete"].astype(bool)]
    logged_total = missing_total = restored = 0
    for node in job.meta["nodes"]:
        missing, extra = unmatched_messages(messages, job, node["name"])
        assert not extra, f"{node['name']}: decoded but not logged, e.g. {list(extra)[:2]}"
        logged = logged_message_keys(job, node["name"])
        logged_total += sum(logged.values())
        missing_total += sum(missing.values())
        # messages a hole cut short that still match ps-lite's log exactly: the sizes the meta and keys state
        restored += sum((decoded_message_keys(cut_short, job, node["name"]) & logged).values())
    assert logged_total - missing_total >= single * logged_total, 1 - missing_total / logged_total
    assert restored > 0


def test_a_job_keeps_every_message_one_of_its_captures_saw(lossy_job):
    job, messages, events = lossy_job
    _, job_wide = LOSSY_TARGETS[job.name]
    # data and SimpleApp messages (control messages are logged with the ids the nodes had then: a node's first
    # ADD_NODE is logged without one, the TERMINATE a node sends itself is not logged)
    def data(keys):
        return collections.Counter({key: n for key, n in keys.items() if key[4] is None})
    sent, found = data(logged_sends(job)), data(event_message_keys(events, messages))
    assert not found - sent, list(found - sent)[:3]
    assert sum((sent & found).values()) >= job_wide * sum(sent.values()), sum((sent & found).values()) / sum(sent.values())
