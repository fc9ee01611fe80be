"""Collective operations rebuilt from collective-library message rows: one row per operation per capture.

`collectives_from_messages(messages)` is a pure function over a messages DataFrame. It needs, per row:
`protocol`, `collective` (kind, or "p2p" for send/recv), `seq` (the collective's sequence number in its
group; ignored for p2p), `tag` (p2p: the user's tag), `outgoing` (sent by the capturing node), `peer_rank`
(the other end, null when unknown), `world_size`, `ts_first_ns`, `ts_last_ns`, `size_bytes` (wire bytes
of the message: headers + payload), `payload_bytes` (tensor bytes carried) and `complete`; optionally
`capture`, `pg` (process group), `local_rank`, `opcode` and `algorithm` (else the library's default for
the kind, `DEFAULT_ALGORITHMS`).

A send/recv is marked on the wire by one data message and its notifications (Gloo: SEND_UNBOUND_BUFFER,
NOTIFY_SEND_READY from the sender, NOTIFY_RECV_READY from the receiver; without an opcode, by the message
alone). Its `seq` is its index among the operations of its kind between a pair with one tag (`tag`): when
the capture holds as many messages of each opcode, the i-th of each belongs to the i-th operation (gloo
pairs them in order); when it lost some, operations are told apart in time (see `_number_p2p`). Its
tensor_bytes is the length the messages state (the data message's, else the sender's notification, else
the receiver's), so a lost data message does not make it empty.

tensor_bytes is the tensor recovered from the traffic volume S (payload sent) and R (received), k ranks:
ring all-reduce moves 2(k-1)/k of the tensor each way, so N = (S+R)/2 * k / (2(k-1)); all-to-all and
ring all-gather move (k-1)/k of the whole (per-rank input, resp. gathered output); a broadcast's every
message is the tensor; reduce, gather and scatter end with one chunk of N/k per rank (the largest
message); send/recv carry N. Sizes follow nccl-tests: all_gather and gather count the gathered output,
scatter the scattered input, all_to_all one rank's input. These volume estimates assume every message was
captured and chunks of equal size; Gloo's job step (decoders.protocols.gloo.job) replaces them with the tensor
its algorithm model fits to what the messages state and the TCP sequence space counts (decoders.protocols.gloo.model).
"""
from __future__ import annotations

import numpy as np

from dlcsniff.decoders.arrow_without_pandas import pandas

pd = pandas()

COLUMNS = ["capture", "protocol", "pg", "kind", "seq", "world_size", "local_rank", "ts_first_ns", "ts_last_ns",
           "wire_bytes_sent", "wire_bytes_received", "payload_bytes_sent", "payload_bytes_received",
           "tensor_bytes", "peers", "algorithm", "messages", "complete", "tag"]
P2P = "p2p"
# The algorithms the library runs for each kind (Gloo as PyTorch calls it: gloo/allreduce.cc ring, ...).
DEFAULT_ALGORITHMS = {
    "gloo": {"all_reduce": "ring", "all_to_all": "pairwise", "all_gather": "ring", "broadcast": "binomial_tree",
             "reduce": "ring_reduce_scatter", "gather": "direct", "scatter": "direct", "barrier": "dissemination",
             "send": "p2p", "recv": "p2p"},
}
_P2P_DATA_OPCODE = "SEND_UNBOUND_BUFFER"
_P2P_OPERATION_OPCODES = (_P2P_DATA_OPCODE, "NOTIFY_SEND_READY", "NOTIFY_RECV_READY")
# One operation: its group, kind and sequence number, plus (send/recv) the peer and tag.
_OPERATION = ["capture", "protocol", "pg", "kind", "seq", "_p2p_peer", "_p2p_tag"]


def _sorted_unique(ranks: pd.Series) -> list[int]:
    return sorted({int(rank) for rank in ranks.dropna()})


def _number_p2p(p2p: pd.DataFrame) -> pd.DataFrame:
    """kind send/recv, and seq = the operation's index among those of its kind, peer and tag.

    With as many messages of each opcode, the i-th of each opcode is the i-th operation. Otherwise (the
    capture lost some) in time: a send's or recv's messages all come before those of the next one on the
    same peer and tag (a blocking call returns once its data went), so an operation ends with its data
    message, or where an opcode it already has comes again."""
    # The node that sends a NOTIFY_RECV_READY is the one receiving the data.
    sends_data = p2p["outgoing"].astype(bool) != (p2p["opcode"] == "NOTIFY_RECV_READY")
    p2p = p2p.assign(kind=np.where(sends_data, "send", "recv"),
                     _p2p_peer=p2p["peer_rank"].astype("Int64").astype("string").fillna("?"),
                     _p2p_tag=p2p["tag"].astype("Int64"))
    p2p = p2p.sort_values("ts_first_ns", kind="stable")
    keys = ["capture", "protocol", "pg", "kind", "_p2p_peer", "_p2p_tag"]
    seq = p2p.groupby([*keys, "opcode"], dropna=False, sort=False).cumcount()
    for _, group in p2p.groupby(keys, dropna=False, sort=False):
        counts = group["opcode"].value_counts()
        if group["opcode"].isna().any() or (len(counts) == len(_P2P_OPERATION_OPCODES) and counts.nunique() == 1):
            continue
        index, seen = -1, set()
        for row, opcode in zip(group.index, group["opcode"]):
            if index < 0 or opcode in seen or _P2P_DATA_OPCODE in seen:
                index, seen = index + 1, set()
            seen.add(opcode)
            seq[row] = index
    return p2p.assign(seq=seq)


