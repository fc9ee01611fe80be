"""One display unit per quantity (analysis/display.py), read off what `dlcsniff stats` prints for bundled jobs
and off the report's page: every duration in ms, every ratio in %, and each printed figure is summary.json's
value in that unit (the tables keep SCHEMA.md's units)."""
from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from dlcsniff.cli import app

runner = CliRunner()
# a number and the unit after it, in a table cell or a "r0: 1.234 ms" list
FIGURE = re.compile(r"(-?[0-9][0-9,]*\.?[0-9]*) ?(ms|µs|us|ns|s|%)(?![A-Za-z/])")


def _stats(decoded_job, tmp_path, job: str) -> tuple[str, dict]:
    out = tmp_path / "stats"
    result = runner.invoke(app, ["stats", str(decoded_job(job)), "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output, json.loads((out / "summary.json").read_text())


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]]


def test_stats_of_a_ps_lite_job_prints_every_duration_in_ms(decoded_job, tmp_path):
    printed, summary = _stats(decoded_job, tmp_path, "mxnet_sync")
    figures = printed.split("distribution")[0]
    units = {unit for _, unit in FIGURE.findall(figures)}
    assert units == {"ms", "%"}, figures
    # the headline's server overheads are in the unit of its other durations (they were µs beside ms)
    headline = {cells[0]: cells[1] for cells in map(_cells, figures.splitlines()) if len(cells) == 2}
    update = summary["statistics"]["update_overhead_us"]["mean"]
    assert headline["mean update overhead"] == f"{update / 1e3:,.3f} ms"
    assert headline["mean computation overhead"] == f"{summary['statistics']['computation_s']['mean'] * 1e3:,.3f} ms"
    # the distribution table: a unit column, ms for every duration (its columns are in s and µs), % for the ratio
    rows = [_cells(line) for line in printed.split("distribution")[1].splitlines()]
    rows = {cells[0]: cells for cells in rows if len(cells) == 7 and cells[0] in summary["statistics"]}
    assert set(rows) == set(summary["statistics"])
    for name, (_, unit, count, mean, p50, p99, most) in rows.items():
        assert unit == ("%" if name == "overlap_ratio" else "ms"), (name, unit)
        found = summary["statistics"][name]
        if found is None:
            assert (count, mean) == ("0", "n/a")
            continue
        scale = 100 if unit == "%" else 1e3 if name.endswith("_s") else 1e-3
        for shown, key in ((mean, "mean"), (p50, "p50"), (p99, "p99"), (most, "max")):
            assert float(shown.replace(",", "")) == pytest.approx(found[key] * scale, abs=0.051 if unit == "%" else 5e-4)


def test_stats_of_a_collective_job_prints_every_duration_in_ms(decoded_job, tmp_path):
    printed, _ = _stats(decoded_job, tmp_path, "gloo")
    collectives = printed.split("collectives of")[1].split("diagnosis:")[0]
    assert {unit for _, unit in FIGURE.findall(collectives)} <= {"ms", "%"}, collectives
    header = next(_cells(line) for line in collectives.splitlines() if "kind" in line and "ops" in line)
    assert [cell for cell in header if re.search(r"\b(time|skew)\b", cell)] == [
        "time p50 ms", "start skew max ms", "end skew max ms"]


def test_the_report_shows_the_statistics_in_the_units_stats_prints(decoded_job, tmp_path):
    page = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(decoded_job("mxnet_sync")), "--out", str(page)],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    text = page.read_text()
    table = text.split("<h3>Statistics")[1].split("</table>")[0]
    units = re.findall(r"</th><td class='text'>([^<]*)</td>", table)
    assert len(units) == 11 and set(units) == {"ms", "%"} and units.count("%") == 1
