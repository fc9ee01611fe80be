"""What NCCL's network traffic shows of its collectives, before any step structure is read into it: per
connection (one channel's sends between two ranks, one way) the sends in FIFO order with their sizes, offers
and payload digests (`Wire`, from RoCE's CTS and data writes or the socket transport's messages), which host
each capture is, the ranks the TCPStore assigned and the job's world size. decoders.protocols.nccl.collectives cuts the
sends into operations; its docstring says what the inference relies on.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    import pandas as pd

P2P_CHUNK_BYTES = 128 << 10                      # NCCL_P2P_NET_CHUNKSIZE
P2P_LL_MAX_BYTES = 16384                         # NCCL_P2P_LL_THRESHOLD


# -- what the wire shows -------------------------------------------------------------------------------------

@dataclass(slots=True)
class Send:
    """One network send: one FIFO slot of one connection."""
    idx: int                          # net_ib: the CTS idx (from 1); sockets: message number + 1
    size_bytes: int                   # bytes written on the wire
    payload_bytes: int                # tensor bytes they carry (LL lines carry half)
    ts_first_ns: int
    ts_last_ns: int
    grant_bytes: int | None = None    # the receiver's offer (CTS size)
    grant_ts_ns: int | None = None    # when the receiver wrote the CTS
    head: int | None = None           # CRC-32 of the first payload bytes, when captured
    ll: bool = False                  # the payload is LL lines
    complete: bool = True             # every byte of the send was captured
    va_matches: bool | None = None    # the data went to the buffer the CTS offered
    rows: tuple[tuple[int, int], ...] = ()   # (message row, payload bytes) of the messages it was sent in
    grant_rows: tuple[int, ...] = ()  # the message rows of the CTS writes that offered it (RoCE)


@dataclass(slots=True)
class Connection:
    capture: str
    sender: str                       # address of the sending rank
    receiver: str
    name: str
    order: tuple                      # creation order among the connections between the same two hosts
    sends: list[Send] = field(default_factory=list)

    @property
    def p2p(self) -> bool:
        """send/recv connections (connIndex 1) offer at most a p2p chunk, their LL messages at most 32 KiB of
        lines; collectives a Simple step or two (an LL collective's step, 64 KiB of lines, is no p2p chunk)."""
        grants = [s.grant_bytes for s in self.sends if s.grant_bytes is not None]
        return bool(grants) and max(grants) <= P2P_CHUNK_BYTES and not any(
            s.ll and s.grant_bytes is not None and s.grant_bytes > 2 * P2P_LL_MAX_BYTES for s in self.sends)


@dataclass(slots=True)
class Wire:
    protocol: str
    connections: dict[str, list[Connection]]     # capture -> its connections
    rank_of: dict[str, int]                      # host -> rank named by CTS tags


@dataclass(slots=True)
class Operation:
    kind: str
    algorithm: str | None
    tensor_bytes: int | None
    sends: dict[str, list[Send]]                 # connection name -> its sends in this operation
    evidence: dict

    def span(self) -> tuple[int, int]:
        sends = [s for lst in self.sends.values() for s in lst]
        first = min([s.ts_first_ns for s in sends] + [s.grant_ts_ns for s in sends if s.grant_ts_ns is not None])
        return first, max(s.ts_last_ns for s in sends)


def _present(value) -> bool:
    """Not null: neither None nor pandas' NaN."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def roce_wire(messages: pd.DataFrame, streams: pd.DataFrame) -> Wire:
    """Connections from the RoCE decoder's rows: data writes grouped by (capture, sender, receiver, data QP),
    one send per FIFO idx; the CTS that fed each data QP come on the reverse QP tied to it by their common
    NCCL set-up connection, or else whose entries offered the buffers the data went to."""
    roce = messages[messages["protocol"] == "roce"]
    cts = roce[roce["nccl_role"] == "cts"]
    data = roce[roce["nccl_role"] == "data"]
    tags: dict[str, set[int]] = defaultdict(set)
    for dst, tag in zip(cts["dst_ip"], cts["nccl_tag"]):         # a CTS goes into the data sender's FIFO
        tags[dst].add(int(tag))
    rank_of = {host: next(iter(t)) for host, t in tags.items() if len(t) == 1}
    setup_of = {}
    if "nccl_setup_flow_id" in streams.columns:
        setup_of = {flow: setup for flow, setup in zip(streams["flow_id"], streams["nccl_setup_flow_id"])
                    if _present(setup)}

    # (capture, sender, receiver, cts qp) -> idx -> (offered bytes, offered addresses, time, CTS message row)
    grants: dict[tuple, dict[int, tuple]] = defaultdict(dict)
    cts_flow: dict[tuple, int] = {}
    for row in cts.itertuples():
        key = (row.capture, row.dst_ip, row.src_ip, int(row.dest_qp))
        sizes = list(row.nccl_sizes_bytes) if row.nccl_sizes_bytes is not None else []
        addrs = {int(a) for a in row.nccl_addrs} if row.nccl_addrs is not None else set()
        grants[key][int(row.nccl_fifo_idx)] = (sum(sizes) if sizes else None, addrs, int(row.ts_first_ns), row.Index)
        cts_flow[key] = row.flow_id

    connections: dict[str, list[Connection]] = defaultdict(list)
    for (capture, sender, receiver, qp, flow), rows in data.groupby(
            ["capture", "src_ip", "dst_ip", "dest_qp", "flow_id"], sort=False):
        candidates = [key for key in grants if key[:3] == (capture, sender, receiver)]
        tied = [key for key in candidates if flow in setup_of and setup_of.get(cts_flow[key]) == setup_of[flow]]
        written = [(int(idx), int(va)) for idx, va in zip(rows["nccl_fifo_idx"], rows["va"]) if _present(va)]
        cts_key = tied[0] if len(tied) == 1 else max(
            candidates, key=lambda key: sum(idx in grants[key] and va in grants[key][idx][1] for idx, va in written),
            default=None)
        entries = grants.get(cts_key, {})
        conn = Connection(capture, sender, receiver,
                          f"{sender}->{receiver} data qp {int(qp)} cts qp {cts_key[3] if cts_key else '?'}",
                          (int(qp),))
        rows = rows.sort_values("psn", kind="stable")
        for idx, group in rows.groupby("nccl_fifo_idx", sort=True):
            # multi-receive (nreqs > 1): plain writes, then a WRITE_WITH_IMM of the sizes array
            is_payload = group["nccl_sizes_bytes"].map(lambda v: v is None or len(v) == 0)
            payload = group[is_payload]
            size = int(payload["size_bytes"].sum())
            grant = entries.get(int(idx))
            proto = payload["nccl_proto"].iloc[0] if len(payload) else None
            carried = (group["size_bytes"] // 2 if proto == "LL" else group["size_bytes"]).where(is_payload, 0)
            conn.sends.append(Send(
                int(idx), size, size // 2 if proto == "LL" else size, int(group["ts_first_ns"].min()),
                int(group["ts_last_ns"].max()),
                grant_bytes=None if grant is None or grant[0] is None else int(grant[0]),
                grant_ts_ns=None if grant is None else grant[2],
                head=int(payload["head_crc32"].iloc[0]) if len(payload) and _present(payload["head_crc32"].iloc[0])
                else None,
                ll=proto == "LL", complete=bool(group["complete"].fillna(False).all()),
                va_matches=None if grant is None else all(_present(v) and int(v) in grant[1] for v in payload["va"]),
                rows=tuple(zip(group.index, carried.astype(int))), grant_rows=() if grant is None else (grant[3],)))
        connections[capture].append(conn)
    return Wire("roce", dict(connections), rank_of)


def socket_wire(messages: pd.DataFrame, streams: pd.DataFrame) -> Wire:
    """Connections from the socket transport's rows: one send per control-socket message (NCCL writes an
    `i32 size` for every isend, 0 included: net_socket.cc), in message order; the control socket runs from
    the sending rank to the receiving one."""
    sock = messages[messages["protocol"] == "nccl_socket"]
    ends = streams.drop_duplicates("flow_id").set_index("flow_id")[["src_ip", "dst_ip"]]
    connections: dict[str, list[Connection]] = defaultdict(list)
    for (capture, flow), rows in sock.groupby(["capture", "flow_id"], sort=False):
        sender, receiver = ends.loc[flow, "src_ip"], ends.loc[flow, "dst_ip"]
        rows = rows.sort_values("nccl_seq", kind="stable")
        conn = Connection(capture, sender, receiver, f"{sender}->{receiver} flow {int(flow)}",
                          (int(rows["ts_first_ns"].min()), int(flow)))
        for row in rows.itertuples():
            payload = row.payload_bytes if _present(row.payload_bytes) else row.size_bytes
            conn.sends.append(Send(int(row.nccl_seq) + 1, int(row.size_bytes), int(payload),
                                   int(row.ts_first_ns), int(row.ts_last_ns),
                                   head=int(row.head_crc32) if _present(row.head_crc32) else None,
                                   ll=row.nccl_proto == "LL", complete=bool(row.complete),
                                   rows=((row.Index, int(payload)),)))
        connections[capture].append(conn)
    return Wire("nccl_socket", dict(connections), {})


# -- hosts, ranks, world size --------------------------------------------------------------------------------

def capture_hosts(conns: list[Connection], *, job: dict[str, list[Connection]], world_size: int | None,
                  other_flows: list[tuple[str, str]] = ()) -> list[str]:
    """The hosts whose collectives the capture shows whole. The capture's own host is the one address every
    NCCL connection in it touches; with two ranks both ends qualify, and then the capture's other TCP flows
    (its TCPStore connections...) must touch it too, and a host whose connections other captures of the job
    saw are missing here did not capture it. Two hosts that still both qualify are both shown whole when
    they are the whole job; when the job has more ranks, one of them has connections this capture did not
    see, and nothing says which. Without a common host (a switch mirror), every host seen sending and
    receiving whose connections known anywhere in the job all appear here."""
    here = {(c.sender, c.receiver) for c in conns}
    known = [c for cs in job.values() for c in cs]

    def whole(host: str) -> bool:
        return all((c.sender, c.receiver) in here for c in known if host in (c.sender, c.receiver))

    common = set.intersection(*({c.sender, c.receiver} for c in conns)) if conns else set()
    for a, b in other_flows:
        if len(common) > 1 and common & {a, b}:
            common &= {a, b}
    if len(common) > 1:
        common = {h for h in common if whole(h)} or common
    if len(common) == 1 or (len(common) > 1 and world_size is not None and world_size <= len(common)):
        return sorted(common)
    if len(common) > 1:
        return []
    both_ways = {c.sender for c in conns} & {c.receiver for c in conns}
    return sorted(h for h in both_ways if whole(h))


def ring_cycle(nxt: dict[str, set[str]]) -> list[str] | None:
    """The cycle when every host sends to exactly one host and they close into one ring."""
    if not nxt or any(len(v) != 1 for v in nxt.values()):
        return None
    start = min(nxt)
    ring, host = [start], next(iter(nxt[start]))
    while host != start:
        if host in ring or host not in nxt:
            return None
        ring.append(host)
        host = next(iter(nxt[host]))
    return ring if len(ring) == len(nxt) else None


@dataclass(slots=True)
class StoreRanks:
    """What torchelastic's rendezvous in the TCPStore says (decoders.protocols.tcpstore.torchelastic_fields):
    per host (its agent's address) its rank, when it runs one process, and the world size."""
    rank_of: dict[str, int] = field(default_factory=dict)
    world_size: int | None = None


def store_ranks(messages: pd.DataFrame, streams: pd.DataFrame) -> StoreRanks:
    store = messages[messages["protocol"] == "tcpstore"]
    src = streams.drop_duplicates("flow_id").set_index("flow_id")["src_ip"]
    host = store["flow_id"].map(lambda flow: src.get(flow))
    processes = dict(zip(host[store["local_world_size"].notna()],
                         store["local_world_size"][store["local_world_size"].notna()]))
    assigned = store["world_size"].notna()
    rank_of = {h: int(rank) for h, rank in zip(host[assigned], store["src_rank"][assigned])
               if h is not None and processes.get(h, 1) == 1}
    sizes = {int(w) for w in store["world_size"][assigned]}
    return StoreRanks(rank_of, sizes.pop() if len(sizes) == 1 else None)


def job_world_size(wire: Wire, store: StoreRanks) -> tuple[int | None, str, bool]:
    """World size from everything the captures show together: (size, where from, whether it is exact).
    A ring closes over all ranks, so its length is the world size when every capture is given; otherwise
    the TCPStore rendezvous says it, or the hosts on NCCL connections and the ranks the CTS name bound it."""
    collective = [c for cs in wire.connections.values() for c in cs if not c.p2p]
    hosts = {h for c in collective for h in (c.sender, c.receiver)}
    nxt: dict[str, set[str]] = defaultdict(set)
    for c in collective:
        nxt[c.sender].add(c.receiver)
    ring = ring_cycle(dict(nxt))
    ranks = sorted(set(wire.rank_of.values()))
    if ring is not None and len(ring) >= 3 and len(ring) > max(ranks, default=0):
        return len(ring), "ring length " + " -> ".join(ring), True
    if store.world_size is not None:
        return store.world_size, "TCPStore: torchelastic assigned_ranks", True
    bound = max(len(hosts), ranks[-1] + 1 if ranks else 0)
    if hosts and ranks == list(range(len(hosts))):
        return bound, f"{len(hosts)} hosts on NCCL connections, CTS tags name ranks 0..{len(hosts) - 1}", True
    return (bound or None), f"lower bound: {len(hosts)} hosts, CTS tags name ranks {ranks}", False
