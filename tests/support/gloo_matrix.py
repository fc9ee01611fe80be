"""The Gloo matrix's ground truth and its check: every operation each rank ran (lab/workloads/gloo_matrix_job.py,
its own record), found in what `dlcsniff decode` makes of that rank's capture with its kind, sequence number and
tensor bytes, on the captures as recorded and again with a share of their TCP data segments dropped.

    .venv/bin/python -m tests.support.gloo_matrix JOB_DIR... [--loss 0.10] [--seed 1] [--table FILE.tsv]

What a rank's capture must show (`expected_items`), from the rank's record alone:
- a collective work (the Gloo works PyTorch's profiler saw, with their tags): kind = the work (a
  reduce_scatter runs as all_reduce works), seq = its tag, tensor bytes as nccl-tests count them for that
  work (the k all_reduces of a list reduce_scatter: one chunk each);
- a send or recv (send/recv, recv from any source, batch_isend_irecv, and monitored_barrier's two rounds on
  tags drawn from the collective counter): kind, peer, tag, the message's bytes, seq = its index among the
  rank's operations of that kind, peer and tag;
- an uneven all_to_all_single: the wire holds what a rank sends to and receives from its peers, not the
  chunk it keeps, so its bytes are checked as payload sent and received.

The loss (`drop_segments`) is a seeded rewrite of the capture with its own pcap reader and writer, not
dlcsniff's: each TCP segment carrying data is left out with probability `loss`, and the stream bytes it held
are noted. An item whose every message had its preamble in a dropped segment has nothing left on the lossy
capture (`without_evidence`): it is counted apart. A cell (world size × op × size × dtype) passes when every
item of every rank is found within TOLERANCE.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import math
import random
import socket
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

TOLERANCE = 0.01
PREAMBLE_BYTES = 48
P2P_WORKS = ("send", "recv", "recvAnySource")
P2P_OPS = ("send_recv", "recv_any", "batch_p2p")
# The p2p tensor monitored_barrier sends: at::tensor({rank}), an int32 (seen on the wire: 4 bytes).
MONITORED_BARRIER_BYTES = 4


@dataclass(frozen=True)
class Item:
    """One thing a rank's capture must show."""
    cell: int
    kind: str
    seq: int                        # collectives: the tag; p2p: index among (kind, peer, tag)
    peer: int | None = None
    tag: int | None = None
    tensor_bytes: int | None = None
    sent_bytes: int | None = None   # uneven all_to_all: checked as payload instead of tensor bytes
    received_bytes: int | None = None


def work_bytes(operation: dict, work: dict) -> int:
    """Tensor bytes (nccl-tests convention) of one collective work of an operation."""
    if work["name"] == "all_reduce":
        return operation["element_bytes"] * sum(math.prod(shape) for shape in work["input_shapes"])
    return operation["tensor_bytes"]


def expected_items(record: dict) -> list[Item]:
    """What the rank's capture must show, from the rank's own record."""
    rank, world_size = record["rank"], record["world_size"]
    items: list[Item] = []
    p2p_seen: collections.Counter = collections.Counter()

    def p2p(cell: int, kind: str, peer: int, tag: int, size: int) -> None:
        items.append(Item(cell, kind, p2p_seen[(kind, peer, tag)], peer=peer, tag=tag, tensor_bytes=size))
        p2p_seen[(kind, peer, tag)] += 1

    for operation in record["operations"]:
        cell, op = operation["cell"], operation["op"]
        works = [work for work in operation["gloo_works"] if work["name"] not in P2P_WORKS]
        if op == "monitored_barrier":
            first, second = operation["gloo_tags"]
            peers = range(1, world_size) if rank == 0 else [0]
            for peer in peers:
                p2p(cell, "recv" if rank == 0 else "send", peer, first, MONITORED_BARRIER_BYTES)
            for peer in peers:
                p2p(cell, "send" if rank == 0 else "recv", peer, second, MONITORED_BARRIER_BYTES)
        elif op in P2P_OPS:
            size, tag = operation["tensor_bytes"], operation["tag"]
            if operation["called"] in ("send", "batch_p2p"):
                p2p(cell, "send", (rank + 1) % world_size, tag, size)
            if operation["called"] in ("recv", "batch_p2p"):
                p2p(cell, "recv", (rank - 1) % world_size, tag, size)
        elif op == "all_to_all_single_uneven":
            (tag,) = operation["gloo_tags"]
            items.append(Item(cell, "all_to_all", tag, sent_bytes=operation["sent_to_peers_bytes"],
                              received_bytes=operation["received_from_peers_bytes"]))
        else:
            if len(works) != len(operation["gloo_tags"]):
                raise ValueError(f"rank {rank}, cell {cell}: {len(works)} works, tags {operation['gloo_tags']}")
            items.extend(Item(cell, work["name"], tag, tensor_bytes=work_bytes(operation, work))
                         for work, tag in zip(works, operation["gloo_tags"]))
    return items


