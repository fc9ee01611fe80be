"""Which capture shows which ps-lite node's messages: a node's own capture (taken on the host it runs on, where it
is party to every message it sends or receives) or, failing one, its peers'. The timeline (decoders.timeline)
and the DLC records (analysis.operations) read a node's sends and receipts where it saw them itself."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlcsniff.decoders.arrow_without_pandas import pandas
from dlcsniff.decoders.protocols.pslite.decoder import SCHEDULER_ID

if TYPE_CHECKING:
    import pandas as pd


def node_hosts(node_ids: pd.Series, nodes: pd.DataFrame) -> pd.Series:
    """The host of each node id: its address in the nodes table (nodes.parquet: node_id, hostname), so that
    nodes on one host share it; a node the table does not list is a host of its own ("#<id>")."""
    pd = pandas()
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
    pd = pandas()
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



def message_sides(obs: pd.DataFrame, messages: pd.DataFrame, nodes: pd.DataFrame
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The timeline's hook (decoders.protocols.job_step): which of the observations `obs` (the job's messages, one
    row per capture that saw each) are ps-lite's, and of those which are their sender's and their receiver's
    own capture (`vantage_points`)."""
    pd = pandas()
    mine = (obs["protocol"] == "pslite").to_numpy(bool)
    own = vantage_points(messages[(messages["protocol"] == "pslite").to_numpy(bool)], nodes)
    own = own[own["own"]]
    own_keys = pd.MultiIndex.from_arrays([own["node_id"].to_numpy(np.int64), own["capture"].to_numpy(object)])
    sides = [pd.MultiIndex.from_arrays([obs[node].fillna(-1).to_numpy(np.int64), obs["capture"].to_numpy(object)]
                                       ).isin(own_keys) for node in ("sender_id", "recver_id")]
    return mine, *sides


def reference_captures(sent: pd.DataFrame) -> pd.Series:
    """The timeline's hook: the captures of the scheduler's own messages (the job's reference clock)."""
    return sent.loc[(sent["protocol"] == "pslite") & (sent["sender_id"] == SCHEDULER_ID), "capture"]
