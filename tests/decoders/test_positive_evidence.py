"""NCCL is claimed only on positive evidence, and captures of any shape decode.

Truth: traffic that is not NCCL. Real captures of other programs: the softroce-tutorial verbs runs (perftest,
ibv_*_pingpong, an RDMA-CM program, rping: pcaps/realcaps/softroce-tutorial/perftest, its README says what each
did), this project's recorded MXNet, Gloo and ZeroMQ jobs (pcaps/); tshark's InfiniBand dissector counts
the verbs programs' RDMA requests independently. Generated: a verbs program's QP exchange (the 26-byte
`{u16 lid, u32 qpn, u32 psn, u8 gid[16]}` record each side sends), built here, and NCCL's own traffic
generated from its description (tests/support/nccl_gen.py, roce_gen.py) for the decoders that are not NCCL's.
"""
from __future__ import annotations

import collections
import random
import struct
import subprocess
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.utils import PcapWriter
from typer.testing import CliRunner

from dlcsniff.cli import app
from dlcsniff.decoders.job import decode_paths
from dlcsniff.decoders.protocols.nccl_socket.decoder import NcclSocketCaptureDecoder
from dlcsniff.decoders.protocols.roce.decoder import RoceCaptureDecoder
from tests.conftest import PCAPS, require_tool
from tests.support.nccl_gen import TcpCapture
from tests.support.protocol_driver import run_decoders

VERBS = PCAPS / "realcaps" / "softroce-tutorial" / "perftest"
NCCL_REAL = PCAPS / "realcaps" / "softroce-tutorial" / "nccl"
NOT_NCCL = sorted(p for p in PCAPS.rglob("*.pcap.gz") if NCCL_REAL not in p.parents)
# the first packet of each RDMA request message (IBTA opcodes: RC, UC = RC + 0x20, UD)
REQUEST_STARTS = {**{code: "SEND" for code in (0x00, 0x04, 0x05, 0x20, 0x24, 0x25, 0x64, 0x65)},
                  **{code: "WRITE" for code in (0x06, 0x0A, 0x0B, 0x26, 0x2A, 0x2B)},
                  0x0C: "READ", 0x13: "ATOMIC", 0x14: "ATOMIC"}


def _tshark_requests(path: Path) -> collections.Counter:
    out = subprocess.run([require_tool("tshark"), "-r", str(path), "-Y", "infiniband", "-T", "fields",
                          "-e", "infiniband.bth.opcode"], capture_output=True, text=True, check=True).stdout
    return collections.Counter(REQUEST_STARTS[int(code)] for code in out.split() if int(code) in REQUEST_STARTS)


@pytest.mark.parametrize("path", sorted(VERBS.glob("*.pcap.gz")), ids=lambda p: p.name.split(".")[0])
def test_verbs_programs_are_not_nccl(path):
    """perftest, the pingpongs, RDMA-CM and rping: every RDMA request decoded (as many of each kind as tshark
    counts), none taken for NCCL (no CTS, no NCCL data write, no NCCL stream), no collective."""
    tables = decode_paths([path], workers=0).tables
    messages = tables["messages"].to_pandas()
    roce = messages[messages["protocol"] == "roce"]
    assert collections.Counter(op.removesuffix("_IMM") for op in roce["rdma_op"]) == _tshark_requests(path)
    assert roce["nccl_role"].isna().all()
    assert not any(str(p).startswith("nccl") for p in tables["streams"].to_pandas()["protocol"])
    assert tables["collectives"].num_rows == 0


@pytest.mark.parametrize("path", NOT_NCCL, ids=lambda p: str(p.relative_to(PCAPS)).split(".")[0])
def test_the_nccl_decoders_leave_other_traffic_alone(path):
    """Each NCCL decoder on its own (no other decoder to claim first) over every bundled capture that is not
    NCCL's: no TCP direction claimed, no NCCL message; the RoCE decoder reports the verbs programs' RDMA
    messages and nothing NCCL."""
    (sockets, roce), _ = run_decoders(path, [NcclSocketCaptureDecoder(), RoceCaptureDecoder()])
    assert sockets.streams == {} and sockets.messages == []
    assert roce.streams == {} and all(m["nccl_role"] is None for m in roce.messages)
    assert bool(roce.messages) == (VERBS in path.parents)


def _qp_exchange(path: Path, *, answered: bool, seed: int) -> Path:
    """A verbs program's out-of-band QP exchange over TCP (as in the rdma tutorials and rdma-core examples):
    each side sends its 26-byte {lid, qpn, psn, gid} record, RoCE's lid being 0, then both close; the
    one-sided variant is a client whose server never answers."""
    cap = TcpCapture(seed=seed)
    conn = cap.connect(("198.18.7.1", 50123), ("198.18.7.2", 18515))
    rng = cap.rng
    for from_client in (True, False) if answered else (True,):
        gid = bytes(10) + b"\xff\xff" + bytes([198, 18, 7, 1 if from_client else 2])
        cap.send(conn, struct.pack("<HII16s", 0, rng.randrange(1, 1 << 24), rng.randrange(1 << 24), gid),
                 from_client=from_client)
    cap.close(conn)
    return cap.write(path)