def collectives_from_messages(messages: pd.DataFrame) -> pd.DataFrame:
    """One row per collective (or send/recv) operation per capture; columns `COLUMNS`."""
    df = messages[messages["collective"].notna()]
    if df.empty:
        return pd.DataFrame({name: pd.Series(dtype="object") for name in COLUMNS})
    df = df.assign(**{name: df[name] if name in df.columns else None
                      for name in ("capture", "pg", "local_rank", "opcode", "algorithm")})
    df = df.assign(capture=df["capture"].astype("string").fillna(""), pg=df["pg"].astype("string").fillna(""),
                   kind=df["collective"], _p2p_peer="", _p2p_tag=pd.array([pd.NA] * len(df), dtype="Int64"))
    is_p2p = df["collective"] == P2P
    if is_p2p.any():
        marks = df["opcode"].isna() | df["opcode"].isin(_P2P_OPERATION_OPCODES)
        p2p = _number_p2p(df[is_p2p & marks])
        df = pd.concat([df[~is_p2p], p2p], ignore_index=True)
    outgoing = df["outgoing"].astype("boolean")
    sent, received = outgoing.fillna(False), (~outgoing).fillna(False)
    stated = df["length_bytes"] if "length_bytes" in df.columns else pd.Series(np.nan, index=df.index)
    df = df.assign(_wire_sent=df["size_bytes"].where(sent, 0), _wire_received=df["size_bytes"].where(received, 0),
                   _payload_sent=df["payload_bytes"].where(sent, 0),
                   _payload_received=df["payload_bytes"].where(received, 0),
                   **{f"_stated_{opcode}": stated.where(df["opcode"] == opcode) for opcode in _P2P_OPERATION_OPCODES})
    out = df.groupby(_OPERATION, sort=False, dropna=False).agg(
        world_size=("world_size", "max"),
        local_rank=("local_rank", "first"),
        ts_first_ns=("ts_first_ns", "min"),
        ts_last_ns=("ts_last_ns", "max"),
        wire_bytes_sent=("_wire_sent", "sum"),
        wire_bytes_received=("_wire_received", "sum"),
        payload_bytes_sent=("_payload_sent", "sum"),
        payload_bytes_received=("_payload_received", "sum"),
        max_payload_bytes=("payload_bytes", "max"),
        peers=("peer_rank", _sorted_unique),
        algorithm=("algorithm", "first"),
        messages=("size_bytes", "size"),
        complete=("complete", "all"),
        **{f"_stated_{opcode}": (f"_stated_{opcode}", "max") for opcode in _P2P_OPERATION_OPCODES},
    ).reset_index()
    default = pd.Series([DEFAULT_ALGORITHMS.get(protocol, {}).get(kind)
                         for protocol, kind in zip(out["protocol"], out["kind"])], index=out.index, dtype="object")
    out["algorithm"] = out["algorithm"].where(out["algorithm"].notna(), default)
    k = out["world_size"].astype("float64")
    k = k.where(k.notna(), out["peers"].map(len).astype("float64") + 1)
    out["world_size"] = k.astype("Int64")
    out["tensor_bytes"] = _tensor_bytes(out, k)
    out["seq"] = out["seq"].astype("Int64")
    out["tag"] = out["_p2p_tag"].astype("Int64")
    out["capture"] = out["capture"].replace("", None)
    out["pg"] = out["pg"].replace("", None)
    return out[COLUMNS].sort_values(["capture", "ts_first_ns"], kind="stable").reset_index(drop=True)


def _tensor_bytes(out: pd.DataFrame, k: pd.Series) -> pd.Series:
    sent = out["payload_bytes_sent"].astype("float64")
    received = out["payload_bytes_received"].astype("float64")
    largest = out["max_payload_bytes"].astype("float64")
    kind = out["kind"]
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = np.select(
            [kind == "all_reduce", kind.isin(["all_to_all", "all_gather"]), kind == "broadcast",
             kind.isin(["reduce", "gather", "scatter"]), kind.isin(["send", "recv"]), kind == "barrier"],
            [(sent + received) / 2 * k / (2 * (k - 1)), (sent + received) / 2 * k / (k - 1), largest,
             largest * k, sent + received, 0.0],
            default=np.nan)
    # send/recv: the length its messages state, where the capture kept one of them.
    stated = out[[f"_stated_{opcode}" for opcode in _P2P_OPERATION_OPCODES]].bfill(axis=1).iloc[:, 0]
    estimate = np.where(kind.isin(["send", "recv"]) & stated.notna(), stated, estimate)
    estimate = np.where(np.isfinite(estimate), np.round(estimate), np.nan)
    return pd.Series(estimate, index=out.index).astype("Int64")
