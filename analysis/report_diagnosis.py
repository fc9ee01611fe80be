"""The report's opening: the diagnosis (stragglers, hangs, limited links; analysis/diagnosis.py) and the network
behaviour in tables (analysis/network_behaviour.py), and the figure of the ranks' arrival lags."""
from __future__ import annotations

import html

import numpy as np
from matplotlib.figure import Figure

from dlcsniff.analysis.display import human_bytes
from dlcsniff.analysis.diagnosis import operation_label, who_label
from dlcsniff.analysis.link_health import ZERO_WINDOW_MIN_NS
from dlcsniff.analysis.names import capture_label
from dlcsniff.analysis.network_behaviour import NetworkBehaviour
from dlcsniff.analysis.stragglers import late_threshold_ns

MS = 1e6


def _grid(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    head = "<tr>" + "".join(f"<th>{html.escape(name)}</th>" for name in header) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td class='text'>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in rows)
    return f"<table>{head}{body}</table>"


def _fixed(value, digits: int = 3) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:,.{digits}f}"


def diagnosis_section(network: NetworkBehaviour) -> list[str]:
    """"Diagnosis": the verdict, then a table per finding (stragglers, hangs, links)."""
    diagnosis = network.diagnosis
    parts = ["<section id='diagnosis'><h2>Diagnosis</h2>", "<ul>" + "".join(
        f"<li>{html.escape(line)}</li>" for line in diagnosis.verdict()) + "</ul>"]
    if len(diagnosis.stragglers):
        parts += ["<h3>Stragglers</h3>", _grid(
            ("who", "operation", "late s", "threshold s", "capture"),
            [(who_label(row["role"], row["rank"]), operation_label(row), _fixed(row["late_s"]),
              _fixed(row["threshold_s"]), ", ".join(capture_label(name, diagnosis.captures)
                                                   for name in str(row["capture"]).split(", ")))
             for row in diagnosis.stragglers.to_dict(orient="records")])]
    if len(diagnosis.hangs):
        parts += ["<h3>Hangs</h3>", _grid(
            ("who", "never joined", "waiting", "waited s", "captures go on s", "threshold s"),
            [(who_label(row["role"], row["rank"]), operation_label(row), ", ".join(map(str, row["waiting_ranks"])),
              _fixed(row["waited_s"]), _fixed(row["since_s"]), _fixed(row["threshold_s"]))
             for row in diagnosis.hangs.to_dict(orient="records")])]
    if len(diagnosis.links):
        parts += ["<h3>Limited links</h3>", _grid(
            ("host", "direction", "limited by", "rate Gbit/s", "peers' Gbit/s", "slow links", "explained by",
             "retransmitted %", "zero windows", "at zero window s", "NAKs", "CNPs"),
            [(row.node, row.direction, row.limited_by, _fixed(row.rate_gb_per_s * 8),
              _fixed(row.peers_rate_gb_per_s * 8), row.slow_links, row.explained_by,
              _fixed(row.retransmitted_fraction * 100, 2), f"{row.zero_windows:,}", _fixed(row.zero_window_s, 2),
              f"{row.naks:,}", f"{row.cnps:,}")
             for row in diagnosis.links.itertuples()])]
    parts.append("<p>A rank is late when it entered an operation, and left its previous one, later than the "
                 "others by more than the threshold: 20 of the job's robust standard deviations of arrival lags, "
                 "and at least 0.25 s. A link is slow below a sixth of the job's upper quartile of link rates, "
                 "both overall and at its best; limited by zero windows when its receiver kept its window at zero "
                 f"for {ZERO_WINDOW_MIN_NS / 1e6:g} ms or more.</p></section>")
    return parts