@pytest.mark.parametrize("answered", [True, False])
def test_a_qp_exchange_is_not_nccl(tmp_path, answered):
    """The exchange begins with a zero byte and small integers, what a pre-2.16 NCCL control socket begins with
    (socket index, then sizes); it was once reported as NCCL with an invented message. Answered (both sides
    write) it is no NCCL connection; unanswered, its bytes hold no whole NCCL message."""
    for seed in range(20):
        path = _qp_exchange(tmp_path / f"qp{seed}.pcap", answered=answered, seed=seed)
        tables = decode_paths([path], workers=0).tables
        assert set(tables["streams"].to_pandas()["protocol"]) == {"tcp"}
        assert tables["messages"].num_rows == 0 and tables["collectives"].num_rows == 0


def _write(path: Path, frames: list[bytes]) -> Path:
    writer = PcapWriter(str(path), linktype=1, sync=False)
    writer.write_header(None)
    for i, frame in enumerate(frames):
        writer.write_packet(frame, sec=1_700_000_000, usec=i)
    writer.close()
    return path


SHAPES = {
    "no packets": lambda: [],
    "udp only": lambda: [bytes(Ether() / IP(src="198.18.8.1", dst="198.18.8.2") / UDP(sport=53, dport=5353)
                               / (b"x" * 20)) for _ in range(5)],
    "no ip": lambda: [bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="198.18.8.1", pdst="198.18.8.2"))] * 3,
}


@pytest.mark.parametrize("shape", SHAPES)
def test_captures_of_any_shape_decode(tmp_path, shape):
    """Without TCP, without IP, without packets: `dlcsniff decode` exits 0 and writes every table."""
    path = _write(tmp_path / "shape.pcap", SHAPES[shape]())
    result = CliRunner().invoke(app, ["decode", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "collectives.parquet").exists()


@pytest.mark.parametrize("path", [VERBS / "rdma_cm.pcap.gz", VERBS / "rping.pcap.gz", NCCL_REAL / "ring2_node1.pcap.gz"],
                         ids=lambda p: p.name.split(".")[0])
def test_roce_only_captures_decode_with_the_cli(tmp_path, path):
    """RoCE and nothing else (RDMA-CM, rping: no TCP at all; NCCL: RoCE plus a TCPStore)."""
    result = CliRunner().invoke(app, ["decode", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output


def _bth_stream(flaw: str, packets: int = 12) -> list[bytes]:
    """One queue pair's RC packets to UDP 4791 with consecutive PSNs and ICRCs that are no ICRC (random), as a
    capture tool that rewrites frames leaves them: SEND ONLYs, or (`segments`, `reth`) 3-packet RDMA WRITEs of
    one 1024-byte path MTU; `flaw` breaks one thing RoCE always has."""
    frames = []
    rng = random.Random(flaw)
    write = flaw in ("well formed write", "segments", "reth")
    for psn in range(1000, 1000 + packets):
        position = (psn - 1000) % 3 if write else None
        opcode = {None: 0x04, 0: 0x06, 1: 0x07, 2: 0x08}[position]
        flags = 0x01 if flaw == "tver" else 0
        pkey = 0xFFFF if flaw != "pkey" or psn % 2 else 0x7FFF
        resv_qp = (0x01 << 24 if flaw == "reserved" else 0) | 0x11
        body = rng.randbytes(1000 if flaw == "segments" and position in (0, 1) else 1024 if write else 64)
        if flaw == "misaligned":
            body = body[:-1]
        reth = struct.pack("!QII", 0x1000, 7, 5000 if flaw == "reth" else 3072) if position == 0 else b""
        payload = struct.pack("!BBHII", opcode, flags, pkey, resv_qp, psn) + reth + body + rng.randbytes(4)
        frames.append(bytes(Ether() / IP(src="198.18.8.1", dst="198.18.8.2") / UDP(sport=49152, dport=4791)
                            / payload))
    return frames


@pytest.mark.parametrize("flaw", ["tver", "reserved", "misaligned", "pkey", "segments", "reth"])
def test_near_misses_of_a_roce_stream_without_an_icrc_are_not_claimed(tmp_path, flaw):
    """Without a verified ICRC a stream is RoCE only if all of its transport headers are: PSNs in sequence are
    not enough when one thing RoCE always has is missing (TVer 0, reserved bits 0, a whole number of 4-byte
    words, one P_Key, FIRST and MIDDLE packets of one path MTU, WRITEs as long as their RETH)."""
    job = decode_paths([_write(tmp_path / "near.pcap", _bth_stream(flaw))], workers=0)
    assert job.tables["streams"].num_rows == 0 and job.tables["messages"].num_rows == 0
    assert job.summary["unclaimed"]["udp_ports"] == {4791: 12}


@pytest.mark.parametrize("flaw", ["well formed", "well formed write"])
def test_a_well_formed_stream_without_an_icrc_is_claimed_and_marked(tmp_path, flaw):
    """The near misses' control: the same stream without the flaw is RoCE, claimed without a verified ICRC."""
    job = decode_paths([_write(tmp_path / "near.pcap", _bth_stream(flaw))], workers=0)
    streams = job.tables["streams"].to_pandas()
    assert list(streams["protocol"]) == ["roce"] and not streams["icrc_verified"].any()
    assert job.tables["messages"].num_rows == (4 if flaw.endswith("write") else 12)
    assert any("1 RoCE queue-pair streams claimed without a verified ICRC" in w for w in job.summary["warnings"])
