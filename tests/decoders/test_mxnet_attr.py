"""MXNet 1.9.1 KVStore attribution, and a real dist_sync job decoded against its own records.

The live test runs a scheduler, two servers and a worker of MXNet 1.9.1 (the workload venv) on a loopback
address under tcpdump, with PS_VERBOSE=2. Truth is what the programs themselves said: every message ps-lite
logged as sent must be on the wire with the same flags, ids and frame sizes, and every data message must
attribute to a tensor the worker says it used, with that tensor's dtype and size.
"""
from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import dpkt
import numpy as np
import pytest

from dlcsniff.decoders.protocols.pslite.tensors import mxnet
from dlcsniff.decoders.protocols.pslite import decoder as pslite
from dlcsniff.decoders.errors import DecodeError
from tests.conftest import require_root, require_tool, require_workloads


def cantor(req_type: int, dtype: int) -> int:
    """MXNet's GetCommandType, written from kvstore_dist_server.h."""
    return (req_type + dtype) * (req_type + dtype + 1) // 2 + dtype


def test_decode_head_every_pair():
    for t, req_type in enumerate(mxnet.REQUEST_TYPES):
        for d, dtype in enumerate(mxnet.DTYPES):
            assert mxnet.decode_head(cantor(t, d)) == (req_type, dtype)
    # heads seen in the real job: dense float32, row_sparse float32, compressed float32, dense float16
    assert [mxnet.decode_head(h) for h in (0, 1, 3, 5)] == [
        ("default", "float32"), ("row_sparse", "float32"), ("compressed", "float32"), ("default", "float16")]


@pytest.mark.parametrize("head", [-1, cantor(3, 0), cantor(0, 13), cantor(2, 13), 2**31 - 1])
def test_decode_head_rejects(head):
    with pytest.raises(DecodeError):
        mxnet.decode_head(head)


def test_simple_app_commands():
    assert [mxnet.simple_app_command(h) for h in range(6)] == [
        "controller", "set_multi_precision", "stop_server", "sync_mode", "set_gradient_compression",
        "set_profiler_params"]
    with pytest.raises(DecodeError):
        mxnet.simple_app_command(6)


def test_home_server():
    assert [mxnet.home_server(k, 2) for k in (3, 4, 7, 11, 20)] == [1, 0, 1, 1, 0]
    assert mxnet.home_server(5, 3) == 49865 % 3
    # 215330 * 9973 overflows a C int to a negative value: MXNet has no defined server for it
    assert mxnet.home_server(215330, 2) is None
    assert mxnet.home_server(215329, 2) == 215329 * 9973 % 2


BEGIN1 = pslite.server_key_ranges(2)[1][0]


def test_attribute_default():
    attr = mxnet.attribute([BEGIN1 + 3], [80], 1, 2, "default")
    assert (attr.tensor_key, attr.part, attr.rows, attr.row_ids, attr.uncompressed_elems) == (3, None, None, None, None)
    # key 11 (home server 1) seen at server 0: it is a slice of a split big array
    assert mxnet.attribute(np.array([11], dtype=np.uint64), None, 0, 2, "default").part == 0
    with pytest.raises(DecodeError, match="outside"):
        mxnet.attribute([3], [80], 1, 2, "default")
    with pytest.raises(DecodeError, match="one"):
        mxnet.attribute([BEGIN1 + 3, BEGIN1 + 4], [4, 4], 1, 2, "default")
    with pytest.raises(DecodeError):
        mxnet.attribute([], None, 0, 2, "default")
    with pytest.raises(DecodeError):
        mxnet.attribute([3], None, 2, 2, "default")


def test_attribute_real_row_sparse_frames():
    # keys/lens frames of the real job: a row_sparse push of rows 3 and 17 of key 20 to server 0, and the
    # answer to a row_sparse_pull of rows 1, 3, 17 (lens there count elements: 4 per row, not bytes)
    push_keys = np.frombuffer(bytes.fromhex("140000000000000017000000000000002500000000000000"), "<u8")
    push_lens = np.frombuffer(bytes.fromhex("000000001000000010000000"), "<i4")
    attr = mxnet.attribute(push_keys, push_lens, 0, 2, "row_sparse")
    assert (attr.tensor_key, attr.rows, attr.row_ids.tolist(), attr.part) == (20, 2, [3, 17], None)
    assert not attr.row_ids.flags.writeable
    pull_keys = np.frombuffer(bytes.fromhex("14000000000000001500000000000000"
                                            "17000000000000002500000000000000"), "<u8")
    attr = mxnet.attribute(pull_keys, [0, 4, 4, 4], 0, 2, "row_sparse")
    assert (attr.tensor_key, attr.rows, attr.row_ids.tolist()) == (20, 3, [1, 3, 17])
    # a row_sparse init push starts with row 0, whose key equals the master key
    assert mxnet.attribute([20, 20, 21], [0, 16, 16], 0, 2, "row_sparse").row_ids.tolist() == [0, 1]
    with pytest.raises(DecodeError, match="master"):
        mxnet.attribute([20, 23], [16, 16], 0, 2, "row_sparse")
    with pytest.raises(DecodeError, match="below"):
        mxnet.attribute([20, 19], [0, 16], 0, 2, "row_sparse")


