"""Per host and direction, what limited its link: retransmissions, zero windows, RoCE NAKs and CNPs, a rate far below
its peers'.

Rate: a link (source host → destination host) is measured on its large messages (LARGE_MESSAGE_BYTES and more,
whose first-to-last-byte time is transfer, not latency), read at the receiver when its capture saw them (what
arrived is what the link let through: a shaper on the wire's far side reaches the sender's capture only as
TCP's pacing), else at the sender: its rate is their bytes / the union of their transfer intervals, its best
rate the 90th percentile of the messages' own rates. A link is slow when both are below SLOW_RATE_FRACTION of
the job's upper quartile of links (the best rate keeps a link whose receiver was only slow to read some of its
messages from being called slow). The healthy jobs here have no link below 0.26 of it by both measures, a link
shaped to 100 Mbit/s among 1.5-2 Gbit/s ones is at 0.07-0.12. A host's rate in one direction is that of all its
links in that direction together, beside the median of the other hosts' (peers_rate_gb_per_s).

One slow link has two suspects, the sender's way out and the receiver's way in; slow links sharing a host are
explained by that host. `explained_by` names, for each end of a slow link, the host of a smallest set of hosts
covering all the slow links (greedy: the host with most slow links first; both ends on a tie): a host whose
link is slowed both ways slows its ring neighbours' links to it and from it, and is blamed for them. A host's
direction is limited by its rate when it is blamed for a slow link that way.

Retransmissions: payload bytes a capture saw again (decoders/tcp.py), per TCP direction the most any capture saw;
a direction is limited by them above RETRANSMIT_FRACTION of its bytes and RETRANSMIT_MIN_BYTES (on the healthy
jobs here at most 0.11 % of a host direction's bytes were seen again, or 745 bytes, 1.65 %, of mxnet_noise's
TLS side traffic; but 1.3-1.7 % of three of mxnet_sync_large's, 0.5 MB, seen alike at both ends: real
retransmissions, which `links` names).
Zero windows: the segments in which a TCP receiver advertised a zero window (decoders/tcp.py, as Wireshark's
tcp.analysis.zero_window) and how long it kept it closed, per stream the most any capture saw; they held the data
coming to it: its recv direction and its peer's send direction. A direction is limited by them when its time at
zero window reaches ZERO_WINDOW_MIN_NS (the healthy jobs here: one zero window, closed for 82 µs, in pcaps/gloo;
a reader that stopped reading three times for 0.4 s, pcaps/tcp_zero_window: 0.94 s).
RoCE: any NAK, CNP or retransmitted packet limits it (a lossless fabric has none).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.names import node_labels
from dlcsniff.analysis.spread import others_median
from dlcsniff.analysis.stats_schema import LINK_HEALTH

LINK_HEALTH_COLUMNS = LINK_HEALTH.names
LARGE_MESSAGE_BYTES = 65536
SLOW_RATE_FRACTION = 1 / 6
REFERENCE_QUANTILE = 0.75       # the job's links that set the reference rate: its upper quartile
BEST_RATE_QUANTILE = 0.9        # a link's best rate: this quantile of its messages' own rates
RETRANSMIT_FRACTION = 0.01
RETRANSMIT_MIN_BYTES = 65536     # fewer bytes seen again limit no link (a short connection's lost segment)
ZERO_WINDOW_MIN_NS = 10_000_000
SEND, RECV = "send", "recv"
STREAM_COLUMNS = ("capture", "src_ip", "src_port", "dst_ip", "dst_port", "protocol", "bytes", "retransmitted_bytes",
                  "rank", "src_rank", "node_id", "naks", "cnp", "retransmitted_packets", "zero_windows",
                  "zero_window_ns")
EVENT_COLUMNS = ("connection", "protocol", "size_bytes", "send_ts_first_aligned_ns", "send_ts_last_aligned_ns",
                 "recv_ts_first_aligned_ns", "recv_ts_last_aligned_ns")
COUNTS = ("bytes", "retransmitted_bytes", "naks", "cnp", "retransmitted_packets")
ZERO_WINDOW_COUNTS = ("zero_windows", "zero_window_ns")


def connection_hosts(connection: pd.Series, protocol: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Source and destination address of each "src_ip:port>dst_ip:port" (RoCE: "src_ip>dst_ip#qp<n>")."""
    ends = connection.astype(str).str.replace(r"#.*$", "", regex=True).str.extract(r"^(.*)>(.*)$")
    tcp = (protocol.astype(object) != "roce").to_numpy()
    src, dst = (np.where(tcp, end.str.replace(r":\d+$", "", regex=True), end).astype(object)
                for end in (ends[0], ends[1]))
    return src, dst


