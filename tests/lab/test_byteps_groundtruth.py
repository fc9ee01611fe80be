"""The ground truth beside the BytePS captures (pcaps/byteps_*, lab/byteps/record.py): bytedance/ps-lite's
PS_VERBOSE=2 log read line by line, as its threads tangle it, and the programs' own records checked against
each other (each worker's request handled by the kv_app server it went to, each pull given back what was
pushed). That every send is logged as received by its peer is checked with the MXNet jobs' in
test_recorder.py."""
from __future__ import annotations

import collections

import pandas as pd
import pytest

from tests.conftest import PCAPS
from tests.support.groundtruth import KEMPTY, load_job, parse_pslite_log

KV_APP_JOBS = ["byteps_3s3w", "byteps_zmq414_2s2w", "byteps_colocated_2x2"]
BYTEPS_SERVER_JOBS = ["byteps_server_2s2w", "byteps_server_colocated_2x2"]

NODE = "[role=worker, id=9, ip=198.18.0.3, port=9200, is_recovery=0, aux_id=-1]"
LOG_SAMPLE = f"""\
[16:05:38] src/postoffice.cc:25: Creating Van: zmq
[16:05:38] src/van.cc:441: Bind to [role=worker, ip=198.18.0.3, port=9200, is_recovery=0, aux_id=-1]
[16:05:38] src/van.cc:530: zeromq\tsent: ? => 1. Meta: request=1, timestamp=0, control={{ cmd=ADD_NODE, node={{ [role=worker, ip=198.18.0.3, port=9200, is_recovery=0, aux_id=-1] }} }}. THIS IS NOT DATA MSG!
[16:05:38] src/van.cc:555: zeromq\treceived: 1 => 2147483647. Meta: request=0, timestamp=1, control={{ cmd=ADD_NODE, node={{ {NODE} [role=scheduler, id=1, ip=198.18.0.1, port=9091, is_recovery=0, aux_id=-1] }} }}. THIS IS NOT DATA MSG!
[16:05:38] src/./zmq_van.h:149: Zmq skipped connection to node [role=worker, id=11, ip=198.18.0.2, port=9200, is_recovery=0, aux_id=-1]. My node is {NODE}
[16:05:38] src/van.cc:387: W[9] is connected to others
[16:05:38] src/van.cc:530: zeromq\tsent: ? => 1. Meta: request=1, timestamp=4, control={{ cmd=BARRIER, barrier_group=7 }}. THIS IS NOT DATA MSG!
[16:05:39] src/van.cc:530: zeromq\tsent: ? => 8. Meta: request=1, timestamp=12, app_id=0, customer_id=0, simple_app=0, push=1, head=0, key=24, data_type={{ UINT64 OTHER INT32 }} Body: data_size=8 data_size=4096 data_size=4
[16:05:39] src/van.cc:555: zeromq\treceived: 8 => 9. Meta: request=0, timestamp=12, app_id=0, customer_id=0, simple_app=0, push=1, head=0, key=24
[16:05:39] src/van.cc:555: zeromq\treceived: 10 => 9. Meta: request=0, timestamp=13, app_id=1, customer_id=1, simple_app=0, push=0, head=0, key=140722847747112, data_type={{ UINT64 FLOAT }} Body: data_size=24 data_size=120
[16:05:50] src/van.cc:530: zeromq\tsent: ? => 10. Meta: request=1, timestamp=56, app_id=0, customer_id=0, simple_app=1, push=0, head=7, body=hello from worker 0 round 0. THIS IS NOT DATA MSG!
[16:05:50] src/van.cc:555: zeromq\treceived: 9 => 9. Meta: request=0, control={{ cmd=TERMINATE }}. THIS IS NOT DATA MSG!
"""


def test_parse_bytedance_log_reads_every_kind_of_line(tmp_path):
    path = tmp_path / "worker0.log"
    path.write_text(LOG_SAMPLE)
    log = parse_pslite_log(path)
    assert list(log["direction"]) == ["send", "recv", "send", "send", "recv", "recv", "send", "recv"]
    assert log["own_id"].tolist() == [pd.NA, pd.NA, 9, 9, 9, 9, 9, 9]
    add_node, reply, barrier, push, push_answer, pull_answer, simple, terminate = log.to_dict("records")
    assert pd.isna(add_node["sender_id"]) and add_node["recver_id"] == 1 and add_node["request"]
    assert add_node["nodes"] == [{"role": "worker", "id": None, "ip": "198.18.0.3", "port": 9200,
                                  "is_recovery": False}]
    assert reply["recver_id"] == KEMPTY and [(n["role"], n["id"]) for n in reply["nodes"]] == [
        ("worker", 9), ("scheduler", 1)]
    assert barrier["control_cmd"] == "BARRIER" and barrier["barrier_group"] == 7 and pd.isna(barrier["body"])
    assert (push["recver_id"], push["push"], push["head"], push["meta_key"]) == (8, True, 0, 24)
    assert push["data_types"] == ["UINT64", "OTHER", "INT32"] and push["data_sizes"] == [8, 4096, 4]
    assert push_answer["data_sizes"] == [] and push_answer["meta_key"] == 24 and not push_answer["pull"]
    assert (pull_answer["app_id"], pull_answer["customer_id"], pull_answer["pull"]) == (1, 1, True)
    assert pull_answer["data_types"] == ["UINT64", "FLOAT"] and pull_answer["data_sizes"] == [24, 120]
    assert simple["simple_app"] and simple["head"] == 7 and simple["body"] == "hello from worker 0 round 0"
    assert terminate["control_cmd"] == "TERMINATE" and pd.isna(terminate["timestamp"])
    assert log.attrs["unparsed_lines"] == []