def test_attribute_real_compressed_frames():
    # a 2-bit compressed push of key 40 (64 float32) to server 0: the first key is begin + the element count
    keys = np.frombuffer(bytes.fromhex("40000000000000002800000000000000"), "<u8")
    attr = mxnet.attribute(keys, [0, 16], 0, 2, "compressed")
    assert (attr.tensor_key, attr.uncompressed_elems, attr.part) == (40, 64, None)
    assert mxnet.attribute([40], None, 0, 2, "compressed").tensor_key == 40          # the pull
    with pytest.raises(DecodeError):
        mxnet.attribute([1, 2, 3], None, 0, 2, "compressed")
    with pytest.raises(DecodeError, match="request type"):
        mxnet.attribute([1], None, 0, 2, "sparse")


def test_attribute_large_row_sparse_is_vectorised():
    rows = np.arange(0, 2_000_000, 3, dtype=np.uint64)
    keys = np.concatenate([[BEGIN1 + 5], BEGIN1 + 5 + rows]).astype(np.uint64)
    attr = mxnet.attribute(keys, None, 1, 2, "row_sparse")
    assert attr.rows == rows.size and np.array_equal(attr.row_ids, rows.astype(np.int64))


# -- a real MXNet 1.9.1 job --------------------------------------------------------------------------------

BIGARRAY_BOUND = 1000
NUM_SERVERS = 2
WORKER_SCRIPT = r"""
import json, sys
import mxnet as mx
kv = mx.kv.create("dist_sync")
tensors = {3: ((4, 5), "float32"), 4: ((6,), "float32"), 7: ((300,), "float32"), 11: ((50, 40), "float32"),
           30: ((10,), "float16")}
record = {"tensors": {}, "row_sparse": {}, "compressed": {}}
for key, (shape, dtype) in tensors.items():
    kv.init(key, mx.nd.ones(shape, dtype=dtype))
    record["tensors"][key] = {"shape": shape, "dtype": dtype}
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
for step in range(2):
    for key in (3, 4, 7, 11):
        shape, dtype = tensors[key]
        kv.push(key, mx.nd.ones(shape, dtype=dtype) * step)
        out = mx.nd.zeros(shape, dtype=dtype)
        kv.pull(key, out=out)
        out.wait_to_read()
out = mx.nd.zeros((10,), dtype="float16")
kv.pushpull(30, mx.nd.ones((10,), dtype="float16"), out=out)
out.wait_to_read()
kv.init(20, mx.nd.ones((30, 4)).tostype("row_sparse"))
record["tensors"][20] = {"shape": (30, 4), "dtype": "float32"}
grad = mx.nd.sparse.row_sparse_array((mx.nd.ones((2, 4)), mx.nd.array([3, 17], dtype="int64")), shape=(30, 4))
kv.push(20, grad)
out = mx.nd.sparse.zeros("row_sparse", (30, 4))
kv.row_sparse_pull(20, out=out, row_ids=mx.nd.array([1, 3, 17], dtype="int64"))
out.wait_to_read()
record["row_sparse"][20] = {"init_rows": list(range(30)), "push_rows": [3, 17], "pull_rows": [1, 3, 17]}
kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
kv.init(40, mx.nd.ones((64,)))
record["tensors"][40] = {"shape": (64,), "dtype": "float32"}
kv.push(40, mx.nd.ones((64,)))
out = mx.nd.zeros((64,))
kv.pull(40, out=out)
out.wait_to_read()
record["compressed"][40] = {"elements": 64}
print(json.dumps(record), flush=True)
"""
JOB_TIMEOUT_S = 90


