"""Real NCCL over RoCE, recorded elsewhere: pcaps/realcaps/softroce-tutorial/nccl (PyTorch 2.4.1 + NCCL 2.20.5,
3 ranks on 3 VMs, Soft-RoCE; its README says what each run did and under which licence).

Truth: each rank's own NCCL log (tests/support/nccl_log.py: rank, nranks, the Ring / Trees lines, the QP
numbers and CTS-FIFO rkeys of the connections it sends on) and the program the write-up gives (test.py:
`dist.barrier()`, which PyTorch 2.4 runs as an NCCL all_reduce of one uint8, then `dist.all_reduce` of 6144
float32). tshark's InfiniBand dissector is an independent reader of the RDMA messages. Nothing here comes from
the decoders' own reading of the protocols.
"""
from __future__ import annotations

import collections
import json
import struct
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from scapy.utils import PcapWriter, RawPcapReader

from dlcsniff.decoders.job import decode_paths
from tests.conftest import PCAPS, require_tool
from tests.support.nccl_log import NcclLog, parse_nccl_log

RUNS = PCAPS / "realcaps" / "softroce-tutorial" / "nccl"
ALGORITHMS = {"ring2": "ring", "tree2": "tree"}         # NCCL_ALGO of each run (the README)
NODES = ("node0", "node1", "node2")
PROGRAM = [("all_reduce", 1), ("all_reduce", 6144 * 4)]  # barrier (1 uint8), all_reduce of 6144 float32
COLUMNS = ["capture", "seq", "kind", "algorithm", "tensor_bytes", "local_rank", "world_size", "local_address"]
CAPTURES = [f"{run}_{node}" for run in ALGORITHMS for node in NODES]


def _logs(run: str) -> dict[str, NcclLog]:
    return {f"{run}_{node}": parse_nccl_log(RUNS / f"{run}_{node}.log") for node in NODES}


def _truth(run: str, captures: list[str]) -> pd.DataFrame:
    logs = _logs(run)
    return pd.DataFrame([{"capture": capture, "seq": seq, "kind": kind, "algorithm": ALGORITHMS[run],
                          "tensor_bytes": size, "local_rank": logs[capture].rank, "world_size": logs[capture].nranks,
                          "local_address": logs[capture].host}
                         for capture in captures for seq, (kind, size) in enumerate(PROGRAM)], columns=COLUMNS)


def _nccl_rows(tables) -> pd.DataFrame:
    found = tables["collectives"].to_pandas()
    return found[found["protocol"] == "roce"].sort_values(["capture", "seq"]).reset_index(drop=True)


def _roce_only(source: Path, path: Path) -> Path:
    """The capture without its TCP packets (the TCPStore): RoCEv2 (UDP) frames only."""
    writer = PcapWriter(str(path), linktype=1, sync=False)
    writer.write_header(None)
    for frame, meta in RawPcapReader(str(source)):
        if frame[12:14] == b"\x08\x00" and frame[23] == 17:
            writer.write_packet(frame, sec=meta.sec, usec=meta.usec)
    writer.close()
    return path


@pytest.fixture(scope="module")
def decoded() -> dict:
    """Each run decoded as a job (its 3 captures together) and each capture alone."""
    out = {run: decode_paths(sorted(RUNS.glob(f"{run}_node*.pcap.gz")), workers=0).tables for run in ALGORITHMS}
    out.update({capture: decode_paths([RUNS / f"{capture}.pcap.gz"], workers=0).tables for capture in CAPTURES})
    return out


@pytest.mark.parametrize("run", ALGORITHMS)
def test_every_rank_collectives_come_out_exactly(decoded, run):
    """The job's 3 captures together: per capture exactly the barrier and the all_reduce, of the run's
    algorithm, with the capture's rank and the world size of its log; nothing else."""
    found = _nccl_rows(decoded[run])
    assert found[COLUMNS].astype(object).equals(_truth(run, [f"{run}_{n}" for n in NODES]).astype(object)), found
    assert found["complete"].all() and (found["channels"] == 1).all()
    logs = _logs(run)
    for row in found.itertuples():
        log, evidence = logs[row.capture], json.loads(row.evidence)
        channel = evidence["channels"][0]
        if run == "ring2":          # the log's `Ring 00 : prev -> self -> next`, read off the wire
            assert channel["ring"] == " -> ".join(map(str, log.ring))
            assert list(row.peers) == sorted({log.ring[0], log.ring[2]})
        else:                       # the log's `Trees [0] down/down/down->self->up`
            assert channel["tree"] == log.tree
            assert list(row.peers) == sorted(log.tree_children + [log.tree_parent] if log.tree_parent >= 0
                                             else log.tree_children)
        assert evidence["rank_source"] == "CTS tag written into this host's FIFO"


