"""Which capture shows which ps-lite node's messages: a node's own capture (where it is party to every message)
or, failing one, its peers'. The timeline (decoders.timeline) and the DLC records (analysis.operations) read
a node's sends and receipts where it saw them itself."""
from __future__ import annotations

import numpy as np
import pandas as pd


def vantage_points(messages: pd.DataFrame) -> pd.DataFrame:
    """(node_id, capture, own): the captures each node's records come from.

    A capture is node X's own when X is the sender or receiver of every ps-lite message in it and no other
    node is (a message whose sender the decoder could not name counts against every node); a node with an
    own capture is seen only through it, a node without through every capture it is party to (its peers')."""
    capture = messages["capture"].astype("category")
    sender = messages["sender_id"].astype("Int64")
    # a message a node sent itself counts once
    recver = messages["recver_id"].astype("Int64").mask(sender.eq(messages["recver_id"]).fillna(False))
    party = pd.DataFrame({"capture": pd.concat([capture, capture], ignore_index=True),
                          "node_id": pd.concat([sender, recver], ignore_index=True)}).dropna()
    counts = party.groupby(["capture", "node_id"], observed=True).size().rename("messages").reset_index()
    per_capture = capture.value_counts()
    counts["in_all"] = counts["messages"].to_numpy() == per_capture.reindex(counts["capture"]).to_numpy()
    candidates = counts.groupby("capture", observed=True)["in_all"].transform("sum")
    counts["own"] = counts["in_all"] & candidates.eq(1)
    has_own = counts.groupby("node_id")["own"].transform("any")
    chosen = counts[counts["own"] | ~has_own]
    return pd.DataFrame({"node_id": chosen["node_id"].astype(np.int64).to_numpy(),
                         "capture": chosen["capture"].astype(str).to_numpy(),
                         "own": chosen["own"].to_numpy(bool)})
