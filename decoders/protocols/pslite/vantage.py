"""Which capture shows which ps-lite node's messages: a node's own capture (taken on the host it runs on, where it
is party to every message it sends or receives) or, failing one, its peers'. The timeline (decoders.timeline)
and the DLC records (analysis.operations) read a node's sends and receipts where it saw them itself."""
from __future__ import annotations

import collections
from typing import Mapping, Sequence

import numpy as np

from dlcsniff.decoders.column_values import column_values
from dlcsniff.decoders.protocols.pslite.decoder import SCHEDULER_ID


def _ids(column) -> list[int | None]:
    return [None if value is None else int(value) for value in column_values(column)]


def node_hosts(node_ids: Sequence[int | None], nodes: Mapping) -> list[str | None]:
    """The host of each node id: its address in the nodes table (nodes.parquet: node_id, hostname), so that
    nodes on one host share it; a node the table does not list is a host of its own ("#<id>")."""
    hostname: dict[int, str | None] = {}
    for node_id, host in zip(_ids(nodes["node_id"]), column_values(nodes["hostname"])):
        hostname.setdefault(node_id, host)
    return [None if node_id is None else f"#{node_id}" if hostname.get(node_id) is None else hostname[node_id]
            for node_id in node_ids]


def vantage_points(messages: Mapping, nodes: Mapping) -> dict[str, np.ndarray]:
    """(node_id, capture, own): the captures each node's records come from, by node id and capture (columns by
    name, of ps-lite's messages: capture, sender_id, recver_id).

    A capture is the own capture of the nodes of one host (`node_hosts`: one node, or the server and worker
    BytePS usually runs side by side) when that host's nodes are the sender or receiver of every ps-lite
    message in it and no other host's are (a message whose sender the decoder could not name counts against
    every host); a node with an own capture is seen only through it, a node without through every capture it
    is party to (its peers')."""
    capture = [str(name) for name in column_values(messages["capture"])]
    sender, recver = _ids(messages["sender_id"]), _ids(messages["recver_id"])
    sender_host, recver_host = node_hosts(sender, nodes), node_hosts(recver, nodes)
    # a message within one host (a node's to itself, a server's to its worker) counts once
    party = [(c, node, host, True) for c, node, host in zip(capture, sender, sender_host)] + [
        (c, node, host, host is None or other is None or host != other)
        for c, node, host, other in zip(capture, recver, recver_host, sender_host)]
    party = [row for row in party if row[1] is not None]
    counts = collections.Counter((c, host) for c, _, host, counted in party if counted and host is not None)
    per_capture = collections.Counter(capture)
    in_all = {key for key, n in counts.items() if n == per_capture[key[0]]}
    candidates = collections.Counter(c for c, _ in in_all)
    own = {key for key in in_all if candidates[key[0]] == 1}
    seen: dict[tuple, bool] = {}
    for c, node, host, _ in party:
        if (c, node) not in seen and (c, host) in counts:
            seen[c, node] = (c, host) in own
    has_own = {node for (_, node), is_own in seen.items() if is_own}
    chosen = sorted((node, c, is_own) for (c, node), is_own in seen.items() if is_own or node not in has_own)
    return {"node_id": np.array([node for node, _, _ in chosen], dtype=np.int64),
            "capture": np.array([c for _, c, _ in chosen], dtype=object),
            "own": np.array([is_own for _, _, is_own in chosen], dtype=bool)}


def message_sides(obs: Mapping, messages, nodes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The timeline's hook (decoders.protocols.job_step): which of the observations `obs` (the job's messages, one
    row per capture that saw each; columns by name) are ps-lite's, and of those which are their sender's and their
    receiver's own capture (`vantage_points`). `messages`, `nodes`: the decode tables (pyarrow)."""
    mine = np.array([protocol == "pslite" for protocol in column_values(obs["protocol"])], dtype=bool)
    pslite = [protocol == "pslite" for protocol in column_values(messages["protocol"])]
    own = vantage_points({name: [value for value, mine in zip(column_values(messages[name]), pslite) if mine]
                          for name in ("capture", "sender_id", "recver_id")}, nodes)
    own_keys = {(node, capture) for node, capture, is_own in zip(own["node_id"].tolist(), own["capture"].tolist(),
                                                                 own["own"].tolist()) if is_own}
    captures = column_values(obs["capture"])
    sides = [np.array([(-1 if node is None else node, capture) in own_keys
                       for node, capture in zip(_ids(obs[name]), captures)], dtype=bool)
             for name in ("sender_id", "recver_id")]
    return mine, *sides


def reference_captures(sent: Mapping) -> list[str]:
    """The timeline's hook: the captures of the scheduler's own messages (the job's reference clock)."""
    return [capture for capture, protocol, sender in zip(column_values(sent["capture"]),
                                                         column_values(sent["protocol"]),
                                                         _ids(sent["sender_id"]))
            if protocol == "pslite" and sender == SCHEDULER_ID]
