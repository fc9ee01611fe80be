"""Which capture shows which ps-lite node's messages: a node's own capture (taken on the host it runs on, where it
is party to every message it sends or receives) or, failing one, its peers'; and which host a capture was
taken on, by address. The timeline (decoders.timeline)
and the DLC records (analysis.operations) read a node's sends and receipts where it saw them itself."""
from __future__ import annotations

import numpy as np
import pandas as pd


def node_hosts(node_ids: pd.Series, nodes: pd.DataFrame) -> pd.Series:
    """The host of each node id: its address in the nodes table (nodes.parquet: node_id, hostname), so that
    nodes on one host share it; a node the table does not list is a host of its own ("#<id>")."""
    hostname = nodes.drop_duplicates("node_id").set_index("node_id")["hostname"]
    ids = node_ids.astype("Int64")
    known = hostname.reindex(ids.fillna(-1).to_numpy(np.int64)).to_numpy(object)
    own = "#" + ids.astype(str)
    return pd.Series(np.where(pd.isna(known), own.to_numpy(object), known), index=node_ids.index,
                     dtype=object).where(ids.notna())


def vantage_points(messages: pd.DataFrame, nodes: pd.DataFrame) -> pd.DataFrame:
    """(node_id, capture, own): the captures each node's records come from.

    A capture is the own capture of the nodes of one host (`node_hosts`: one node, or the server and worker
    BytePS usually runs side by side) when that host's nodes are the sender or receiver of every ps-lite
    message in it and no other host's are (a message whose sender the decoder could not name counts against
    every host); a node with an own capture is seen only through it, a node without through every capture it
    is party to (its peers')."""
    capture = messages["capture"].astype("category")
    sender = messages["sender_id"].astype("Int64")
    recver = messages["recver_id"].astype("Int64")
    sender_host, recver_host = node_hosts(sender, nodes), node_hosts(recver, nodes)
    party = pd.DataFrame({"capture": pd.concat([capture, capture], ignore_index=True),
                          "node_id": pd.concat([sender, recver], ignore_index=True),
                          "host": pd.concat([sender_host, recver_host], ignore_index=True),
                          # a message within one host (a node's to itself, a server's to its worker) counts once
                          "counted": np.concatenate([np.ones(len(messages), bool),
                                                     (recver_host != sender_host).fillna(True).to_numpy(bool)])
                          }).dropna(subset=["node_id"])
    counts = party[party["counted"]].groupby(["capture", "host"], observed=True).size().rename("messages")
    counts = counts.reset_index()
    per_capture = capture.value_counts()
    counts["in_all"] = counts["messages"].to_numpy() == per_capture.reindex(counts["capture"]).to_numpy()
    candidates = counts.groupby("capture", observed=True)["in_all"].transform("sum")
    counts["own"] = counts["in_all"] & candidates.eq(1)
    seen = party.drop_duplicates(["capture", "node_id"]).merge(counts[["capture", "host", "own"]],
                                                                on=["capture", "host"])
    has_own = seen.groupby("node_id")["own"].transform("any")
    chosen = seen[seen["own"] | ~has_own].sort_values(["node_id", "capture"])
    return pd.DataFrame({"node_id": chosen["node_id"].astype(np.int64).to_numpy(),
                         "capture": chosen["capture"].astype(str).to_numpy(),
                         "own": chosen["own"].to_numpy(bool)})


def capture_hosts(streams: pd.DataFrame) -> pd.Series:
    """capture → the one IP address every connection in it involves (its host), for captures where exactly
    one address does (a capture of a single connection, or of a link between others, has none)."""
    ends = pd.concat([streams[["capture", "src_ip", "flow_id"]].rename(columns={"src_ip": "ip"}),
                      streams[["capture", "dst_ip", "flow_id"]].rename(columns={"dst_ip": "ip"})])
    ends = ends.drop_duplicates()
    per_ip = ends.groupby(["capture", "ip"]).size().rename("streams").reset_index()
    per_capture = streams.groupby("capture").size()
    everywhere = per_ip[per_ip["streams"].to_numpy() == per_capture.reindex(per_ip["capture"]).to_numpy()]
    unique = everywhere.groupby("capture")["ip"].agg(["first", "size"])
    return unique.loc[unique["size"] == 1, "first"]