def relative_error(found: float, truth: float) -> float:
    if pd.isna(found):
        return math.inf
    if truth == 0:
        return 0.0 if found == 0 else math.inf
    return abs(found - truth) / truth


def match(items: list[Item], collectives: pd.DataFrame) -> list[dict]:
    """Per item (one rank's): found, its decoded size, and its relative error (inf: not found)."""
    collectives = collectives.assign(_peers=collectives["peers"].map(lambda peers: tuple(peers)
                                                                     if peers is not None else ()))
    by_kind_seq = {key: group for key, group in collectives.groupby(["kind", "seq"], dropna=True)}
    results = []
    for item in items:
        candidates = by_kind_seq.get((item.kind, item.seq))
        if candidates is not None and item.peer is not None:
            candidates = candidates[(candidates["_peers"] == (item.peer,)) & (candidates["tag"] == item.tag)]
        if candidates is None or len(candidates) != 1:
            results.append({"found": False, "error": math.inf, "decoded": None,
                            "duplicates": 0 if candidates is None else len(candidates)})
            continue
        row = candidates.iloc[0]
        if item.sent_bytes is not None:
            decoded = (row["payload_bytes_sent"], row["payload_bytes_received"])
            error = max(relative_error(decoded[0], item.sent_bytes), relative_error(decoded[1], item.received_bytes))
        else:
            decoded = row["tensor_bytes"]
            error = relative_error(decoded, item.tensor_bytes)
        results.append({"found": True, "error": error, "decoded": decoded, "duplicates": 0})
    return results


# -- loss: a seeded rewrite of the capture -----------------------------------------------------------------

_PCAP_HEADER = struct.Struct("<IHHiIII")
_RECORD_HEADER = struct.Struct("<IIII")
_PCAP_MAGICS = (0xA1B2C3D4, 0xA1B23C4D)
# link type -> (offset of the ethertype, offset of the IP header)
_LINKS = {113: (14, 16), 276: (0, 20), 1: (12, 14)}       # Linux cooked v1, v2; Ethernet
_ETHERTYPE_IPV4 = 0x0800
_TCP_SYN = 0x02
_SEQ_MASK = 0xFFFF_FFFF


def _open(path: Path):
    with open(path, "rb") as probe:
        magic = probe.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def _tcp_segment(linktype: int, packet: bytes) -> tuple[tuple, int, int, int] | None:
    """(src ip, sport, dst ip, dport), seq, flags and payload bytes of an IPv4 TCP packet; None for others."""
    if linktype not in _LINKS:
        return None
    ethertype_at, ip_at = _LINKS[linktype]
    if int.from_bytes(packet[ethertype_at:ethertype_at + 2], "big") != _ETHERTYPE_IPV4 \
            or len(packet) < ip_at + 20 or packet[ip_at + 9] != 6:
        return None
    ihl = (packet[ip_at] & 0x0F) * 4
    total = int.from_bytes(packet[ip_at + 2:ip_at + 4], "big")
    tcp_at = ip_at + ihl
    if len(packet) < tcp_at + 14:
        return None
    key = (socket.inet_ntoa(packet[ip_at + 12:ip_at + 16]), int.from_bytes(packet[tcp_at:tcp_at + 2], "big"),
           socket.inet_ntoa(packet[ip_at + 16:ip_at + 20]), int.from_bytes(packet[tcp_at + 2:tcp_at + 4], "big"))
    seq = int.from_bytes(packet[tcp_at + 4:tcp_at + 8], "big")
    return key, seq, packet[tcp_at + 13], max(0, total - ihl - (packet[tcp_at + 12] >> 4) * 4)


