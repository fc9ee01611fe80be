"""A protocol is claimed only on positive evidence: every decoder in the registry runs on every capture, and
each bundled job shows exactly the protocols its programs spoke (what each job ran is in its job.json and in
the README of pcaps/); bytes that are no protocol (random payloads on the ports the decoders know, near-miss
greetings, UDP to RoCEv2's port) are claimed by none and are counted as such."""
from __future__ import annotations

import json
import random
import struct
import subprocess
import sys

import dpkt
import pyarrow.parquet as pq
import pytest

from tests.conftest import PCAPS

# what ran in each bundled job (streams' protocols; "tcp" is a connection no decoder claimed); a new capture
# directory without its line here fails below rather than going unchecked
CLAIMED = {
    "byteps_3s3w": {"pslite", "tcp"},
    "byteps_colocated_2x2": {"pslite"},
    # BytePS's server also opens ZeroMQ connections that carry no ps-lite message
    "byteps_server_2s2w": {"pslite", "zmtp"},
    "byteps_server_colocated_2x2": {"pslite", "zmtp"},
    "byteps_zmq414_2s2w": {"pslite"},
    "gloo": {"gloo", "tcpstore", "tcp"},
    # the Gloo matrix (lab/gloo_matrix.py); "tcp": TCPStore connections that closed without a byte
    "gloo_matrix_k2": {"gloo", "tcpstore", "tcp"},
    "gloo_matrix_k3": {"gloo", "tcpstore", "tcp"},
    # the fault jobs (lab/record.py FAULT_JOBS): Gloo training with a straggler, a hang, a slowed link
    "gloo_hang": {"gloo", "tcpstore", "tcp"},
    "gloo_slow_link": {"gloo", "tcpstore", "tcp"},
    "gloo_straggler": {"gloo", "tcpstore", "tcp"},
    "gloo_straggler_sigstop": {"gloo", "tcpstore", "tcp"},
    # a plain TCP sender and a reader that stops reading (zero windows): nobody's protocol
    "tcp_zero_window": {"tcp"},
    "mxnet_1s1w": {"pslite", "tcp"},
    "mxnet_3s4w": {"pslite"},
    "mxnet_async": {"pslite", "tcp"},
    "mxnet_async_split": {"pslite", "tcp"},
    "mxnet_lossy": {"pslite"},
    "mxnet_lossy_heavy": {"pslite", "tcp"},
    "mxnet_noise": {"pslite", "tcp"},
    "mxnet_sparse": {"pslite"},
    "mxnet_sync": {"pslite", "tcp"},
    "mxnet_sync_large": {"pslite", "tcp"},
    "mxnet_slow_server": {"pslite", "tcp"},
    "mxnet_slow_worker": {"pslite"},
    # killed while hung: each node's ZeroMQ connection to itself had only its handshake (no TERMINATE yet)
    "mxnet_hang": {"pslite", "tcp", "zmtp"},
    "zmq": {"zmtp"},
}
MESSAGES = {"pslite": "pslite", "gloo": "gloo", "tcpstore": "tcpstore", "zmtp": None, "tcp": None}
JOBS = sorted(path.name for path in PCAPS.iterdir() if path.is_dir() and path.name != "realcaps")


REALCAPS = PCAPS / "realcaps" / "softroce-tutorial"
# the real captures made elsewhere (pcaps/realcaps/softroce-tutorial/README.md): NCCL over Soft-RoCE with its
# TCPStore rendezvous (the capture filter kept UDP 4791 and TCP 29500 only), and perftest/rping/rdma_cm runs whose
# TCP or RDMA-CM exchange of queue-pair numbers is theirs, not NCCL's
REAL_SETS = {
    "nccl_ring2": (sorted((REALCAPS / "nccl").glob("ring2_*.pcap.gz")), {"roce", "tcpstore"}),
    "nccl_tree2": (sorted((REALCAPS / "nccl").glob("tree2_*.pcap.gz")), {"roce", "tcpstore"}),
    **{path.name.split(".")[0]: ([path], {"roce", "tcp"} if path.name.startswith(("pingpong", "rdma_"))
                                 and not path.name.startswith("rdma_cm") else {"roce"})
       for path in sorted((REALCAPS / "perftest").glob("*.pcap.gz"))},
}