def host_names(streams: pd.DataFrame) -> pd.Series:
    """A name per host address, as analysis/names.py names nodes: "rank 2" (Gloo, NCCL: the sending side's
    rank), the ps-lite node ("worker rank 0", "scheduler"), else the address itself."""
    rank = streams["rank"].astype("Float64").fillna(streams["src_rank"].astype("Float64"))
    node = streams["node_id"].astype("Float64")
    named = np.where(rank.notna().to_numpy(), "rank " + rank.fillna(0).astype(np.int64).astype(str).to_numpy(object),
                     np.where(node.notna().to_numpy(), node_labels(node.fillna(0).astype(np.int64).to_numpy()), None))
    found = pd.Series(named, index=streams["src_ip"].astype(object).to_numpy()).dropna()
    found = found[~found.index.duplicated()]
    hosts = pd.unique(np.concatenate([streams["src_ip"].astype(object), streams["dst_ip"].astype(object)]))
    return pd.Series(hosts, index=hosts).where(~pd.Index(hosts).isin(found.index), found.reindex(hosts).to_numpy())


def large_transfers(events: pd.DataFrame) -> pd.DataFrame:
    """The job's large messages: src_ip, dst_ip, bytes, first_ns, last_ns (the receiver's view, else the
    sender's)."""
    large = events[(events["size_bytes"].astype("Float64").fillna(0) >= LARGE_MESSAGE_BYTES).to_numpy()]

    def ns(name: str) -> np.ndarray:
        return large[name].astype("Float64").to_numpy(np.float64, na_value=np.nan)

    received = ~np.isnan(ns("recv_ts_first_aligned_ns")) & ~np.isnan(ns("recv_ts_last_aligned_ns"))
    first = np.where(received, ns("recv_ts_first_aligned_ns"), ns("send_ts_first_aligned_ns"))
    last = np.where(received, ns("recv_ts_last_aligned_ns"), ns("send_ts_last_aligned_ns"))
    src, dst = connection_hosts(large["connection"], large["protocol"])
    frame = pd.DataFrame({"src_ip": src, "dst_ip": dst, "bytes": large["size_bytes"].to_numpy(np.float64),
                          "first_ns": first, "last_ns": last})
    return frame[~np.isnan(first) & ~np.isnan(last)]


def union_ns(frame: pd.DataFrame, key: list[str]) -> pd.Series:
    """Per key, the length of the union of its rows' [first_ns, last_ns] intervals."""
    ordered = frame.sort_values([*key, "first_ns"], kind="stable")
    reach = ordered.groupby(key, sort=False)["last_ns"].cummax()
    before = reach.groupby([ordered[name] for name in key], sort=False).shift(1).fillna(-np.inf)
    start = np.maximum(ordered["first_ns"].to_numpy(), before.to_numpy())
    covered = np.maximum(ordered["last_ns"].to_numpy() - start, 0)
    return pd.Series(covered, index=ordered.index).groupby([ordered[name] for name in key]).sum()


def _rate(volume: pd.Series, busy: pd.Series) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(busy.to_numpy() > 0, volume.to_numpy() / busy.to_numpy(), np.nan)


