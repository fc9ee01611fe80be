"""NCCL collective operations inferred from NCCL's data transfers, for the socket transport
(decoders.protocols.nccl_socket) and the IB transport over RoCE (decoders.protocols.roce).

They are INFERRED: NCCL puts no collective kind, sequence number or rank on its data path. A node is an IP address (ranks sharing one, on loopback or
behind one NIC, are merged). Each node's transfers, sent and received, over all its NCCL connections, are
cut into operations wherever the node's traffic pauses for more than `idle_gap_ns`; operations closer
together than that merge into one. Only nodes seen both sending and receiving are segmented (a node seen
from a neighbour's capture shows only part of its traffic). An operation that sends about as much as it
receives is taken for a ring all-reduce (Simple protocol: 2(k-1) chunks of N/k per rank each way), so
tensor_bytes = sent * k / (2(k-1)); volume alone cannot tell it from a ring all-gather, reduce-scatter or a
middle rank of a ring broadcast. Anything else is kind "unknown". k is the number of nodes in the capture
unless given.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlcsniff.decoders.protocols.base import frame_rows

if TYPE_CHECKING:
    import pandas as pd

# Silence on all of a node's NCCL connections that ends an operation. A ring step waits only for the
# neighbour's previous step (microseconds on a network), while operations are separated by computation.
IDLE_GAP_NS = 1_000_000
# |sent - received| within this fraction of the larger: a ring all-reduce (chunks differ by rounding only).
RING_BALANCE = 0.05


def collectives_from_transfers(transfers: pd.DataFrame, *, protocol: str, idle_gap_ns: int = IDLE_GAP_NS,
                               world_size: int | None = None) -> pd.DataFrame:
    """Operations inferred from NCCL data transfers (see the module docstring): one row per operation per
    node, decoders.collectives.COLUMNS plus `local_address` (the node).

    `transfers`: one row per transfer with `sender`, `receiver` (node addresses), `sender_rank`,
    `receiver_rank` (null when unknown), `ts_first_ns`, `ts_last_ns`, `size_bytes`, `payload_bytes` (null:
    taken as `size_bytes`) and `complete`.
    """
    # pandas only where there is NCCL traffic: the decoders stay quick to import for the others
    import numpy as np
    import pandas as pd

    from dlcsniff.decoders.collective_ops import COLUMNS, collectives_from_messages

    columns = [*COLUMNS, "local_address"]
    # A node's rank, wherever one of its transfers names it (RoCE: a CTS tag names only the sender).
    named = pd.concat([transfers[["sender", "sender_rank"]].set_axis(["node", "rank"], axis=1),
                       transfers[["receiver", "receiver_rank"]].set_axis(["node", "rank"], axis=1)])
    named = named.dropna().drop_duplicates().drop_duplicates("node", keep=False)
    rank_of = dict(zip(named["node"], named["rank"].astype("int64")))
    transfers = transfers.assign(sender_rank=transfers["sender"].map(rank_of).astype("Int64"),
                                 receiver_rank=transfers["receiver"].map(rank_of).astype("Int64"))
    nodes = pd.concat([transfers["sender"], transfers["receiver"]]).nunique()
    k = world_size if world_size is not None else nodes
    views = pd.concat([
        transfers.assign(node=transfers["sender"], local_rank=transfers["sender_rank"],
                         peer_rank=transfers["receiver_rank"], outgoing=True),
        transfers.assign(node=transfers["receiver"], local_rank=transfers["receiver_rank"],
                         peer_rank=transfers["sender_rank"], outgoing=False)], ignore_index=True)
    directions = views.groupby("node")["outgoing"].nunique()
    views = views[views["node"].isin(directions.index[directions == 2])]
    if views.empty or k < 2:
        return pd.DataFrame({name: pd.Series(dtype="object") for name in columns})
    views = views.sort_values(["node", "ts_first_ns"], kind="stable")
    end_so_far_ns = views.groupby("node", sort=False)["ts_last_ns"].cummax()
    previous_end_ns = end_so_far_ns.groupby(views["node"], sort=False).shift()
    starts = previous_end_ns.isna() | (views["ts_first_ns"] - previous_end_ns > idle_gap_ns)
    seq = starts.astype("int64").groupby(views["node"], sort=False).cumsum() - 1
    payload = views["payload_bytes"].astype("Int64").fillna(views["size_bytes"].astype("Int64"))
    operation = [views["node"], seq]
    sent = payload.where(views["outgoing"], 0).groupby(operation).transform("sum")
    received = payload.where(~views["outgoing"], 0).groupby(operation).transform("sum")
    ring = (sent > 0) & (received > 0) & ((sent - received).abs() <= RING_BALANCE * np.maximum(sent, received))
    messages = views.assign(protocol=protocol, collective=np.where(ring, "all_reduce", "unknown"), seq=seq,
                            algorithm=np.where(ring, "ring", None), tag=None, world_size=k, payload_bytes=payload)
    out = [collectives_from_messages(group).assign(local_address=node)
           for node, group in messages.groupby("node", sort=False)]
    return pd.concat(out, ignore_index=True)[columns]


def collective_rows(transfers: list[dict], *, protocol: str, idle_gap_ns: int, world_size: int | None) -> list[dict]:
    """`collectives_from_transfers` as CaptureRows.collectives rows (none without transfers)."""
    if not transfers:
        return []
    import pandas as pd
    return frame_rows(collectives_from_transfers(pd.DataFrame(transfers), protocol=protocol,
                                                 idle_gap_ns=idle_gap_ns, world_size=world_size))