@pytest.mark.parametrize("capture", CAPTURES)
def test_each_capture_alone(decoded, capture):
    """One capture without the others: its host from its TCPStore connections, the world size from the
    TCPStore rendezvous (torchelastic's assigned ranks) or the ring's steps."""
    found = _nccl_rows(decoded[capture])
    assert found[COLUMNS].astype(object).equals(_truth(capture.split("_")[0], [capture]).astype(object)), found


@pytest.mark.parametrize("run", ALGORITHMS)
def test_roce_packets_alone(tmp_path, run):
    """Without any TCP (the TCPStore gone): job-wide, everything from the RoCE packets (ranks from the CTS tags,
    the world size from the ring, or from the tree's hosts and the ranks the tags name). One capture alone:
    a ring rank's steps fit only 3 ranks; on a tree edge both hosts touch every connection and the tags name
    a third rank, so nothing says which host captured: one `unknown` row, no size, nothing invented."""
    paths = [_roce_only(RUNS / f"{run}_{node}.pcap.gz", tmp_path / f"{run}_{node}.pcap") for node in NODES]
    found = _nccl_rows(decode_paths(paths, workers=0).tables)
    assert found[COLUMNS].astype(object).equals(_truth(run, [f"{run}_{n}" for n in NODES]).astype(object)), found
    for path in paths:
        alone = _nccl_rows(decode_paths([path], workers=0).tables)
        if run == "ring2":
            assert alone[COLUMNS].astype(object).equals(_truth(run, [path.stem]).astype(object)), alone
            assert json.loads(alone["evidence"][0])["world_size_source"].startswith("the ring steps fit only n = 3")
        elif path.stem == "tree2_node2":                  # the middle rank: the only host on every connection
            assert alone[COLUMNS].astype(object).equals(_truth(run, [path.stem]).astype(object)), alone
        else:
            assert list(alone["kind"]) == ["unknown"] and alone["tensor_bytes"].isna().all()


@pytest.mark.parametrize("run", ALGORITHMS)
def test_the_logs_ib_connections_are_on_the_wire(decoded, run):
    """Each connection a rank's log says it sends on: the CTS written into its FIFO arrive on its logged QP with
    the logged fifoRkey and its rank as tag; its data go to the receiver's logged QP. A connection the run's
    algorithm does not use (the tree's in the ring run, ring 0 -> 1 in the tree run) carries nothing."""
    messages = decoded[run]["messages"].to_pandas()
    roce = messages[messages["protocol"] == "roce"]
    logs = _logs(run)
    host_of = {log.rank: log.host for log in logs.values()}
    used = 0
    for log in logs.values():
        for send in log.sends:
            cts = roce[(roce["nccl_role"] == "cts") & (roce["dst_ip"] == log.host) & (roce["dest_qp"] == send.qpn)
                       & (roce["src_ip"] == host_of[send.peer])]
            data = roce[(roce["nccl_role"] == "data") & (roce["src_ip"] == log.host)
                        & (roce["dst_ip"] == host_of[send.peer]) & (roce["dest_qp"] == send.remote_qpn)]
            assert (cts["rkey"] == send.fifo_rkey).all() and (cts["nccl_tag"] == log.rank).all()
            assert len(cts) == len(data)                  # captured at both ends: each send twice, its CTS too
            used += bool(len(data))
            tree_edge = send.peer in log.tree_children or send.peer == log.tree_parent
            ring_edge = send.peer == log.ring[2]
            assert bool(len(data)) == (ring_edge if run == "ring2" else tree_edge), (log.rank, send)
    assert used == {"ring2": 3, "tree2": 4}[run]
    # every NCCL data write went to a buffer its CTS offered, and every RDMA message is NCCL's
    assert set(roce["nccl_role"]) == {"cts", "data"}