def test_parse_bytedance_log_untangles_lines_of_two_threads(tmp_path):
    # As written by a server's receiving and sending threads (pcaps/byteps_*/server*.log): one thread's
    # prefix cut after its line number by the other's whole entry; one thread's "zeromq\treceived: " followed
    # by the other's "[time] file:", then the first one's message, then the rest of the other's entry; both
    # "[" first, then one thread's "time] file:" and the other's whole entry.
    path = tmp_path / "server1.log"
    receipt = ("Meta: request=1, timestamp=20, app_id=0, customer_id=0, simple_app=0, push=1, head=1, key=24, "
               "data_type={ UINT64 OTHER INT32 } Body: data_size=16 data_size=12 data_size=8")
    send = "Meta: request=0, timestamp=0, app_id=1, customer_id=1, simple_app=0, push=1, head=0, key=9452"
    path.write_text(
        "[15:57:50] src/van.cc:555[15:57:50] src/van.cc:530: zeromq\tsent: ? => 9. Meta: request=0, "
        "timestamp=53, app_id=0, customer_id=0, simple_app=0, push=0, head=2, key=1407, data_type={ UINT64 "
        "OTHER INT32 } Body: data_size=8 data_size=4096 data_size=4\n"
        ": zeromq\treceived: 13 => 10. Meta: request=1, timestamp=58, app_id=0, customer_id=0, simple_app=0, "
        "push=0, head=2, key=1407, data_type={ UINT64 OTHER } Body: data_size=8 data_size=0\n"
        f"[15:58:16] src/van.cc:555: zeromq\treceived: [15:58:16] src/van.cc:9 => 8. {receipt}530: "
        f"zeromq\tsent: ? => 11. {send}\n\n"
        "[[16:05:58] src/van.cc:16:05:58] src/van.cc:530: zeromq\tsent: ? => 9. Meta: request=0, timestamp=0, "
        "app_id=0, customer_id=0, simple_app=0, push=1, head=0, key=9405\n"
        "555: zeromq\treceived: 11 => 10. Meta: request=1, timestamp=6, app_id=0, customer_id=0, simple_app=0, "
        "push=1, head=2, key=24, data_type={ UINT64 OTHER INT32 } Body: data_size=8 data_size=8192 data_size=4\n")
    log = parse_pslite_log(path)
    assert list(zip(log["direction"], log["location"].astype(str), log["recver_id"], log["timestamp"])) == [
        ("send", "src/van.cc:530", 9, 53), ("recv", "src/van.cc:555", 10, 58),
        ("send", "src/van.cc:530", 11, 0), ("recv", "src/van.cc:555", 8, 20),
        ("send", "src/van.cc:530", 9, 0), ("recv", "src/van.cc:555", 10, 6)]
    assert log["data_sizes"].tolist() == [[8, 4096, 4], [8, 0], [], [16, 12, 8], [], [8, 8192, 4]]
    assert log.attrs["unparsed_lines"] == []


@pytest.mark.parametrize("job_name", KV_APP_JOBS)
def test_every_recorded_request_was_handled_by_its_server_and_every_pull_verified(job_name):
    job = load_job(PCAPS / job_name)
    requested, handled = collections.Counter(), collections.Counter()
    for node in job.nodes:
        if node["role"] == "worker":
            for entry in job.records[node["name"]]:
                if entry["event"] == "request" and entry["op"] != "simple":
                    assert entry["verified"], entry
                    for message in entry["messages"]:
                        requested[(8 + 2 * message["server"], node["pslite_id"], entry["ts"], entry["customer"],
                                   entry["op"].endswith("push"), tuple(message["keys"]))] += 1
        elif node["role"] == "server":
            for entry in job.records[node["name"]]:
                if entry["event"] == "handled":
                    handled[(node["pslite_id"], entry["sender"], entry["ts"], entry["customer"], entry["push"],
                             tuple(entry["keys"]))] += 1
    assert sum(requested.values()) > 100 and requested == handled


@pytest.mark.parametrize("job_name", BYTEPS_SERVER_JOBS)
def test_bytePS_server_summed_what_every_worker_pushed(job_name):
    """kv_app checks each pull of BytePS's server against the sum over the workers' pushes of that round."""
    job = load_job(PCAPS / job_name)
    workers = [node["name"] for node in job.nodes if node["role"] == "worker"]
    pulls = [entry for name in workers for entry in job.records[name]
             if entry["event"] == "request" and entry["op"] == "pull"]
    assert len(pulls) == len(workers) * 7 * job.meta["rounds"] and all(entry["verified"] for entry in pulls)
    assert {entry["dtype"] for entry in pulls} == {"float32", "float64", "int32"}