def network_section(network: NetworkBehaviour) -> list[str]:
    """"Network behaviour": arrival spread and completion, burstiness and ON/OFF per host, incast, sizes, RoCE."""
    summary = network.summary()
    spread, completion = summary["arrival_spread_ns"], summary["completion_ns"]
    rows = [("arrival spread across ranks, p50 / max ms", "n/a" if spread is None else
             f"{spread['p50'] / MS:,.3f} / {spread['max'] / MS:,.3f}"),
            ("completion once all ranks were in, p50 / max ms", "n/a" if completion is None else
             f"{completion['p50'] / MS:,.3f} / {completion['max'] / MS:,.3f}"),
            ("iteration period ms", "n/a" if summary["iteration_period_ns"] is None else
             f"{summary['iteration_period_ns'] / MS:,.3f}"),
            ("largest incast fan-in", "n/a" if summary["max_fan_in"] is None else str(summary["max_fan_in"]))]
    table = "<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td class='text'>{html.escape(v)}</td></tr>"
                                for k, v in rows) + "</table>"
    shape = network.burstiness.pivot_table(index=["node", "direction"], columns="bin_ns", values="peak_to_mean")
    on_off = network.on_off.set_index(["node", "direction"])
    per_host = [(node, direction, *(_fixed(shape.loc[(node, direction), width], 1) for width in shape.columns),
                 _fixed(on_off.loc[(node, direction), "on_fraction"] * 100, 1),
                 _fixed(on_off.loc[(node, direction), "cycles_per_iteration"], 2))
                for node, direction in shape.index]
    parts = ["<section id='network'><h2>Network behaviour</h2>", table,
             "<h3>Burstiness (peak-to-mean rate) and ON/OFF per host</h3>",
             _grid(("host", "direction", *(f"peak/mean {int(w / MS)} ms" for w in shape.columns), "ON % (1 ms)",
                    "ON/OFF cycles per iteration"), per_host)]
    if len(network.incast):
        parts += ["<h3>Incast per receiver</h3>", _grid(
            ("host", "senders", "max fan-in", "incast % of busy time", "episodes"),
            [(row.node, f"{row.senders}", f"{row.max_fan_in}", _fixed(row.incast_fraction * 100, 1),
              f"{row.incast_episodes:,}") for row in network.incast.itertuples()])]
    if len(network.size_distributions):
        parts += ["<h3>Flow and message sizes</h3>", _grid(
            ("kind", "protocol", "count", "p50", "p90", "p99", "max"),
            [(row.kind, row.protocol, f"{row.count:,}", human_bytes(row.p50_bytes), human_bytes(row.p90_bytes),
              human_bytes(row.p99_bytes), human_bytes(row.max_bytes))
             for row in network.size_distributions.itertuples()])]
    if len(network.roce_paths):
        parts += ["<h3>RoCEv2 paths (UDP source ports, what ECMP hashes on)</h3>", _grid(
            ("source", "destination", "queue pairs", "source ports", "entropy / its most"),
            [(row.src_ip, row.dst_ip, f"{row.queue_pairs}", f"{row.src_ports}", _fixed(row.port_entropy_ratio, 2))
             for row in network.roce_paths.itertuples()])]
    signals = summary["roce_signals"]
    if len(network.roce_paths):
        parts.append(f"<p>RoCE signals during collectives: {signals['cnps']:,} CNPs, {signals['naks']:,} NAKs, "
                     f"{signals['retransmitted_packets']:,} retransmitted packets.</p>")
    parts.append("</section>")
    return parts


def arrival_lag_figure(network: NetworkBehaviour) -> Figure:
    """Each rank's arrival lag per operation (its entry minus the others' median) by sequence number, the
    lateness threshold, and the stragglers circled."""
    arrivals = network.diagnosis.arrivals
    figure = Figure(figsize=(10, 4.2))
    axis = figure.add_subplot()
    for (role, rank), rows in arrivals.groupby(["role", "rank"]):
        lag = rows["lag_ns"].astype("Float64").to_numpy(np.float64, na_value=np.nan) / MS
        axis.plot(rows["seq"].to_numpy(), lag, marker="o", markersize=3, linewidth=0.6, label=f"{role} {rank}")
    threshold_ms = late_threshold_ns(arrivals["lag_ns"].astype("Float64").to_numpy(np.float64, na_value=np.nan)) / MS
    axis.axhline(threshold_ms, color="grey", linestyle="--", linewidth=0.8, label="lateness threshold")
    late = network.diagnosis.stragglers
    late = late[late["role"] != "server"]
    if len(late):
        axis.scatter(late["seq"].to_numpy(), late["late_s"].to_numpy(np.float64) * 1e3, s=140, facecolors="none",
                     edgecolors="red", linewidths=1.5, label="straggler")
    axis.set_xlabel("operation (sequence number; ps-lite: training iteration)")
    axis.set_ylabel("lag behind the others' median, ms")
    axis.set_yscale("symlog", linthresh=1.0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.tight_layout()
    return figure