def _tshark_messages(path: Path) -> list[dict]:
    """RDMA messages as tshark's InfiniBand dissector reads them: per (source, destination, QP), packets from a
    FIRST/ONLY to a LAST/ONLY; payload = data.len less the pad (tshark counts the pad in it)."""
    fields = ["ip.src", "ip.dst", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
              "infiniband.bth.padcnt", "infiniband.immdt", "data.len", "data.data"]
    out = subprocess.run([require_tool("tshark"), "-r", str(path), "-Y", "infiniband", "-T", "fields",
                          "-E", "separator=;", *[a for f in fields for a in ("-e", f)]],
                         capture_output=True, text=True, check=True).stdout
    open_messages, messages = {}, []
    for line in out.splitlines():
        src, dst, opcode, qp, psn, pad, imm, length, data = line.split(";")
        opcode = int(opcode)
        if opcode in (0x11, 0x12):        # acknowledgements
            continue
        key = (src, dst, int(qp, 16))
        payload = int(length) - int(pad) if length else 0
        position = {0x06: "first", 0x07: "middle", 0x08: "last", 0x09: "last", 0x0A: "only", 0x0B: "only"}[opcode]
        if position in ("first", "only"):
            open_messages[key] = {"src_ip": src, "dst_ip": dst, "dest_qp": key[2], "psn": int(psn), "size": 0,
                                  "imm": None, "content": bytes.fromhex(data) if position == "only" else None}
        msg = open_messages[key]
        msg["size"] += payload
        if imm:
            msg["imm"] = int.from_bytes(bytes.fromhex(imm.split(",")[0]), "little")    # NCCL: host order
        if position in ("last", "only"):
            messages.append(open_messages.pop(key))
    return messages


@pytest.mark.parametrize("capture", CAPTURES)
def test_tshark_reads_the_same_messages_immediates_and_cts(decoded, capture, tmp_path):
    """tshark (Wireshark's InfiniBand dissector) against the decoder: every RDMA message with the same QP, PSN
    and size; NCCL's immediate, read little-endian, is the size written; every CTS parsed from tshark's bytes
    with NCCL 2.20's 64-byte ncclIbSendFifo {u64 addr, i32 size, u32 rkeys[2], u32 nreqs, u32 tag, u64 idx}
    gives the decoder's tag, FIFO idx and offered size."""
    path = tmp_path / f"{capture}.pcap"
    subprocess.run([require_tool("editcap"), "-F", "pcap", str(RUNS / f"{capture}.pcap.gz"), str(path)], check=True)
    shark = _tshark_messages(path)
    messages = decoded[capture]["messages"].to_pandas()
    roce = messages[messages["protocol"] == "roce"]
    assert collections.Counter((m["src_ip"], m["dst_ip"], m["dest_qp"], m["psn"], m["size"]) for m in shark) == \
        collections.Counter(zip(roce["src_ip"], roce["dst_ip"], roce["dest_qp"], roce["psn"], roce["size_bytes"]))
    assert all(m["imm"] == m["size"] for m in shark if m["imm"] is not None)
    assert sum(m["imm"] is not None for m in shark) == (roce["nccl_role"] == "data").sum()
    decoded_cts = {(r.src_ip, r.dest_qp, r.psn): (r.nccl_tag, r.nccl_fifo_idx, list(r.nccl_sizes))
                   for r in roce[roce["nccl_role"] == "cts"].itertuples()}
    shark_cts = {}
    for m in shark:
        if m["imm"] is None:
            _, size, _, rkey1, nreqs, tag, idx = struct.unpack_from("<QiIIIIxxxxQ", m["content"])
            assert nreqs == 1 and rkey1 == 0 and m["content"][40:] == bytes(24)
            shark_cts[(m["src_ip"], m["dest_qp"], m["psn"])] = (tag, idx, [size])
    assert shark_cts == decoded_cts and len(shark_cts) > 0


@pytest.mark.parametrize("run", ALGORITHMS)
def test_tcpstore_rendezvous_names_ranks_and_world_size(decoded, run):
    """torchelastic's `assigned_ranks/<node>` in the TCPStore: the rank and world size of every node whose agent
    is not on the store's own host (node0 reaches it over loopback, not captured)."""
    messages = decoded[run]["messages"].to_pandas()
    streams = decoded[run]["streams"].to_pandas().drop_duplicates("flow_id").set_index("flow_id")
    store = messages[(messages["protocol"] == "tcpstore") & messages["world_size"].notna()]
    logs = {log.host: log for log in _logs(run).values()}
    seen = {(streams.loc[flow, "src_ip"], int(rank), int(world)) for flow, rank, world
            in zip(store["flow_id"], store["src_rank"], store["world_size"])}
    assert seen == {(host, log.rank, log.nranks) for host, log in logs.items() if log.rank != 0}
