"""The HTML report in a real browser: Debian's Chromium, headless, on reports of the bundled real jobs.

Each report is opened twice: once with report_probe.js injected (it hovers, zooms, pans and resets every chart
with real mouse and wheel events, and `--dump-dom` hands back what it measured), once for a full-page screenshot,
which is cut into one PNG per figure. Chromium's console (`--enable-logging=stderr`) must stay silent: no
exception, no Content-Security-Policy violation (the page may load nothing), no message at all. The screenshots
stay in pytest's temporary directory (report_screenshots*/<job>/), to be looked at.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from dlcsniff.analysis import load_dataset, load_job_model, pslite_trace, write_html_report
from dlcsniff.analysis.iterations import worker_iterations
from tests.conftest import require_tool

JOBS = ("mxnet_sync", "mxnet_sync_large", "mxnet_sparse", "mxnet_async", "mxnet_3s4w", "mxnet_1s1w", "gloo",
        "byteps_3s3w")
# as /work/.library's machine notes give them: without the background-networking flags Chromium keeps trying
# the closed network
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--enable-logging=stderr", "--v=0")
WIDTH = 1400
PROBE = Path(__file__).with_name("report_probe.js")
# the figures each job's report has, and which of them are interactive
PSLITE_CHARTS = {"message_sizes", "timeline", "traffic"}
COLLECTIVE_CHARTS = {"collective_timeline", "collective_times", "collective_bandwidth", "collective_matrix"}
ZOOMED_JOB = "mxnet_3s4w"           # its report is also shot zoomed in and hovered


def _chromium(page: Path, profile: Path, *flags: str) -> tuple[str, list[str]]:
    """Chromium's stdout, and what the page wrote to its console."""
    result = subprocess.run([require_tool("chromium"), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags,
                             page.as_uri()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, [line for line in result.stderr.splitlines() if ":CONSOLE" in line]


def _probed(report: Path, out: Path, keep_zoom: bool = False) -> Path:
    """A copy of the report (beside it: the same file: URL origin) with the probe at the end of its body."""
    flag = "<script>window.probeKeepZoom = true;</script>" if keep_zoom else ""
    page = report.read_text().replace("</body>", f"{flag}<script>{PROBE.read_text()}</script></body>")
    out.write_text(page)
    return out


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("report_screenshots")


@pytest.mark.parametrize("job", JOBS)
def test_the_report_works_in_chromium(job, decoded_job, screenshots, tmp_path):
    decode_dir = decoded_job(job)
    report = write_html_report(load_job_model(decode_dir), tmp_path / "report.html")
    page = report.read_text()
    # nothing to fetch: every src / href is a data: URI or a link within the page, every script inline
    for address in re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]*)['"]""", page):
        assert address.startswith(("data:image/png;base64,", "#")), address
    assert "<script src" not in page and "<link" not in page and "url(" not in page

    dom, console = _chromium(_probed(report, tmp_path / "probed.html"), tmp_path / "profile",
                             f"--window-size={WIDTH},1000", "--virtual-time-budget=5000", "--dump-dom")
    assert console == []
    probe = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1).replace("&amp;", "&")
                       .replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"'))

    trace = pslite_trace(load_dataset(decode_dir))
    # the what-if curve: for a job with training iterations (`dlcsniff simulate` on SimGrid)
    whatif = {"whatif"} if trace is not None and worker_iterations(trace)["iteration_s"].notna().any() else set()
    interactive = ((PSLITE_CHARTS | whatif) if trace is not None else set()) | (
        COLLECTIVE_CHARTS if job == "gloo" else set())
    figures = {figure["id"]: figure for figure in probe["figures"]}
    assert {name for name, figure in figures.items() if figure["charts"]} == interactive
    for name, figure in figures.items():
        assert figure["height"] > 100 and figure["width"] > 500
        assert figure["charts"] or (len(figure["images"]) == 1 and figure["images"][0] > 500), name

    for chart in probe["charts"]:
        assert chart["width"] > 300 and chart["height"] > 150 and chart["ink"] > 2000, chart
        assert chart["drawn"] > 0 and chart["tooltip"], chart
        if chart["type"] == "matrix":
            assert "bytes" in chart["tooltip"] and "messages" in chart["tooltip"]
            continue
        low, high = chart["initial"]
        span = high - low
        assert chart["reset"] == pytest.approx(chart["initial"])
        # a drag from 25 % to 50 % of the plot shows that quarter of the range; ctrl+wheel zooms in around the
        # pointer (the page itself does not scroll), a plain wheel scrolls the page; shift+drag pans
        if not chart["id"].startswith(("message_sizes", "collective_times", "collective_bandwidth", "whatif")):
            assert chart["dragged"] == pytest.approx([low + span / 4, low + span / 2], rel=0.02, abs=span * 0.01)
        assert chart["dragged"][1] - chart["dragged"][0] < (high - low) * 0.9 or chart["id"].startswith("message")
        assert chart["wheelPrevented"] and not chart["plainWheelPrevented"]
        assert chart["wheeled"] != chart["initial"]
        if chart["type"] == "timeline":
            wheeled = chart["wheeled"][1] - chart["wheeled"][0]
            assert wheeled == pytest.approx(span / 2.718281828, rel=0.01)
            panned = chart["panned"]
            assert panned[1] - panned[0] == pytest.approx(span) and panned[0] == pytest.approx(low - span / 4, abs=span * 0.01)

    charts = {chart["id"].removesuffix("-chart"): chart for chart in probe["charts"]}
    if trace is not None:
        timeline = charts["timeline-0"]
        assert "tensor key" in timeline["tooltip"] or "iteration" in timeline["tooltip"]
        # every request and every iteration of every worker is on it, all drawn in the unzoomed view
        spec = json.loads(re.search(r"<script type='application/json' id='timeline-0-data'>(.*?)</script>",
                                    page).group(1))
        bars = {layer["name"]: len(layer["columns"]["x0"]) for layer in spec["layers"]}
        assert timeline["drawn"] == sum(bars.values())
        iterations = worker_iterations(trace)
        assert bars["iteration"] == iterations["phase3_s"].notna().sum()
        workers = {lane["label"] for lane in spec["lanes"] if lane["head"]}
        assert workers == {f"worker rank {rank}" for rank in trace.nodes.loc[trace.nodes["role"] == "worker", "rank"]}
        assert "length" in charts["message_sizes-0"]["tooltip"]
    if job == "gloo":
        assert "operation" in charts["collective_timeline-0"]["tooltip"]
    if whatif:
        assert "link rate" in charts["whatif-0"]["tooltip"] and charts["whatif-0"]["drawn"] >= 2

    # the page as a person sees it: a full-page screenshot, and each figure cut out of it
    shots = screenshots / job
    shots.mkdir()
    _, console = _chromium(report, tmp_path / "profile-shot", f"--window-size={WIDTH},{probe['height']}",
                           "--virtual-time-budget=5000", f"--screenshot={shots / 'page.png'}")
    assert console == []
    _cut_figures(shots / "page.png", figures.values(), shots)
    if job == ZOOMED_JOB:
        zoomed = _probed(report, tmp_path / "zoomed.html", keep_zoom=True)
        _, console = _chromium(zoomed, tmp_path / "profile-zoom", f"--window-size={WIDTH},{probe['height'] + 200}",
                               "--virtual-time-budget=5000", f"--screenshot={shots / 'zoomed.png'}")
        assert console == []
        _cut_figures(shots / "zoomed.png", [figures["timeline"]], shots, suffix="-zoomed")


def _cut_figures(page_png: Path, figures, out: Path, suffix: str = "") -> None:
    with Image.open(page_png) as page:
        assert page.size[0] == WIDTH
        pixels = page.convert("L")
        assert pixels.getextrema()[0] < 100               # something dark was drawn: not a blank page
        for figure in figures:
            box = (0, int(figure["top"]) - 4, WIDTH, min(page.size[1], int(figure["top"] + figure["height"]) + 4))
            cut = page.crop(box)
            assert cut.convert("L").getextrema()[0] < 100, figure["id"]
            cut.save(out / f"{figure['id']}{suffix}.png")