def link_rates(transfers: pd.DataFrame) -> pd.DataFrame:
    """Per link (src_ip, dst_ip): its large messages' bytes, transfer time (busy_ns), rate and best rate (GB/s),
    and whether it is slow (see the module doc)."""
    key = ["src_ip", "dst_ip"]
    volume = transfers.groupby(key)["bytes"].sum()
    busy = union_ns(transfers, key).reindex(volume.index)
    own = transfers.assign(rate=_rate(transfers["bytes"], transfers["last_ns"] - transfers["first_ns"]))
    best = own.groupby(key)["rate"].quantile(BEST_RATE_QUANTILE).reindex(volume.index)
    links = pd.DataFrame({"bytes": volume, "busy_ns": busy, "rate_gb_per_s": _rate(volume, busy),
                          "best_rate_gb_per_s": best}).reset_index()
    slow = np.ones(len(links), dtype=bool)
    for name in ("rate_gb_per_s", "best_rate_gb_per_s"):
        rates = links[name].to_numpy(np.float64)
        reference = np.nanquantile(rates, REFERENCE_QUANTILE) if np.isfinite(rates).any() else np.nan
        with np.errstate(invalid="ignore"):
            slow &= rates < SLOW_RATE_FRACTION * reference
    return links.assign(slow=slow)


def host_rates(transfers: pd.DataFrame) -> pd.DataFrame:
    """Per (ip, direction): the same over all the host's links in that direction."""
    both = pd.concat([transfers.assign(ip=transfers["src_ip"], direction=SEND),
                      transfers.assign(ip=transfers["dst_ip"], direction=RECV)], ignore_index=True)
    key = ["ip", "direction"]
    volume = both.groupby(key)["bytes"].sum()
    busy = union_ns(both, key).reindex(volume.index)
    return pd.DataFrame({"rated_bytes": volume, "busy_ns": busy, "rate_gb_per_s": _rate(volume, busy)}).reset_index()


def stream_counts(streams: pd.DataFrame) -> pd.DataFrame:
    """Per (ip, direction): bytes, retransmitted bytes, NAKs, CNPs and retransmitted RoCE packets of its
    streams, and the zero windows that held it (and their time), each stream counted once (the most any capture
    of it saw)."""
    key = ["src_ip", "src_port", "dst_ip", "dst_port"]
    names = [*COUNTS, *ZERO_WINDOW_COUNTS]
    frame = streams.assign(**{name: streams[name].astype("Float64").fillna(0).astype(np.float64) for name in names},
                           src_port=streams["src_port"].astype("Float64").fillna(-1),
                           dst_port=streams["dst_port"].astype("Float64").fillna(-1))
    per_stream = frame.groupby(key, dropna=False)[names].max().reset_index()
    counted = per_stream.assign(**{name: 0.0 for name in ZERO_WINDOW_COUNTS})
    # a stream's zero windows were advertised by its sender, holding what its peer sends it
    held = per_stream.assign(**{name: 0.0 for name in COUNTS})
    both = pd.concat([counted.assign(ip=per_stream["src_ip"], direction=SEND),
                      counted.assign(ip=per_stream["dst_ip"], direction=RECV),
                      held.assign(ip=per_stream["src_ip"], direction=RECV),
                      held.assign(ip=per_stream["dst_ip"], direction=SEND)], ignore_index=True)
    return both.groupby(["ip", "direction"])[names].sum().reset_index()


def slow_link_cover(slow: pd.DataFrame) -> dict[tuple[str, str], list[str]]:
    """(ip, direction) of each end of each slow link → the hosts of a smallest cover holding that link."""
    remaining = list(zip(slow["src_ip"], slow["dst_ip"]))
    cover: dict[tuple[str, str], list[str]] = {}
    while remaining:
        ends = pd.Series([ip for link in remaining for ip in link]).value_counts()
        chosen = set(ends.index[ends == ends.max()])
        for src, dst in remaining:
            holders = sorted({src, dst} & chosen)
            if holders:
                cover[(src, SEND)] = cover[(dst, RECV)] = holders
        remaining = [(src, dst) for src, dst in remaining if not {src, dst} & chosen]
    return cover


