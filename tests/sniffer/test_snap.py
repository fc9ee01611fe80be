"""The ZMTP snap filter (sniffer/probes/zmtp_snap.c) in the real kernel, under the real daemon.

Two namespaces: a sender and a receiver talking real libzmq (pyzmq, ZMTP 3.1) over a 1500-byte MTU
veth with offloads off. Four daemons capture the same traffic on the receiver at once: the default
(the cut), --full-payload, --ports (the cut, and other ports dropped) and --filter (whole packets).
tshark reads the files (an independent reader: header lengths, wire and captured lengths), the receiving
program's own recv() is the ground truth of the frame sizes, and `dlcsniff decode` must recover them.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dlcsniff.decoders.protocols import ZMTP_KEPT_BODIES
from dlcsniff.decoders.protocols.pslite import decoder as pslite
from dlcsniff.sniffer import bpf_objects
from lab.netns import Cluster
from tests.conftest import require_root, require_tool
from tests.support.daemon import TOOL_PYTHON, RunningDaemon, decode_zmtp

pytestmark = pytest.mark.root

ZMQ_PORT = 7200            # connected after the daemons started: cut
EARLY_PORT = 7201          # connected before: whole packets
PLAIN_PORT = 7300          # not ZMTP: whole packets
FRAME_SIZES = [0, 1, 255, 256, 65536, 65537, 1_000_000, 5_000_000]
ETHERNET_HEADER_BYTES = 14
DAEMON_STOP_TIMEOUT_S = 10.0

# Binds PULL sockets on ZMQ_PORT and EARLY_PORT and a plain TCP server on PLAIN_PORT; prints "listening",
# then, once it has `expected` messages on each ZMQ port and the plain stream ended, what it received.
RECEIVER = r"""
import json, socket, sys, threading, zmq
zmq_port, early_port, plain_port, expected_zmq, expected_early = map(int, sys.argv[1:6])
ctx = zmq.Context()
pulls = {}
for port in (zmq_port, early_port):
    pulls[port] = ctx.socket(zmq.PULL)
    pulls[port].bind(f"tcp://*:{port}")
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("", plain_port))
server.listen()
plain = [0]
def serve():
    conn, _ = server.accept()
    while data := conn.recv(1 << 20):
        plain[0] += len(data)
thread = threading.Thread(target=serve)
thread.start()
print("listening", flush=True)
received = {port: [[len(frame) for frame in pulls[port].recv_multipart(copy=False)] for _ in range(count)]
            for port, count in ((early_port, expected_early), (zmq_port, expected_zmq))}
thread.join()
print(json.dumps({"zmq": received[zmq_port], "early": received[early_port], "plain": plain[0]}), flush=True)
"""

# Connects to EARLY_PORT and sends one message (the connection exists before the daemons), prints
# "early", waits for a line on stdin, then sends `messages` on a new connection to ZMQ_PORT, a last one on
# the early connection, and plain bytes to PLAIN_PORT; prints what it sent.
SENDER = r"""
import json, os, socket, sys, zmq
host, zmq_port, early_port, plain_port = sys.argv[1], *map(int, sys.argv[2:5])
messages = json.loads(sys.argv[5])
ctx = zmq.Context()
early = ctx.socket(zmq.PUSH)
early.connect(f"tcp://{host}:{early_port}")
early.send(b"before the capture")
print("early", flush=True)
sys.stdin.readline()
push = ctx.socket(zmq.PUSH)
push.setsockopt(zmq.SNDHWM, 0)
push.connect(f"tcp://{host}:{zmq_port}")
for sizes in messages:
    push.send_multipart([os.urandom(size) for size in sizes])
early.send(os.urandom(300_000))
with socket.create_connection((host, plain_port)) as plain:
    plain.sendall(os.urandom(1_000_000))
push.close(linger=-1)
early.close(linger=-1)
ctx.term()
print(json.dumps(messages), flush=True)
"""


def tshark_packets(pcap: Path) -> list[dict]:
    """Per packet, as tshark reads it: wire and captured lengths, IP and TCP header lengths, ports, and the
    TCP payload length (from the IP header, so also for a cut packet)."""
    fields = ["frame.len", "frame.cap_len", "ip.hdr_len", "tcp.hdr_len", "tcp.srcport", "tcp.dstport", "tcp.len"]
    done = subprocess.run([require_tool("tshark"), "-r", str(pcap), "-T", "fields", "-E", "occurrence=f",
                           *(arg for field in fields for arg in ("-e", field))],
                          capture_output=True, text=True, check=True)
    names = ["wire", "captured", "ip_header", "tcp_header", "src_port", "dst_port", "payload"]
    return [dict(zip(names, (int(value) if value else None for value in line.split("\t"))))
            for line in done.stdout.splitlines()]


def from_traffic(packets: list[dict]) -> list[dict]:
    """The packets from the first of ZMQ_PORT on: the daemons started one after the other, and the early
    connection's last acknowledgement may fall before some of them."""
    first = next(index for index, packet in enumerate(packets) if ZMQ_PORT in (packet["src_port"], packet["dst_port"]))
    return packets[first:]