@dataclass
class Loss:
    """What a rewrite left out: per TCP direction (src ip, sport, dst ip, dport), the stream byte ranges
    [start, end) of the dropped segments, as offsets from the first byte after the SYN."""
    data_segments: int = 0
    left_out: int = 0
    dropped: dict = field(default_factory=lambda: collections.defaultdict(list))

    def covers(self, key: tuple, start: int, end: int) -> bool:
        """Whether a dropped segment overlaps stream bytes [start, end) of direction `key`."""
        ranges = self.dropped.get(key, ())
        i = bisect.bisect_right(ranges, (start, math.inf)) - 1
        return any(low < end and start < high for low, high in ranges[max(0, i):i + 2])


def drop_segments(source: Path, target: Path, loss: float, seed: int) -> Loss:
    """Copy a pcap (gzipped or not), leaving out each TCP segment that carries data with probability `loss`."""
    rng = random.Random(seed)
    result = Loss()
    first_seq: dict[tuple, int] = {}
    dropped_seq: dict[tuple, list] = collections.defaultdict(list)
    with _open(source) as reader, open(target, "wb") as writer:
        header = reader.read(_PCAP_HEADER.size)
        magic, *_, linktype = _PCAP_HEADER.unpack(header)
        if magic not in _PCAP_MAGICS:
            raise ValueError(f"{source}: not a little-endian pcap")
        writer.write(header)
        while record := reader.read(_RECORD_HEADER.size):
            packet = reader.read(_RECORD_HEADER.unpack(record)[2])
            segment = _tcp_segment(linktype & 0xFFFF, packet)
            if segment is not None:
                key, seq, flags, payload = segment
                if flags & _TCP_SYN:
                    first_seq[key] = (seq + 1) & _SEQ_MASK
                if payload:
                    result.data_segments += 1
                    if rng.random() < loss:
                        result.left_out += 1
                        dropped_seq[key].append((seq, payload))
                        continue
            writer.write(record)
            writer.write(packet)
    for key, segments in dropped_seq.items():
        if key in first_seq:
            offsets = (((seq - first_seq[key]) & _SEQ_MASK, size) for seq, size in segments)
            result.dropped[key] = sorted((start, start + size) for start, size in offsets)
    return result


# -- decoding and checking -----------------------------------------------------------------------------------

@dataclass
class Decoded:
    """One capture's tables as `dlcsniff decode` writes them."""
    collectives: pd.DataFrame
    messages: pd.DataFrame              # Gloo's
    stream_keys: dict[int, tuple]       # flow_id -> (src ip, sport, dst ip, dport)


def decode(captures: dict[str, Path]) -> dict[str, Decoded]:
    """Rank name -> its capture's tables, the captures decoded as one job (decoders.job.decode_paths: what
    `dlcsniff decode` writes)."""
    from dlcsniff.decoders.inputs.capture_set import capture_name
    from dlcsniff.decoders.job import decode_paths

    dataset = decode_paths(list(captures.values()))
    tables = {name: dataset.tables[name].to_pandas() for name in ("collectives", "messages", "streams")}
    rank_of = {capture_name(path): rank for rank, path in captures.items()}
    out = {}
    for capture, rank in rank_of.items():
        streams = tables["streams"][tables["streams"]["capture"] == capture]
        messages = tables["messages"]
        out[rank] = Decoded(
            tables["collectives"][tables["collectives"]["capture"] == capture],
            messages[(messages["capture"] == capture) & (messages["protocol"] == "gloo")],
            {row.flow_id: (row.src_ip, int(row.src_port), row.dst_ip, int(row.dst_port))
             for row in streams.itertuples()})
    return out


