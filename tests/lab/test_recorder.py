"""The ground truth beside the bundled captures, checked against itself from independent sides:
each ps-lite message a node logged as sent is logged as received by its peer; the workers' own records
of kvstore calls add up to the bytes ps-lite moved; each zmq message one process sent is the one the other
received; tcpdump's counts match the capture files, which hold only the cluster's own addresses.
One MXNet job and the zmq job are also recorded afresh, to check the recorder itself."""

from __future__ import annotations

import ipaddress
from collections import Counter

import dpkt
import dpkt.sll2
import pandas as pd
import pytest

from lab import record
from tests.conftest import PCAPS, WORKLOAD_PYTHON
from tests.support.groundtruth import KEMPTY, load_job, mxnet_jobs, parse_pslite_log

MXNET_JOBS = mxnet_jobs() + mxnet_jobs(lossy=True)
# both ps-lites: MXNet's dmlc/ps-lite and BytePS's bytedance/ps-lite (lab/byteps)
PSLITE_JOBS = MXNET_JOBS + sorted(path.parent.name for path in PCAPS.glob("byteps_*/job.json"))
MATCH_FIELDS = ["request", "timestamp", "control_cmd", "barrier_group", "app_id", "customer_id",
                "simple_app", "push", "head", "body"]
LINK_LOCAL_MULTICAST = ipaddress.ip_network("224.0.0.0/24")

LOG_SAMPLE = """\
[08:11:14] ../3rdparty/ps-lite/src/van.cc:310: Bind to role=worker, ip=198.18.0.4, port=9200, is_recovery=0
[08:11:14] ../3rdparty/ps-lite/src/van.cc:394: ? => 1. Meta: request=0, timestamp=0, control={ cmd=ADD_NODE, node={ role=worker, ip=198.18.0.4, port=9200, is_recovery=0 } }
[08:11:14] ../3rdparty/ps-lite/src/van.cc:419: 1 => 2147483647. Meta: request=0, timestamp=1, control={ cmd=ADD_NODE, node={ role=worker, id=9, ip=198.18.0.5, port=9200, is_recovery=0 role=scheduler, id=1, ip=198.18.0.1, port=9091, is_recovery=0 } }
[08:11:14] ../3rdparty/ps-lite/src/van.cc:257: W[9] is connected to others
[08:11:14] ../3rdparty/ps-lite/src/van.cc:394: ? => 8. Meta: request=1, timestamp=0, app_id=0, customer_id=0, simple_app=1, push=0, head=0, body=ccopy_reg
_reconstructor
sb.
[08:11:14] ../src/executor/../operator/../common/utils.h:472: 
Storage fallback detected:
Copy from row_sparse storage type on cpu to default storage type on cpu.
[08:11:14] ../3rdparty/ps-lite/src/van.cc:419: 10 => 9. Meta: request=0, timestamp=39, app_id=0, customer_id=0, simple_app=0, push=1, head=0, data_type={ UINT64 OTHER INT32 } Body: data_size=8 data_size=2560 data_size=4
[08:11:14] ../3rdparty/ps-lite/src/van.cc:394: ? => 10. Meta: request=1, timestamp=41, app_id=0, customer_id=0, simple_app=0, push=0, head=1, data_type={ UINT64 OTHER } Body: data_size=664 data_size=0
[08:11:14] ../3rdparty/ps-lite/src/van.cc:394: ? => 1. Meta: request=1, timestamp=6, control={ cmd=BARRIER, barrier_group=4 }
[08:11:14] ../3rdparty/ps-lite/src/van.cc:419: 9 => 9. Meta: request=0, control={ cmd=TERMINATE }
"""