def link_health(streams: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """LINK_HEALTH_COLUMNS: one row per host and direction (see the module doc); limited_by names what limited
    it ("" when nothing did)."""
    if not len(streams):
        return LINK_HEALTH.schema.empty_table().to_pandas()
    names = host_names(streams)
    transfers = large_transfers(events)
    links = link_rates(transfers)
    table = stream_counts(streams).merge(host_rates(transfers), on=["ip", "direction"], how="left")
    rate = table["rate_gb_per_s"].to_numpy(np.float64)
    peers = others_median(rate, table["direction"].to_numpy(object))
    slow = links[links["slow"].to_numpy()]
    cover = slow_link_cover(slow)
    keys = list(zip(table["ip"], table["direction"]))
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = np.where(table["bytes"] > 0, table["retransmitted_bytes"] / table["bytes"], 0.0)
    blamed = np.array([ip in cover.get(key, ()) for key, ip in zip(keys, table["ip"])], dtype=bool)
    checks = {"rate": blamed, "retransmissions": (fraction > RETRANSMIT_FRACTION)
              & (table["retransmitted_bytes"].to_numpy() >= RETRANSMIT_MIN_BYTES),
              "zero_windows": table["zero_window_ns"].to_numpy() >= ZERO_WINDOW_MIN_NS,
              "naks": table["naks"].to_numpy() > 0, "cnps": table["cnp"].to_numpy() > 0,
              "roce_retransmissions": table["retransmitted_packets"].to_numpy() > 0}
    limited_by = pd.Series("", index=table.index, dtype=object)
    for name, hit in checks.items():
        limited_by = limited_by.where(~hit, limited_by.where(limited_by == "", limited_by + ", ") + name)
    link_names = names.reindex(slow["src_ip"]).to_numpy(object) + "→" + names.reindex(slow["dst_ip"]).to_numpy(object)
    slow_ends = pd.DataFrame({"ip": np.concatenate([slow["src_ip"], slow["dst_ip"]]),
                              "direction": [SEND] * len(slow) + [RECV] * len(slow),
                              "link": np.concatenate([link_names, link_names])})
    slow_links = slow_ends.groupby(["ip", "direction"])["link"].agg(", ".join)
    out = pd.DataFrame({
        "node": names.reindex(table["ip"]).to_numpy(object), "ip": table["ip"].to_numpy(object),
        "direction": table["direction"].to_numpy(object), "bytes": table["bytes"].to_numpy(np.int64),
        "rated_bytes": table["rated_bytes"].fillna(0).to_numpy(np.int64),
        "busy_ns": pd.array(table["busy_ns"].round(), dtype="Int64"), "rate_gb_per_s": rate,
        "peers_rate_gb_per_s": peers, "retransmitted_bytes": table["retransmitted_bytes"].to_numpy(np.int64),
        "retransmitted_fraction": fraction, "zero_windows": table["zero_windows"].to_numpy(np.int64),
        "zero_window_s": table["zero_window_ns"].to_numpy(np.float64) / 1e9, "naks": table["naks"].to_numpy(np.int64),
        "cnps": table["cnp"].to_numpy(np.int64),
        "roce_retransmitted_packets": table["retransmitted_packets"].to_numpy(np.int64),
        "slow_links": slow_links.reindex(pd.MultiIndex.from_tuples(keys)).fillna("").to_numpy(object),
        "explained_by": [", ".join(names.get(ip, ip) for ip in cover.get(key, ())) for key in keys],
        "limited_by": limited_by.to_numpy(object),
    })
    return out.sort_values(["node", "direction"], ignore_index=True)[list(LINK_HEALTH_COLUMNS)]