@pytest.mark.parametrize("name", sorted(REAL_SETS))
def test_real_captures_from_elsewhere_show_exactly_their_protocols(name, tmp_path):
    from dlcsniff.decoders.decode_run import decode_to_dir
    files, expected = REAL_SETS[name]
    assert files, name
    decode_to_dir(files, tmp_path / "out")
    streams = set(pq.read_table(tmp_path / "out" / "streams.parquet", columns=["protocol"]).column("protocol")
                  .to_pylist())
    messages = set(pq.read_table(tmp_path / "out" / "messages.parquet", columns=["protocol"]).column("protocol")
                   .to_pylist())
    assert streams == expected
    assert messages == expected - {"tcp"}


def test_every_bundled_job_is_listed():
    assert set(JOBS) == set(CLAIMED)


@pytest.mark.parametrize("name", JOBS)
def test_each_job_shows_exactly_the_protocols_it_spoke(name, decoded_job):
    out = decoded_job(name)
    streams = set(pq.read_table(out / "streams.parquet", columns=["protocol"]).column("protocol").to_pylist())
    messages = set(pq.read_table(out / "messages.parquet", columns=["protocol"]).column("protocol").to_pylist())
    assert streams == CLAIMED[name]
    assert messages == {MESSAGES[protocol] for protocol in CLAIMED[name]} - {None}


# --- bytes that are no protocol ---------------------------------------------------------------------------

CLIENT, SERVER = "198.18.0.1", "198.18.0.2"
# TCPStore's default port, ps-lite's and MXNet's, Gloo's and NCCL's usual ones, and arbitrary ones
PORTS = [29500, 9000, 9091, 8000, 43210, 50000, 60000]
UDP_DATAGRAMS = 20


def _tcp(ts: float, src: str, dst: str, sport: int, dport: int, seq: int, ack: int, flags: int,
         payload: bytes = b"") -> tuple[float, bytes]:
    segment = dpkt.tcp.TCP(sport=sport, dport=dport, seq=seq, ack=ack, flags=flags, win=65535, data=payload)
    packet = dpkt.ip.IP(src=bytes(map(int, src.split("."))), dst=bytes(map(int, dst.split("."))), p=6,
                        data=segment, ttl=64)
    packet.len = len(packet)
    return ts, bytes(dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, data=packet))


def _conversation(rng: random.Random, ts: float, sport: int, dport: int, chunks: list[bytes]) -> list:
    """A whole TCP connection: handshake, the chunks alternating direction, FINs."""
    syn, ack = rng.randrange(1 << 31), rng.randrange(1 << 31)
    packets = [_tcp(ts, CLIENT, SERVER, sport, dport, syn, 0, dpkt.tcp.TH_SYN),
               _tcp(ts + 1e-4, SERVER, CLIENT, dport, sport, ack, syn + 1, dpkt.tcp.TH_SYN | dpkt.tcp.TH_ACK)]
    seq = {CLIENT: syn + 1, SERVER: ack + 1}
    for index, chunk in enumerate(chunks):
        src, dst, s, d = (CLIENT, SERVER, sport, dport) if index % 2 == 0 else (SERVER, CLIENT, dport, sport)
        for offset in range(0, len(chunk), 1448):
            piece = chunk[offset:offset + 1448]
            ts += 1e-4
            packets.append(_tcp(ts, src, dst, s, d, seq[src], seq[dst], dpkt.tcp.TH_ACK | dpkt.tcp.TH_PUSH, piece))
            seq[src] += len(piece)
    for src, dst, s, d in ((CLIENT, SERVER, sport, dport), (SERVER, CLIENT, dport, sport)):
        ts += 1e-4
        packets.append(_tcp(ts, src, dst, s, d, seq[src], seq[dst], dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK))
        seq[src] += 1
    return packets