def test_parse_pslite_log_reads_every_kind_of_line(tmp_path):
    path = tmp_path / "worker1.log"
    path.write_text(LOG_SAMPLE)
    log = parse_pslite_log(path)
    assert list(log["direction"]) == ["send", "recv", "send", "recv", "send", "send", "recv"]
    assert log["node"].astype(str).unique().tolist() == ["worker1"]
    assert log["own_id"].tolist() == [pd.NA, pd.NA, 9, 9, 9, 9, 9]
    add_node_request, add_node_reply, optimizer, push_reply, pull_request, barrier, terminate = log.to_dict("records")
    assert pd.isna(add_node_request["sender_id"]) and add_node_request["recver_id"] == 1
    assert add_node_request["nodes"] == [{"role": "worker", "id": None, "ip": "198.18.0.4", "port": 9200,
                                          "is_recovery": False}]
    assert add_node_reply["recver_id"] == KEMPTY and add_node_reply["timestamp"] == 1
    assert [(n["role"], n["id"], n["port"]) for n in add_node_reply["nodes"]] == [("worker", 9, 9200),
                                                                                  ("scheduler", 1, 9091)]
    assert optimizer["simple_app"] and optimizer["request"] and optimizer["head"] == 0
    assert optimizer["body"] == "ccopy_reg\n_reconstructor\nsb."
    assert not optimizer["pull"] and optimizer["data_sizes"] == []
    assert push_reply["sender_id"] == 10 and push_reply["push"] and not push_reply["request"]
    assert push_reply["data_types"] == ["UINT64", "OTHER", "INT32"] and push_reply["data_sizes"] == [8, 2560, 4]
    assert pull_request["pull"] and pull_request["head"] == 1 and pull_request["data_sizes"] == [664, 0]
    assert barrier["control_cmd"] == "BARRIER" and barrier["barrier_group"] == 4 and pd.isna(barrier["app_id"])
    assert terminate["control_cmd"] == "TERMINATE" and pd.isna(terminate["timestamp"])
    assert terminate["raw"].endswith("9 => 9. Meta: request=0, control={ cmd=TERMINATE }")
    assert log.attrs["unparsed_lines"] == []


def test_parse_pslite_log_untangles_lines_of_two_threads(tmp_path):
    # As written by two threads of one node (both shapes seen in real logs): one thread's prefix cut
    # after its line number, or after its "[", by the other thread's whole entry.
    path = tmp_path / "server1.log"
    path.write_text(
        "[08:19:21] ../3rdparty/ps-lite/src/van.cc:419[08:19:21] ../3rdparty/ps-lite/src/van.cc:394: "
        "? => 11. Meta: request=0, timestamp=40, app_id=0, customer_id=0, simple_app=0, push=1, head=0\n"
        ": 9 => 8. Meta: request=1, timestamp=34, app_id=0, customer_id=0, simple_app=0, push=1, head=0, "
        "data_type={ UINT64 OTHER INT32 } Body: data_size=8 data_size=128 data_size=4\n"
        "[[08:19:22] ../3rdparty/ps-lite/src/./zmq_van.h:51: S[8] is stopping\n"
        "08:19:22] ../3rdparty/ps-lite/src/van.cc:419: 8 => 8. Meta: request=0, control={ cmd=TERMINATE }\n"
        "half 9 => 8. Meta: request=1, timestamp=35\n")
    log = parse_pslite_log(path)
    assert list(zip(log["direction"], log["location"].astype(str).str[-3:], log["recver_id"])) == [
        ("send", "394", 11), ("recv", "419", 8), ("recv", "419", 8)]
    assert log["data_sizes"].tolist() == [[], [8, 128, 4], []]
    assert log["own_id"].isna().all()  # no "S[8] is connected to others" line in this excerpt
    assert log.attrs["unparsed_lines"] == [5]


def test_parse_pslite_log_takes_a_stray_bracket_before_a_message_as_the_next_entry(tmp_path):
    # Seen in a real worker log: one thread's "[" between another's prefix and its message, the rest of
    # its own prefix on the next line (and its message a SimpleApp body running over lines).
    path = tmp_path / "worker0.log"
    path.write_text(
        "[10:18:53] ../3rdparty/ps-lite/src/van.cc:419: [8 => 11. Meta: request=0, timestamp=0, app_id=0, "
        "customer_id=0, simple_app=1, push=0, head=0\n"
        "10:18:53] ../3rdparty/ps-lite/src/van.cc:394: ? => 8. Meta: request=1, timestamp=0, app_id=0, "
        "customer_id=0, simple_app=1, push=0, head=0, body=ccopy_reg\n_reconstructor\nsb.\n"
        "[10:18:53] ../3rdparty/ps-lite/src/van.cc:419: 10 => 11. Meta: request=0, timestamp=0, app_id=0, "
        "customer_id=0, simple_app=1, push=0, head=0\n")
    log = parse_pslite_log(path)
    assert list(zip(log["direction"], log["sender_id"].fillna(-1), log["recver_id"], log["request"])) == [
        ("recv", 8, 11, False), ("send", -1, 8, True), ("recv", 10, 11, False)]   # a send's sender: "?"
    assert log["body"].tolist()[1] == "ccopy_reg\n_reconstructor\nsb."
    assert log.attrs["unparsed_lines"] == []


