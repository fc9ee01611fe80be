"""Which host a capture was taken on, by address: the timeline (decoders.timeline) tells a message's send and
receive sides by it where the protocol's decoder could not."""
from __future__ import annotations

from dlcsniff.decoders.arrow_without_pandas import pandas

pd = pandas()


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