def item_messages(item: Item, messages: pd.DataFrame) -> pd.DataFrame:
    """The messages (of the clean capture) that state an item: its collective's; for a send or recv, the
    seq-th of each opcode among those of its peer and tag that move data its way (gloo pairs a pair's
    transfers on one slot in order; the receiver's NOTIFY_RECV_READY goes against the data)."""
    if item.peer is None:
        return messages[(messages["collective"] == item.kind) & (messages["seq"] == item.seq)]
    sends_data = messages["outgoing"].astype(bool) != (messages["opcode"] == "NOTIFY_RECV_READY")
    mine = messages[(messages["collective"] == "p2p") & (messages["tag"] == item.tag)
                    & (messages["peer_rank"] == item.peer) & (sends_data == (item.kind == "send"))]
    return mine.sort_values("ts_first_ns", kind="stable").groupby("opcode").nth(item.seq)


def without_evidence(items: list[Item], clean: Decoded, loss: Loss) -> list[bool]:
    """Per item: whether the rewrite dropped a segment over every preamble of its messages, so that the lossy
    capture states nothing about it."""
    out = []
    for item in items:
        stated = item_messages(item, clean.messages)
        out.append(not stated.empty and all(
            loss.covers(clean.stream_keys[flow], int(offset), int(offset) + PREAMBLE_BYTES)
            for flow, offset in zip(stated["flow_id"], stated["stream_offset_bytes"])))
    return out


def check_job(job_dir: Path, loss: float, seed: int, scratch: Path) -> list[dict]:
    """Per rank of a recorded matrix job: its items, and each item's result on its capture as recorded and
    with `loss` of its TCP data segments dropped (seed: seed * 1000 + world size * 10 + rank)."""
    job = json.loads((job_dir / "job.json").read_text())
    nodes = {node["name"]: node for node in job["nodes"]}
    records = {name: json.loads((job_dir / node["record"]).read_text()) for name, node in nodes.items()}
    began = time.monotonic()
    clean = decode({name: job_dir / node["capture"] for name, node in nodes.items()})
    clean_s = time.monotonic() - began
    losses, lossy_paths = {}, {}
    for name, node in nodes.items():
        lossy_paths[name] = scratch / f"{name}.pcap"
        losses[name] = drop_segments(job_dir / node["capture"], lossy_paths[name], loss,
                                     seed * 1000 + job["world_size"] * 10 + node["rank"])
    began = time.monotonic()
    try:
        lossy = decode(lossy_paths)
    finally:
        for path in lossy_paths.values():
            path.unlink()
    lossy_s = time.monotonic() - began
    results = []
    for name, node in nodes.items():
        items = expected_items(records[name])
        lossy_results = match(items, lossy[name].collectives)
        for result, nothing_left in zip(lossy_results, without_evidence(items, clean[name], losses[name])):
            result["no_evidence"] = nothing_left
        results.append({"job": job["job"], "world_size": job["world_size"], "rank": node["rank"], "items": items,
                        "clean": match(items, clean[name].collectives), "lossy": lossy_results,
                        "data_segments": losses[name].data_segments, "left_out": losses[name].left_out,
                        "decode_s": clean_s, "lossy_decode_s": lossy_s,
                        "kernel_drops": node["capture_stats"]["packets_dropped_by_kernel"]})
    return results


def item_table(rank_results: list[dict]) -> pd.DataFrame:
    """One row per item and rank: truth, decoded sizes and verdicts, clean and lossy."""
    rows = []
    for result in rank_results:
        for item, clean, lossy in zip(result["items"], result["clean"], result["lossy"]):
            rows.append({"world_size": result["world_size"], "cell": item.cell, "rank": result["rank"],
                         "kind": item.kind, "seq": item.seq, "peer": item.peer, "tag": item.tag,
                         "truth": item.tensor_bytes if item.sent_bytes is None else (item.sent_bytes,
                                                                                     item.received_bytes),
                         "clean_decoded": clean["decoded"], "clean_error": clean["error"],
                         "clean_ok": clean["error"] <= TOLERANCE, "lossy_decoded": lossy["decoded"],
                         "lossy_error": lossy["error"], "lossy_ok": lossy["error"] <= TOLERANCE,
                         "no_evidence": lossy["no_evidence"]})
    return pd.DataFrame(rows)