def test_parse_pslite_log_finishes_an_entry_whose_thread_stalled_after_its_time(tmp_path):
    # Seen in a real scheduler log (CI, its two cores busy): one thread wrote "[" and its time, then stalled
    # while the other wrote three whole entries; the rest of its prefix and its message came after them.
    path = tmp_path / "scheduler.log"
    barrier = ". Meta: request=1, timestamp={}, control={{ cmd=BARRIER, barrier_group=7 }}\n"
    path.write_text(
        "[[00:38:07] 00:38:07] ../3rdparty/ps-lite/src/van.cc:419: 10 => 1" + barrier.format(1)
        + "[00:38:07] ../3rdparty/ps-lite/src/van.cc:199: Barrier count for 7 : 2\n"
        "[00:38:07] ../3rdparty/ps-lite/src/van.cc:419: 1 => 1" + barrier.format(4)
        + "[00:38:07] ../3rdparty/ps-lite/src/van.cc:199: Barrier count for 7 : 3\n"
        "../3rdparty/ps-lite/src/van.cc:394: ? => 1" + barrier.format(4))
    log = parse_pslite_log(path)
    assert list(zip(log["direction"], log["sender_id"].fillna(-1), log["timestamp"])) == [
        ("recv", 10, 1), ("recv", 1, 4), ("send", -1, 4)]
    assert log.attrs["unparsed_lines"] == []


def test_parse_pslite_log_rejects_an_unknown_meta_layout(tmp_path):
    path = tmp_path / "node.log"
    path.write_text("[08:11:14] ../3rdparty/ps-lite/src/van.cc:394: ? => 1. Meta: request=1, surprise=3\n")
    with pytest.raises(ValueError, match="unrecognised ps-lite meta"):
        parse_pslite_log(path)


def _endpoint_names(job) -> dict[tuple[str, int], str]:
    return {(node["ip"], node["port"]): node["name"] for node in job.nodes}


def _directed_messages(job) -> tuple[Counter, Counter]:
    """Messages as (sender node, receiver node, fields...) counted from the send side and the receive side."""
    by_id, by_endpoint = job.node_by_pslite_id, _endpoint_names(job)
    sent, received = Counter(), Counter()
    for row in job.pslite_messages.to_dict("records"):
        fields = tuple(None if pd.isna(row[f]) else row[f] for f in MATCH_FIELDS) + (tuple(row["data_sizes"]),)
        if row["direction"] == "send":
            sent[(row["node"], by_id[row["recver_id"]], *fields)] += 1
            continue
        if not pd.isna(row["sender_id"]):
            sender = by_id[row["sender_id"]]
        else:  # a node registering before it has an id: its ADD_NODE names its own ip and port
            (announced,) = row["nodes"]
            sender = by_endpoint[(announced["ip"], announced["port"])]
        if row["control_cmd"] == "TERMINATE" and sender == row["node"]:
            continue  # ps-lite stops its own receive loop with a message it does not log as sent
        received[(sender, row["node"], *fields)] += 1
    return sent, received


@pytest.mark.parametrize("job_name", PSLITE_JOBS)
def test_every_pslite_send_is_logged_as_received_by_its_peer(job_name):
    job = load_job(PCAPS / job_name)
    for node in job.nodes:
        log = job.log(node["name"])
        assert log.attrs["unparsed_lines"] == [], node["name"]
        # ps-lite learns the sender from the connection on receipt: every send is logged with "?".
        assert log.loc[log["direction"] == "send", "sender_id"].isna().all(), node["name"]
    sent, received = _directed_messages(job)
    assert sum(sent.values()) >= 50
    assert sent - received == Counter(), "sent, never received"
    assert received - sent == Counter(), "received, never sent"


@pytest.mark.parametrize("job_name", PSLITE_JOBS)
def test_scheduler_node_list_matches_job_json(job_name):
    job = load_job(PCAPS / job_name)
    scheduler = job.log("scheduler")
    replies = scheduler[(scheduler["control_cmd"] == "ADD_NODE") & (scheduler["direction"] == "send")]
    assert len(replies) == len(job.nodes) - 1
    for nodes in replies["nodes"]:
        assert {(n["role"], n["id"], n["ip"], n["port"]) for n in nodes} == {
            (node["role"], node["pslite_id"], node["ip"], node["port"]) for node in job.nodes}