def _udp(ts: float, dport: int, payload: bytes) -> tuple[float, bytes]:
    datagram = dpkt.udp.UDP(sport=49152, dport=dport, data=payload)
    datagram.ulen = len(datagram)
    packet = dpkt.ip.IP(src=bytes(map(int, CLIENT.split("."))), dst=bytes(map(int, SERVER.split("."))), p=17,
                        data=datagram, ttl=64)
    packet.len = len(packet)
    return ts, bytes(dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, data=packet))


def _plausible_bth(rng: random.Random) -> bytes:
    """A BTH as RoCE writes one (RC SEND ONLY, TVer 0, default P_Key, reserved bits 0, queue pair 0x11) with a
    random PSN: each packet alone is well formed, no two are a RoCE stream."""
    return struct.pack("!BBHII", 0x04, 0, 0xFFFF, 0x11, rng.randrange(1 << 24))


def _noise_capture(path, seed: int) -> int:
    """Random payloads (and near misses of the protocols' first bytes) on the ports the decoders know; returns
    the number of TCP connections written."""
    rng = random.Random(seed)
    near_misses = [
        b"\xff" + bytes(8) + b"\x7e" + rng.randbytes(54),         # a ZMTP signature with the wrong last byte
        b"\xff" + rng.randbytes(63),                              # one byte of it
        bytes(4) + rng.randbytes(60),                             # a length of zero, then nothing that follows
        (0x6C79).to_bytes(8, "little") + rng.randbytes(56),       # a stray 8-byte integer, as a Gloo-ish header
    ]
    packets, ts, connections = [], 1_700_000_000.0, 0
    for index, port in enumerate(PORTS * 3):
        chunks = [rng.randbytes(rng.choice([1, 7, 64, 300, 5000, 70_000])) for _ in range(rng.randrange(1, 6))]
        if index % 3 == 1:
            chunks[0] = near_misses[index % len(near_misses)]
        packets += _conversation(rng, ts, 40000 + index, port, chunks)
        ts += 0.01
        connections += 1
    for index in range(UDP_DATAGRAMS):                            # UDP to other services' ports, and RoCEv2's:
        port = 4791 if index % 2 else rng.choice([53, 123, 5353, 9999])   # those carry no valid ICRC
        payload = rng.randbytes(rng.choice([12, 28, 64, 1100]))
        if port == 4791 and index % 4 == 1:                       # near misses of a RoCE stream: every BTH well
            payload = _plausible_bth(rng) + payload               # formed, one queue pair, PSNs at random
        packets.append(_udp(ts, port, payload))
        ts += 1e-3
    with open(path, "wb") as f:
        writer = dpkt.pcap.Writer(f, nano=False)
        for stamp, frame in sorted(packets, key=lambda p: p[0]):
            writer.writepkt(frame, ts=stamp)
    return connections


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bytes_of_no_protocol_are_claimed_by_none(tmp_path, seed):
    connections = _noise_capture(tmp_path / "noise.pcap", seed)
    done = subprocess.run([sys.executable, "-m", "dlcsniff", "decode", str(tmp_path / "noise.pcap"), "--out",
                           str(tmp_path / "out"), "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    summary = json.loads(done.stdout)
    assert not summary["dl_traffic"] and summary["messages_by_protocol"] == {}
    assert set(summary["flows_by_protocol"]) <= {"tcp"}
    assert summary["unclaimed"]["tcp_connections"] == connections
    assert summary["unclaimed"]["udp_datagrams"] == UDP_DATAGRAMS
    streams = pq.read_table(tmp_path / "out" / "streams.parquet", columns=["protocol"]).column("protocol")
    assert set(streams.to_pylist()) <= {"tcp"}
    assert pq.read_table(tmp_path / "out" / "messages.parquet").num_rows == 0
