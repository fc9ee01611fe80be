"""NCCL's IB semantics on RDMA writes (NCCL src/transport/net_ib, read at the v2.12.12 ... v2.30.3 tags and
master): the CTS FIFO entries a receiver writes to its sender, and the byte count a data write's immediate
carries. decoders.protocols.roce.decoder matches the capture's writes with them.

For each receive, the receiver RDMA-WRITEs (WRITE_ONLY, no immediate) n = nreqs `ncclIbSendFifo` entries into
the sender's CTS FIFO: 32-byte entries up to 2.19 {u64 addr, i32 size, u32 rkey, u32 nreqs, u32 tag, u64 idx};
64-byte entries since 2.20 (merged NICs): 2 rkeys and an i32 size (2.20-2.23), 4 rkeys and a u64 size
(2.24-2.29), 8 rkeys (2.30+). tag is the sending rank, idx the FIFO counter (from 1); entry n of a receive lands
at the FIFO address + (slot * 8 + n) * entry size, slot = (idx - 1) mod 256 in 2.20 (NCCL_NET_MAX_REQUESTS *
NCCL_NET_IB_MAX_RECVS). The sender then WRITEs the data to addr with one of the rkeys; the last write carries an
immediate: the byte count as the host stores it (net_ib ncclIbMultiSend assigns the size to imm_data without
htonl, so on little-endian hosts the ImmDt bytes are little-endian: a 1-byte write carries 01 00 00 00, seen on
real 2.20.5 captures). An empty send is a 0-byte WRITE_WITH_IMM. Multi-receive (nreqs > 1): plain WRITEs, then a
WRITE_WITH_IMM of nreqs little-endian i32 sizes. With adaptive routing the data is a plain WRITE followed by a
0-byte WRITE_WITH_IMM.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass


def nccl_imm_bytes(imm: int) -> int:
    """NCCL's byte count from an ImmDt read big-endian: NCCL stores it in host order (little-endian hosts)."""
    return int.from_bytes(imm.to_bytes(4, "big"), "little")


@dataclass(slots=True)
class CtsEntry:
    """One ncclIbSendFifo entry: a receive buffer the receiver offers to the sending rank."""
    addr: int
    size: int
    rkeys: tuple[int, ...]
    nreqs: int
    tag: int                     # the sending rank
    idx: int                     # FIFO counter, from 1
    matched_bytes: int = 0       # data written into it so far
    send_bytes: int | None = None   # what the sender says it sent (immediate or size array)
    closed: bool = False


@dataclass(frozen=True, slots=True)
class _CtsLayout:
    """Where an ncclIbSendFifo entry's fields sit. NCCL allocates its FIFO zero-filled, so every byte no field
    covers (alignment, padding) is 0: with the nreqs / idx checks this tells the layouts apart."""
    entry_bytes: int
    size: struct.Struct          # at offset 8
    rkeys: struct.Struct
    rkeys_at: int
    nreqs_at: int                # u32 nreqs, u32 tag
    idx_at: int                  # u64


_CTS_LAYOUTS = [
    _CtsLayout(64, struct.Struct("<Q"), struct.Struct("<8I"), 16, 48, 56),   # 2.30+
    _CtsLayout(64, struct.Struct("<Q"), struct.Struct("<4I"), 16, 32, 40),   # 2.24-2.29
    _CtsLayout(64, struct.Struct("<i"), struct.Struct("<2I"), 12, 20, 32),   # 2.20-2.23 (seen on 2.20.5)
    _CtsLayout(32, struct.Struct("<i"), struct.Struct("<I"), 12, 16, 24),    # up to 2.19
]
_U64_LE = struct.Struct("<Q")
_TWO_U32_LE = struct.Struct("<II")
MAX_CTS_ENTRIES = 8              # NCCL_NET_IB_MAX_RECVS
_MAX_RANK = 1 << 24
_MAX_FIFO_IDX = 1 << 40          # a FIFO counter (one per receive) never gets near this


def parse_cts(payload: bytes) -> list[CtsEntry] | None:
    """The entries of a CTS write, or None if the payload is not one in any known layout."""
    for layout in _CTS_LAYOUTS:
        n, rest = divmod(len(payload), layout.entry_bytes)
        if rest or not 1 <= n <= MAX_CTS_ENTRIES:
            continue
        entries = []
        for base in range(0, len(payload), layout.entry_bytes):
            addr = _U64_LE.unpack_from(payload, base)[0]
            size = layout.size.unpack_from(payload, base + 8)[0]
            rkeys = layout.rkeys.unpack_from(payload, base + layout.rkeys_at)
            nreqs, tag = _TWO_U32_LE.unpack_from(payload, base + layout.nreqs_at)
            idx = _U64_LE.unpack_from(payload, base + layout.idx_at)[0]
            unused = (payload[base + layout.nreqs_at + 8:base + layout.idx_at]
                      + payload[base + layout.idx_at + 8:base + layout.entry_bytes])
            if (nreqs != n or not addr or not rkeys[0] or not 1 <= idx < _MAX_FIFO_IDX or not 0 <= size < 1 << 40
                    or tag >= _MAX_RANK or any(unused)):
                break
            entries.append(CtsEntry(addr, size, tuple(k for k in rkeys if k), nreqs, tag, idx))
        else:
            if len({e.idx for e in entries}) == 1:
                return entries
    return None