def _tensor_bytes(operations: list[dict], ops: set[str]) -> int:
    """Bytes of values the kvstore calls handed over (row-sparse: the stored rows only)."""
    return sum(t.get("data_nbytes", t["nbytes"]) for o in operations if o["op"] in ops for t in o["tensors"])


@pytest.mark.parametrize("job_name", MXNET_JOBS)
def test_worker_records_add_up_to_the_bytes_pslite_moved(job_name):
    job = load_job(PCAPS / job_name)
    for worker in (n["name"] for n in job.nodes if n["role"] == "worker"):
        operations = job.records[worker]["operations"]
        assert len(job.records[worker]["batches"]) == job.meta["batches"]
        log = job.log(worker)
        data = log[log["control_cmd"].isna()]
        data = data[~data["simple_app"]]
        values = data["data_sizes"].map(lambda sizes: sizes[1] if sizes else 0)
        push_requests = values[(data["direction"] == "send") & data["request"] & data["push"]].sum()
        push_replies = values[(data["direction"] == "recv") & ~data["request"] & data["push"]].sum()
        pull_replies = values[(data["direction"] == "recv") & ~data["request"] & data["pull"]].sum()
        # Rank 0 alone sends the initial values; PushPull is one push whose reply carries the new weights.
        initial = _tensor_bytes(operations, {"init", "broadcast"}) if job.records[worker]["rank"] == 0 else 0
        assert push_requests == _tensor_bytes(operations, {"push", "pushpull"}) + initial
        assert push_replies == _tensor_bytes(operations, {"pushpull"})
        sparse_rows = sum(t["unique_row_ids"] * t["nbytes"] // t["shape"][0]
                          for o in operations if o["op"] == "row_sparse_pull" for t in o["tensors"])
        assert pull_replies == _tensor_bytes(operations, {"broadcast"}) + sparse_rows


def test_large_job_splits_its_big_tensor_across_servers():
    job = load_job(PCAPS / "mxnet_sync_large")
    assert job.meta["env"]["MXNET_KVSTORE_BIGARRAY_BOUND"] == str(job.meta["bigarray_bound"])
    params = job.records["worker0"]["parameters"]
    small = load_job(PCAPS / "mxnet_sync").records["worker0"]["parameters"]
    assert sum(p["nbytes"] for p in params) >= 20 * sum(p["nbytes"] for p in small)
    big = max(params, key=lambda p: p["nbytes"])
    half = big["nbytes"] // 2
    for server in ("server0", "server1"):
        log = job.log(server)
        data = log[log["control_cmd"].isna()]
        pushes = data[(data["direction"] == "recv") & data["request"] & data["push"]]
        assert (pushes["data_sizes"].map(lambda sizes: sizes[1]) == half).any(), server


def test_sparse_job_pushes_row_sparse_and_pulls_rows():
    job = load_job(PCAPS / "mxnet_sparse")
    operations = [o["op"] for o in job.records["worker0"]["operations"]]
    assert "row_sparse_pull" in operations and "push" in operations
    worker = job.log("worker0")
    row_sparse = worker[worker["head"] == 1]  # MXNet: Cantor pairing (row-sparse, float32) = 1
    assert row_sparse["push"].any() and row_sparse["pull"].any()


def _frames_by_flow(messages: list[dict], direction: str) -> dict[tuple[str, str], list]:
    flows: dict[tuple[str, str], list] = {}
    for message in messages:
        if message["direction"] == direction and message["on_wire"]:
            flows.setdefault((message["socket"], message["side"]), []).append(
                [frame["sha256"] for frame in message["frames"]])
    return flows


def check_zmq_record(job) -> None:
    messages = job.zmq_record["messages"]
    sent, received = _frames_by_flow(messages, "send"), _frames_by_flow(messages, "recv")
    peer = {"server": "client", "client": "server"}
    for (socket, side), frames in sent.items():
        assert received[(socket, peer[side])] == frames, (socket, side)
    assert sum(len(f) for f in sent.values()) == sum(len(f) for f in received.values())
    sizes = {frame["size"] for message in messages for frame in message["frames"]}
    assert {0, 255, 256}.issubset(sizes) and max(sizes) > 65536
    assert {s["type"] for s in job.zmq_record["sockets"]} == {"REQ", "REP", "DEALER", "ROUTER", "PUSH", "PULL",
                                                               "PUB", "SUB"}
    assert job.zmq_record["curve"]["client"] == {"sent": 3, "received": 3}
    assert any(not m["on_wire"] for m in messages if m["type"] == "PUB")  # the publisher filtered some out
    assert max(len(m["frames"]) for m in messages) >= 3