def cell_table(plans: dict[int, list[dict]], items: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (world size × op × size × dtype): clean "ok" when every item of every rank passes;
    lossy "ok", "ok*" when only items the loss left no evidence of fail, "FAIL" otherwise; worst errors over
    the items with evidence."""
    items = items.assign(lossy_error_with_evidence=items["lossy_error"].where(~items["no_evidence"]),
                         lost_evidence_failed=items["no_evidence"] & ~items["lossy_ok"])
    cells = items.groupby(["world_size", "cell"]).agg(
        ranks=("rank", "nunique"), items=("rank", "size"), clean_all=("clean_ok", "all"),
        clean_worst=("clean_error", "max"), lossy_all=("lossy_ok", "all"),
        lossy_failed=("lossy_ok", lambda ok: int((~ok).sum())), no_evidence=("lost_evidence_failed", "sum"),
        lossy_worst=("lossy_error_with_evidence", "max")).reset_index()
    cells["clean"] = np.where(cells["clean_all"], "ok", "FAIL")
    cells["lossy"] = np.select([cells["lossy_all"], cells["lossy_failed"] == cells["no_evidence"]], ["ok", "ok*"],
                               "FAIL")
    spec = pd.DataFrame([{"world_size": k, "cell": i, "op": c["op"], "nominal_bytes": c["nominal_bytes"],
                          "dtype": c["dtype"]} for k, plan in plans.items() for i, c in enumerate(plan)])
    return spec.merge(cells.drop(columns=["clean_all", "lossy_all"]), on=["world_size", "cell"], how="left")


def summary(cells: pd.DataFrame, items: pd.DataFrame, loss: float) -> str:
    with_evidence = items[~items["no_evidence"]]
    return (f"{len(cells)} cells, {len(items)} items: clean {int((cells['clean'] == 'ok').sum())} cells pass "
            f"(worst error {items['clean_error'].max():.4%}); {loss:.0%} loss: {int((cells['lossy'] == 'ok').sum())}"
            f" pass, {int((cells['lossy'] == 'ok*').sum())} pass but for items the loss left nothing of "
            f"({int((items['no_evidence'] & ~items['lossy_ok']).sum())} items), "
            f"{int((cells['lossy'] == 'FAIL').sum())} fail (worst error of items with evidence "
            f"{with_evidence['lossy_error'].max():.4%})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.gloo_matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("jobs", type=Path, nargs="+", help="job directories (python -m lab.record gloo-matrix)")
    parser.add_argument("--loss", type=float, default=0.10, help="share of TCP data segments dropped")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--table", type=Path, help="write the per-cell table here (TSV)")
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()), help="for the lossy copies")
    args = parser.parse_args(argv)
    began = time.monotonic()
    results, plans = [], {}
    for job_dir in args.jobs:
        with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
            results += check_job(job_dir, args.loss, args.seed, Path(scratch))
        plans[json.loads((job_dir / "job.json").read_text())["world_size"]] = \
            json.loads((job_dir / "plan.json").read_text())
    items = item_table(results)
    cells = cell_table(plans, items)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", None)
    failing = items[~items["clean_ok"] | (~items["lossy_ok"] & ~items["no_evidence"])]
    if not failing.empty:
        print(f"items failing (with evidence left):\n{failing.to_string(index=False)}\n")
    print(cells.to_string(index=False))
    if args.table:
        cells.to_csv(args.table, sep="\t", index=False)
    for result in results:
        print(f"k={result['world_size']} rank{result['rank']}: {result['kernel_drops']} packets dropped by the "
              f"kernel; {result['left_out']} of {result['data_segments']} data segments left out")
    print(f"\n{summary(cells, items, args.loss)}; {time.monotonic() - began:.0f} s")
    return 0 if (cells["clean"] == "ok").all() and (cells["lossy"] != "FAIL").all() else 1


if __name__ == "__main__":
    sys.exit(main())
