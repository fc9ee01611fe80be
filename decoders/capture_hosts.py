"""Which host a capture was taken on, by address: the timeline (decoders.timeline) tells a message's send and
receive sides by it where the protocol's decoder could not."""
from __future__ import annotations

import collections
from typing import Mapping

from dlcsniff.decoders.column_values import column_values


def capture_hosts(streams: Mapping) -> dict[str, str]:
    """capture → the one IP address every connection in it involves (its host), for captures where exactly
    one address does (a capture of a single connection, or of a link between others, has none). `streams`: the
    streams table's capture, src_ip, dst_ip and flow_id columns by name."""
    capture, src_ip, dst_ip, flow_id = (column_values(streams[name]) for name in ("capture", "src_ip", "dst_ip",
                                                                                   "flow_id"))
    ends = {(c, ip, flow) for c, src, dst, flow in zip(capture, src_ip, dst_ip, flow_id) for ip in (src, dst)}
    per_ip = collections.Counter((c, ip) for c, ip, _ in ends if c is not None and ip is not None)
    per_capture = collections.Counter(c for c in capture if c is not None)
    everywhere: dict[str, list[str]] = {}
    for (c, ip), n in per_ip.items():
        if n == per_capture[c]:
            everywhere.setdefault(c, []).append(ip)
    return {c: found[0] for c, found in everywhere.items() if len(found) == 1}