def _free_ports(host: str, count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _pcap_has(path: Path, sport: int) -> bool:
    try:
        with open(path, "rb") as f:
            for _, buf in dpkt.pcap.Reader(f):
                tcp = dpkt.ethernet.Ethernet(buf).data.data
                if isinstance(tcp, dpkt.tcp.TCP) and tcp.sport == sport:
                    return True
    except (dpkt.NeedData, dpkt.UnpackError, ValueError):
        pass      # tcpdump is writing the last record
    return False


def _flush_capture(path: Path, host: str, port: int) -> None:
    """Send one SYN to a closed port of the job and wait until tcpdump has written it: everything the job
    sent before is then in the file."""
    with socket.socket() as sentinel:
        sentinel.bind(("127.0.0.1", 0))
        sport = sentinel.getsockname()[1]
        sentinel.settimeout(2)
        try:
            sentinel.connect((host, port))
        except OSError:
            pass
    for _ in range(200):
        if _pcap_has(path, sport):
            return
        time.sleep(0.05)
    pytest.fail("tcpdump did not write the sentinel packet within 10 s")


@pytest.fixture(scope="module")
def mxnet_job(tmp_path_factory):
    require_root()
    tcpdump = require_tool("tcpdump")
    python = str(require_workloads())
    out = tmp_path_factory.mktemp("mxnet_job")
    host = f"127.77.{random.randint(0, 255)}.{random.randint(1, 254)}"
    ports = _free_ports(host, 4)
    names = ("scheduler", "server0", "server1", "worker")
    pcap = out / "job.pcap"
    port_filter = " or ".join(f"port {p}" for p in ports)
    capture = subprocess.Popen([tcpdump, "-i", "lo", "-U", "-s", "0", "-Z", "root", "-w", str(pcap),
                                f"tcp and host {host} and ({port_filter})"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    procs: dict[str, subprocess.Popen] = {}
    try:
        line = capture.stderr.readline()
        if "listening on" not in line:
            pytest.fail(f"tcpdump did not start: {line}")
        env = dict(os.environ, DMLC_PS_ROOT_URI=host, DMLC_PS_ROOT_PORT=str(ports[0]), DMLC_NODE_HOST=host,
                   DMLC_NUM_SERVER=str(NUM_SERVERS), DMLC_NUM_WORKER="1", PS_VERBOSE="2",
                   MXNET_KVSTORE_BIGARRAY_BOUND=str(BIGARRAY_BOUND), OMP_NUM_THREADS="1")
        roles = ("scheduler", "server", "server", "worker")
        for name, role, port in zip(names, roles, ports):
            argv = [python, "-c", WORKER_SCRIPT if role == "worker" else "import mxnet"]
            with open(out / f"{name}.log", "w") as log:
                procs[name] = subprocess.Popen(argv, env=dict(env, DMLC_ROLE=role, PORT=str(port)),
                                               stdout=subprocess.PIPE if role == "worker" else subprocess.DEVNULL,
                                               stderr=log, text=True)
        record_text, _ = procs["worker"].communicate(timeout=JOB_TIMEOUT_S)
        for name in names:
            if procs[name].wait(timeout=JOB_TIMEOUT_S) != 0:
                pytest.fail(f"{name} exited with {procs[name].returncode}: see {out / (name + '.log')}")
        _flush_capture(pcap, host, ports[0])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        capture.send_signal(signal.SIGINT)
        capture.communicate(timeout=30)
    record = json.loads(record_text.strip().splitlines()[-1])
    return {"dir": out, "pcap": pcap, "host": host, "ports": dict(zip(names, ports)), "record": record,
            "logs": {name: (out / f"{name}.log").read_text() for name in names}}


# A crude reader, independent of decoders/: TCP payloads by sequence number, then ZMTP 3.0 framing.

def _tcp_streams(path: Path) -> dict[tuple, bytes]:
    segments: dict[tuple, dict[int, bytes]] = collections.defaultdict(dict)
    first_seq: dict[tuple, int] = {}
    with open(path, "rb") as f:
        for _, buf in dpkt.pcap.Reader(f):
            ip = dpkt.ethernet.Ethernet(buf).data
            tcp = ip.data
            key = (socket.inet_ntoa(ip.src), tcp.sport, socket.inet_ntoa(ip.dst), tcp.dport)
            if tcp.flags & dpkt.tcp.TH_SYN:
                first_seq[key] = tcp.seq + 1
            elif tcp.data:
                segments[key][tcp.seq] = bytes(tcp.data)
    streams = {}
    for key, by_seq in segments.items():
        isn = first_seq[key]
        order = sorted(by_seq, key=lambda seq: (seq - isn) % 2**32)
        data = b"".join(by_seq[seq] for seq in order)
        assert len(data) == (order[-1] - isn) % 2**32 + len(by_seq[order[-1]]), f"hole in {key}"
        streams[key] = data
    return streams


def _zmtp_messages(data: bytes) -> tuple[bytes, list[list[bytes]]]:
    """(identity from READY, messages as lists of frame bodies) of one direction of a ZMTP 3.0 stream."""
    assert data[0] == 0xFF and data[9] == 0x7F and data[10:12] == b"\x03\x00", data[:12]
    pos, identity, messages, frames = 64, None, [], []
    while pos < len(data):
        flags = data[pos]
        if flags & 0x02:
            (size,), pos = struct.unpack_from(">Q", data, pos + 1), pos + 9
        else:
            size, pos = data[pos + 1], pos + 2
        body, pos = data[pos:pos + size], pos + size
        if flags & 0x04:
            if body[1:6] == b"READY":
                identity = body[body.index(b"Identity") + 8 + 4:]
            continue
        frames.append(body)
        if not flags & 0x01:
            messages.append(frames)
            frames = []
    assert pos == len(data) and not frames
    return identity, messages


# dmlc-core's LOG writes "[hh:mm:ss] ", the file, ":", the line, ": ", the message and "\n" as separate writes
# to an unbuffered stderr, so records of two threads interleave between those pieces (seen: a whole record
# inside another's "file:line" prefix); the message itself (Message::DebugString) is one write. Messages are
# therefore found by their own shape; "? => " (no sender id) marks a send (van.cc:394) unless a receive's
# line token (van.cc:419, the scheduler reading an ADD_NODE from a node without id) stands right before it.
_MESSAGE = re.compile(r"(:\d+: )?(\?|\d+) => (\d+)\. Meta: (.*?)(?=\[\d\d:\d\d:\d\d\] |\n|\Z)")
_BIND = re.compile(r"van\.cc:310: Bind to role=(\w+), (?:id=\d+, )?ip=[\d.]+, port=(\d+)")


def _sent_by_log(text: str) -> list[dict]:
    """Messages a node logged as sent. A SimpleApp body spanning lines is kept up to its first newline."""
    sent = []
    for match in _MESSAGE.finditer(text):
        line_token, sender, recver, meta = match.groups()
        if (line_token != ":394: ") if line_token else sender != "?":
            continue
        head, _, body = meta.partition(", body=")
        data_sizes = tuple(int(x) for x in re.findall(r"data_size=(\d+)", body if body else head))
        if body and data_sizes:
            body = body.split(" Body: ", 1)[0]
        field = dict(re.findall(r"(\w+)=(-?\d+|\w+)", head.split(", control=")[0]))
        cmd = re.search(r"cmd=(\w+)", head)
        sent.append({"recver": int(recver), "request": field["request"] == "1",
                     "timestamp": int(field["timestamp"]) if "timestamp" in field else None,
                     "push": field.get("push") == "1", "simple_app": field.get("simple_app") == "1",
                     "head": int(field["head"]) if "head" in field else None,
                     "cmd": cmd.group(1) if cmd else None, "data_sizes": data_sizes, "body": body})
    return sent


def _wire_key(m: dict) -> tuple:
    return (m["sender"], m["recver"], m["request"], m["timestamp"], m["push"], m["simple_app"], m["head"],
            m["cmd"], m["data_sizes"], m["body"])


@pytest.fixture(scope="module")
def decoded_job(mxnet_job):
    """Every message of the capture through PsliteDecoder (only the bodies keep_body asks for)."""
    port_node = {}
    streams = _tcp_streams(mxnet_job["pcap"])
    decoded = []
    for (src, sport, dst, dport), data in streams.items():
        if not data:
            continue
        identity, messages = _zmtp_messages(data)
        decoder = pslite.PsliteDecoder()
        for frames in messages:
            assert pslite.looks_like_meta(frames[0])
            kept = tuple(f if decoder.keep_body(i, len(f)) else None for i, f in enumerate(frames))
            msg = decoder.decode(tuple(len(f) for f in frames), kept, True)
            decoded.append({"stream": (src, sport), "identity": identity, "dport": dport, "msg": msg})
            meta = msg.meta
            if meta.control_cmd == pslite.ADD_NODE and all(n.id is not None for n in meta.nodes):
                port_node.update({n.port: (n.id, n.role) for n in meta.nodes})
    assert decoded, "no ps-lite message captured"
    # a node's first DEALER (to the scheduler, before it has an id) has no identity: its ADD_NODE request
    # names the node's own port
    own_port = {d["stream"]: d["msg"].meta.nodes[0].port for d in decoded
                if d["identity"] == b"" and d["msg"].meta.control_cmd == pslite.ADD_NODE}
    for d in decoded:
        sender = pslite.parse_identity(d["identity"])
        d["sender"] = sender if sender is not None else port_node[own_port[d["stream"]]][0]
        d["recver"] = port_node[d["dport"]][0]
    return {"messages": decoded, "port_node": port_node}


@pytest.mark.root
def test_real_job_nodes(mxnet_job, decoded_job):
    ports = mxnet_job["ports"]
    port_node = decoded_job["port_node"]
    assert port_node[ports["scheduler"]] == (1, pslite.ROLE_SCHEDULER)
    assert port_node[ports["worker"]] == (9, pslite.ROLE_WORKER)
    assert {port_node[ports["server0"]], port_node[ports["server1"]]} == {(8, pslite.ROLE_SERVER),
                                                                         (10, pslite.ROLE_SERVER)}


@pytest.mark.root
def test_real_job_matches_ps_lite_log(mxnet_job, decoded_job):
    """Every message ps-lite logged as sent is on the wire, decoded to the same ids, flags and sizes."""
    ports = mxnet_job["ports"]
    node_of_port = {port: node for port, (node, _) in decoded_job["port_node"].items()}
    logged = collections.Counter()
    for name, text in mxnet_job["logs"].items():
        bind = _BIND.search(text)
        assert bind, f"{name}: no 'Bind to' line"
        sender = node_of_port[int(bind.group(2))]
        assert int(bind.group(2)) == ports[name]
        for sent in _sent_by_log(text):
            logged[_wire_key(dict(sent, sender=sender))] += 1
    on_wire = collections.Counter()
    for d in decoded_job["messages"]:
        meta = d["msg"].meta
        if meta.control_cmd == pslite.TERMINATE:
            assert d["sender"] == d["recver"]      # Van::Stop sends it to itself through SendMsg, unlogged
            continue
        control = meta.control_cmd is not None
        on_wire[_wire_key({
            "sender": d["sender"], "recver": d["recver"], "request": meta.request, "timestamp": meta.timestamp,
            "push": False if control else meta.push, "simple_app": False if control else meta.simple_app,
            "head": meta.head, "cmd": pslite.CONTROL_CMD_NAMES[meta.control_cmd] if control else None,
            "data_sizes": d["msg"].data_sizes, "body": meta.body.decode().split("\n", 1)[0]})] += 1
    assert sum(logged.values()) > 80
    assert on_wire == logged


def _part_elements(elements: int, rank: int) -> int:
    """EncodeDefaultKey's slice of a big array for server `rank`."""
    return round(elements / NUM_SERVERS * (rank + 1)) - round(elements / NUM_SERVERS * rank)


@pytest.mark.root
def test_real_job_attribution(mxnet_job, decoded_job):
    """Each data message attributes to a tensor the worker used, with its dtype, size and rows."""
    record = mxnet_job["record"]
    seen = collections.Counter()
    for d in decoded_job["messages"]:
        msg, meta = d["msg"], d["msg"].meta
        if meta.control_cmd is not None or meta.simple_app or not msg.keys:
            continue
        server = d["recver"] if meta.request else d["sender"]
        rank = pslite.server_rank(server)
        req_type, dtype = mxnet.decode_head(meta.head)
        attr = mxnet.attribute(msg.keys, msg.lens, rank, NUM_SERVERS, req_type)
        tensor = record["tensors"][str(attr.tensor_key)]
        assert dtype == tensor["dtype"]
        elements = int(np.prod(tensor["shape"]))
        itemsize = np.dtype(dtype).itemsize
        seen[req_type, attr.tensor_key] += 1
        if req_type == "default" and msg.lens is not None:
            split = elements >= BIGARRAY_BOUND
            expected = _part_elements(elements, rank) if split else elements
            assert msg.data_sizes[1] == msg.lens[0] == expected * itemsize
            assert attr.part == (rank if split and mxnet.home_server(attr.tensor_key, NUM_SERVERS) != rank
                                 else None)
            assert split or rank == mxnet.home_server(attr.tensor_key, NUM_SERVERS)
        elif req_type == "row_sparse":
            rows = record["row_sparse"][str(attr.tensor_key)]
            assert attr.row_ids.tolist() in (rows["init_rows"], rows["push_rows"], rows["pull_rows"])
            if meta.push and meta.request:
                assert msg.data_sizes[1] == attr.rows * tensor["shape"][1] * itemsize
        elif req_type == "compressed" and attr.uncompressed_elems is not None:
            assert attr.uncompressed_elems == record["compressed"][str(attr.tensor_key)]["elements"]
    # every kind of request was exercised: both servers' slices of key 11, rows, compression, float16
    assert {("default", k) for k in (3, 4, 7, 11, 30)} | {("row_sparse", 20), ("compressed", 40)} <= set(seen)