def test_zmq_record_sends_match_receives():
    check_zmq_record(load_job(PCAPS / "zmq"))


LINKTYPE_LINUX_SLL2 = 276


def check_captures(job) -> None:
    subnet = ipaddress.ip_network(job.meta["subnet"])
    assert subnet.subnet_of(ipaddress.ip_network("198.18.0.0/15"))
    # the Gloo hang's ranks fail by design (the others at their timeout, the stopped one once they are gone); the
    # MXNet hang is killed by the recorder, given up on
    fault = job.meta.get("fault") or {}
    given_up = fault.get("given_up_after_s") is not None
    exit_code = -9 if given_up else 1 if fault.get("kind") == "hang" else 0
    for node in job.nodes:
        assert node["exit_code"] == exit_code and node["killed_by_recorder"] == given_up, node["name"]
        packets = 0
        with job.open_capture(node["name"]) as capture:
            reader = dpkt.pcap.Reader(capture)
            # MXNet jobs are captured with -i any (eth0 + lo: Linux cooked v2), the zmq job on eth0.
            link = {dpkt.pcap.DLT_EN10MB: dpkt.ethernet.Ethernet, LINKTYPE_LINUX_SLL2: dpkt.sll2.SLL2}
            assert reader.datalink() in link
            for _, frame in reader:
                packets += 1
                ip = link[reader.datalink()](frame).data
                if isinstance(ip, dpkt.ip.IP):
                    for address in (ipaddress.ip_address(ip.src), ipaddress.ip_address(ip.dst)):
                        assert address in subnet or address in LINK_LOCAL_MULTICAST or address.is_unspecified
        assert packets == node["capture_stats"]["packets_captured"] > 0
        if not job.meta.get("capture_buffer_kib"):
            assert node["capture_stats"]["packets_dropped_by_kernel"] == 0
    if job.meta.get("capture_buffer_kib"):    # recorded to lose packets: it did, and tcpdump says how many
        assert any(node["capture_stats"]["packets_dropped_by_kernel"] > 0 for node in job.meta["nodes"])


@pytest.mark.parametrize("job_name", [*PSLITE_JOBS, "mxnet_noise", "zmq", "gloo", "gloo_matrix_k2",
                                      "gloo_matrix_k3", "gloo_straggler", "gloo_straggler_sigstop", "gloo_hang",
                                      "gloo_slow_link", "mxnet_hang", "tcp_zero_window"])
def test_captures_match_tcpdump_counts_and_stay_in_the_cluster(job_name):
    job = load_job(PCAPS / job_name)
    check_captures(job)
    assert {"tcpdump"} <= job.meta["versions"].keys()


def test_bundled_captures_stay_small():
    """Every job shape the tests need, in under 58 MB (the corpus of real captures and the fault jobs of
    `dlcsniff diagnose`, 12 MB of it, included)."""
    assert sum(p.stat().st_size for p in PCAPS.rglob("*") if p.is_file()) < 58_000_000


@pytest.mark.root
@pytest.mark.slow
def test_recorder_records_fresh_jobs(tmp_path):
    assert WORKLOAD_PYTHON.exists(), f"{WORKLOAD_PYTHON} missing: run `make workloads`"
    sparse_dir = record.record_mxnet_job(record.MXNET_JOBS["mxnet_sparse"], tmp_path, str(WORKLOAD_PYTHON))
    job = load_job(sparse_dir)
    assert {p.name for p in sparse_dir.iterdir()} == {"job.json"} | {
        f"{n['name']}{suffix}" for n in job.nodes for suffix in (".pcap.gz", ".log", ".json")}
    sent, received = _directed_messages(job)
    assert sent == received and sent
    check_captures(job)
    for role in ("server", "worker"):
        assert sorted(n["rank"] for n in job.nodes if n["role"] == role) == [0, 1]
    assert sorted(job.node_by_pslite_id) == [1, 8, 9, 10, 11]
    zmq_dir = record.record_zmq_job(tmp_path, str(WORKLOAD_PYTHON))
    zmq_job = load_job(zmq_dir)
    check_zmq_record(zmq_job)
    check_captures(zmq_job)
