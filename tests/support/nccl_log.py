"""NCCL's own INFO log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH) as the truth of a capture (tests only).

Lines read (NCCL 2.20.5, the formats of src/init.cc, src/graph/*.cc, src/transport/net_ib.cc):
- `Bootstrap : Using eth0:172.30.0.11<0>`: the host's address;
- `comm 0x... rank R nranks N ... commId 0x... - Init START`: the rank and the world size;
- `Ring 00 : a -> b -> c` (channel 00: previous, self, next) and `Trees [0] d0/d1/d2->self->up`;
- `Channel 00/0 : a[0] -> b[0] [send] via NET/IB/0`: a connection this rank sends on (channel 00, connIndex
  0), followed, on the sending side only (ncclIbConnect), by `NET/IB: ... qpn X ... fifoRkey=K` (its own QP and
  the rkey of its CTS FIFO) and `NET/IB: IbDev 0 Port 1 qpn Y set_ece=...` (the receiver's QP, from the
  metadata it sent back);
- `Channel 00/0 : a[0] -> b[0] [receive] via NET/IB/0`: a connection this rank receives on.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class IbSend:
    """One connection this rank sends on, as ncclIbConnect logged it."""
    channel: int
    peer: int                     # the receiving rank
    qpn: int | None = None        # this rank's QP (the CTS arrive on it)
    fifo_rkey: int | None = None  # the rkey the receiver's CTS writes carry
    remote_qpn: int | None = None  # the receiver's QP (the data go to it)


@dataclass
class NcclLog:
    host: str
    rank: int
    nranks: int
    comm_id: int
    ring: tuple[int, int, int]    # previous, self, next on channel 0
    tree: str                     # the `Trees [0]` line: "down0/down1/down2->self->up"
    sends: list[IbSend] = field(default_factory=list)
    receives: list[tuple[int, int]] = field(default_factory=list)    # (channel, sending rank)

    @property
    def tree_parent(self) -> int:
        return int(self.tree.rsplit("->", 1)[1])

    @property
    def tree_children(self) -> list[int]:
        return [int(d) for d in self.tree.split("->")[0].split("/") if d != "-1"]


_HOST = re.compile(r"Bootstrap : Using \w+:([\d.]+)<")
_COMM = re.compile(r"comm 0x[0-9a-f]+ rank (\d+) nranks (\d+) .*commId (0x[0-9a-f]+) - Init START")
_RING = re.compile(r"Ring 00 : (\d+) -> (\d+) -> (\d+)")
_TREE = re.compile(r"Trees \[0\] (\S+)")
_CHANNEL = re.compile(r"Channel (\d+)/0 : (\d+)\[\d+\] -> (\d+)\[\d+\] \[(send|receive)\] via NET/IB")
_QP = re.compile(r"NET/IB: NCCL Dev \d+ IbDev \d+ Port \d+ qpn (\d+) .*fifoRkey=(0x[0-9a-f]+)")
_REMOTE_QP = re.compile(r"NET/IB: IbDev \d+ Port \d+ qpn (\d+) set_ece")


def parse_nccl_log(path: Path) -> NcclLog:
    text = path.read_text()
    rank, nranks, comm_id = _COMM.search(text).groups()
    log = NcclLog(_HOST.search(text).group(1), int(rank), int(nranks), int(comm_id, 16),
                  tuple(int(r) for r in _RING.search(text).groups()), _TREE.search(text).group(1))
    for line in text.splitlines():
        if m := _CHANNEL.search(line):
            channel, src, dst, way = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
            if way == "send":
                log.sends.append(IbSend(channel, dst))
            else:
                log.receives.append((channel, src))
        elif m := _QP.search(line):
            log.sends[-1].qpn, log.sends[-1].fifo_rkey = int(m.group(1)), int(m.group(2), 16)
        elif m := _REMOTE_QP.search(line):
            log.sends[-1].remote_qpn = int(m.group(1))
    return log