def by_direction(packets: list[dict], field: str) -> dict[tuple, list[int]]:
    directions: dict[tuple, list[int]] = {}
    for packet in packets:
        directions.setdefault((packet["src_port"], packet["dst_port"]), []).append(packet[field])
    return directions


def run_info(directory: Path) -> tuple[dict, Path]:
    info = json.loads((directory / "capture.json").read_text())
    packets = [item for item in info["files"] if item["kind"] == "packets"]
    assert len(packets) == 1 and packets[0]["dropped"] == 0, info["files"]
    return info["runs"][0], directory / packets[0]["name"]


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """Runs the traffic once under the four daemons; returns (what was received, {name: directory})."""
    require_root()
    base = tmp_path_factory.mktemp("snap")
    messages = [FRAME_SIZES, *([size] for size in FRAME_SIZES), [3, 70_000, 2]]
    with Cluster(f"snap{os.getpid() % 100000}", ["sender", "receiver"]) as cluster:
        receiver_host = cluster.host("receiver")
        receiver = cluster.popen("receiver", [str(TOOL_PYTHON), "-c", RECEIVER, str(ZMQ_PORT), str(EARLY_PORT),
                                              str(PLAIN_PORT), str(len(messages)), "2"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert receiver.stdout.readline().strip() == b"listening", receiver.stderr.read()
        sender = cluster.popen("sender", [str(TOOL_PYTHON), "-c", SENDER, receiver_host.ip, str(ZMQ_PORT),
                                          str(EARLY_PORT), str(PLAIN_PORT), json.dumps(messages)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert sender.stdout.readline().strip() == b"early", sender.stderr.read()
        options = {"cut": [], "full": ["--full-payload"], "ports": ["--ports", f"{ZMQ_PORT}-{ZMQ_PORT}"],
                   "filter": ["--filter", "tcp"]}
        directories = {name: base / name for name in options}
        daemons = {name: RunningDaemon(["--iface", receiver_host.interface, "--out", str(directories[name]),
                                        *extra], netns=receiver_host.netns) for name, extra in options.items()}
        try:
            for daemon in daemons.values():
                daemon.wait_ready()
            sender.stdin.write(b"go\n")
            sender.stdin.flush()
            sent_out, sent_errors = sender.communicate(timeout=120)
            received_out, received_errors = receiver.communicate(timeout=120)
            codes = {name: daemon.stop(timeout_s=DAEMON_STOP_TIMEOUT_S) for name, daemon in daemons.items()}
        finally:
            for daemon in daemons.values():
                daemon.kill()
        assert sender.returncode == 0, sent_errors
        assert receiver.returncode == 0, received_errors
        assert codes == dict.fromkeys(options, 0), {name: daemons[name].stderr for name in options}
    received = json.loads(received_out.decode().splitlines()[-1])
    assert received["zmq"] == json.loads(sent_out.decode().splitlines()[-1]) == messages
    assert received["early"] == [[18], [300_000]] and received["plain"] == 1_000_000
    return received, directories


def test_the_cut_keeps_every_header_and_the_wire_lengths(captured):
    _, directories = captured
    cut_run, cut_pcap = run_info(directories["cut"])
    full_run, full_pcap = run_info(directories["full"])
    cut, full = from_traffic(tshark_packets(cut_pcap)), from_traffic(tshark_packets(full_pcap))
    # the same TCP packets, with the same wire lengths (in order per direction: the two sockets may see the
    # directions interleaved differently); the full capture holds every byte of each. ARP may come and go
    # between the two daemons' starts: only the traffic is compared.
    def traffic(packets):
        return [packet for packet in packets if packet["src_port"] is not None]
    assert by_direction(traffic(cut), "wire") == by_direction(traffic(full), "wire")
    assert all(packet["captured"] == packet["wire"] for packet in full)
    tcp = [packet for packet in cut if packet["tcp_header"] is not None]
    assert tcp and all(packet["captured"] >= ETHERNET_HEADER_BYTES + packet["ip_header"] + packet["tcp_header"]
                       for packet in tcp)
    # whole packets where the flow cannot be followed: connected before the capture, or not ZMTP
    for port in (EARLY_PORT, PLAIN_PORT):
        flow = [packet for packet in tcp if port in (packet["src_port"], packet["dst_port"])]
        assert flow and all(packet["captured"] == packet["wire"] for packet in flow), port
    zmq_flow = [packet for packet in tcp if ZMQ_PORT in (packet["src_port"], packet["dst_port"])]
    cut_bytes = sum(packet["wire"] - packet["captured"] for packet in zmq_flow)
    # the values of the 65537 B, 1 MB and 5 MB frames of the multipart message are not in the file (sent
    # alone, each is a message's first frame, which as ps-lite's meta is kept whole), but for packets kept
    # whole while the filter waited for a reordered one that might hold a frame header
    assert cut_bytes >= (65537 + 1_000_000 + 5_000_000) - (1 << 20) - 10 * 1500
    # the traffic is 12.1 MB of frames, of which the 6 MB sent alone stay whole: the file is about half
    assert cut_pcap.stat().st_size < full_pcap.stat().st_size * 0.65
    # capture.json counts what the kernel cut, exactly as the file shows it
    assert full_run["payload"] == {"mode": "full", "reason": "--full-payload", "attached_ns": None, "cut_packets": 0,
                                   "cut_bytes": 0, "full_flows": 0, "waits": 0, "resumed": 0}
    payload = cut_run["payload"]
    assert payload["mode"] == "zmtp-cut" and payload["reason"] is None
    assert cut_run["start_ns"] < payload["attached_ns"] < cut_run["stop_ns"]
    every_packet = tshark_packets(cut_pcap)
    assert payload["cut_bytes"] == sum(packet["wire"] - packet["captured"] for packet in every_packet)
    assert payload["cut_packets"] == sum(packet["captured"] < packet["wire"] for packet in every_packet)
    # the early flow (sender->receiver data seen, the receiver's acks carry no payload) and the plain one
    assert payload["full_flows"] >= 2
    assert payload["waits"] == payload["resumed"]            # every wait for a hole ended in the framing found


def test_decode_of_the_cut_capture_gives_every_frame_size(captured, tmp_path):
    received, directories = captured
    streams, messages = decode_zmtp(directories["cut"], tmp_path / "decoded")
    to_receiver = set(streams.loc[streams["dst_port"] == ZMQ_PORT, "flow_id"])
    data = messages[messages["flow_id"].isin(to_receiver)]
    assert [list(sizes) for sizes in data["frame_sizes"]] == received["zmq"]
    # Nothing was lost: the cut bytes are uncaptured on purpose, and every message stays whole.
    assert data["complete"].all()
    to_receiver_streams = streams[streams["flow_id"].isin(to_receiver)]
    assert (to_receiver_streams["missing_bytes"] == 0).all() and to_receiver_streams["uncaptured_bytes"].sum() > 0


def test_ports_drops_other_ports_in_the_kernel_and_still_cuts(captured):
    _, directories = captured
    run, pcap = run_info(directories["ports"])
    packets = tshark_packets(pcap)
    assert packets and all(ZMQ_PORT in (packet["src_port"], packet["dst_port"]) for packet in packets)
    assert run["payload"]["mode"] == "zmtp-cut" and run["payload"]["cut_bytes"] > 0
    _, cut_pcap = run_info(directories["cut"])
    assert len(packets) == sum(ZMQ_PORT in (packet["src_port"], packet["dst_port"])
                               for packet in tshark_packets(cut_pcap))


def test_a_filter_expression_keeps_whole_packets_and_says_why(captured):
    _, directories = captured
    run, pcap = run_info(directories["filter"])
    assert run["payload"]["mode"] == "full" and run["payload"]["reason"].startswith("--filter")
    packets = tshark_packets(pcap)
    assert packets and all(packet["captured"] == packet["wire"] for packet in packets)


def test_the_cut_keeps_every_body_the_decoders_keep():
    """The kernel cut and the decoders keep bodies by one rule (the registry's ZMTP_KEPT_BODIES): the
    filter's object is built with both of its numbers, and ps-lite's keep_body follows it."""
    flags = " ".join(bpf_objects.SNAP.cflags())
    assert f"-DSNAP_KEPT_FIRST_FRAMES={ZMTP_KEPT_BODIES.first_frames}" in flags
    assert f"-DSNAP_KEPT_BODY_MAX={ZMTP_KEPT_BODIES.max_body_bytes}" in flags
    keep = pslite.PsliteDecoder().keep_body
    big = ZMTP_KEPT_BODIES.max_body_bytes + 1
    assert keep(0, big) and keep(1, big)                      # routing id / meta and keys, whatever their size
    assert not keep(ZMTP_KEPT_BODIES.first_frames, big)       # past them, nothing larger than the rule
    assert keep(3, ZMTP_KEPT_BODIES.max_body_bytes)           # a lens frame within the rule
