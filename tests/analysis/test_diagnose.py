"""`dlcsniff diagnose` on real jobs with injected faults (pcaps/gloo_straggler, gloo_straggler_sigstop, gloo_hang,
gloo_slow_link, mxnet_slow_worker, mxnet_slow_server, tcp_zero_window: lab/record.py FAULT_JOBS), judged against
what the workloads' own records say was injected (tests/support/fault_truth.py): each fault named exactly (who,
which operation, lateness within 25 %), from every node's capture together and from subsets of them, with clocks
off by seconds, and from captures that stopped while the stall went on (a hang as the capture shows it); and no
straggler, no hang and no link held by zero windows on any healthy job: every other bundled job, and the real
captures made elsewhere (NCCL over Soft-RoCE, perftest, pyzmq in Docker)."""
from __future__ import annotations

import json
import re
import statistics
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from dlcsniff.analysis.diagnosis import diagnosis_of
from dlcsniff.analysis.job_model import load_job_model
from dlcsniff.analysis.stats_schema import ARRIVALS, LINK_HEALTH
from tests.conftest import PCAPS, capture_cut_before, require_tool
from tests.support.fault_truth import gloo_fault, mxnet_fault, stall_window_ns


def _diagnosis(decode_dir):
    return diagnosis_of(load_job_model(decode_dir))


STRAGGLER_JOBS = {"gloo_straggler": gloo_fault, "gloo_straggler_sigstop": gloo_fault, "mxnet_slow_worker": mxnet_fault,
                  "mxnet_slow_server": mxnet_fault}
HANG_JOBS = {"gloo_hang": gloo_fault, "mxnet_hang": mxnet_fault}
FAULT_JOBS = {**STRAGGLER_JOBS, **HANG_JOBS}
# node captures given alone: the late node's own with one other, or its peers' without it
SUBSETS = {
    "gloo_straggler": [("rank2", "rank3"), ("rank0", "rank1")],
    "gloo_straggler_sigstop": [("rank0", "rank3")],
    "gloo_hang": [("rank2", "rank3"), ("rank0", "rank1")],
    "mxnet_slow_worker": [("worker1", "server1"), ("server0", "server1")],
    "mxnet_slow_server": [("server1", "worker0"), ("worker0", "worker1")],
    "mxnet_hang": [("worker0", "server0"), ("server0", "server1")],
}
ZERO_WINDOW_JOB = "tcp_zero_window"        # a reader that stopped reading (lab/workloads/slow_reader.py)
HEALTHY = sorted(path.name for path in PCAPS.iterdir() if path.is_dir() and path.name not in FAULT_JOBS
                 and path.name not in ("realcaps", ZERO_WINDOW_JOB))
SHARED_REALCAPS = Path(__file__).resolve().parents[3] / "shared" / "realcaps"
REAL_NCCL = PCAPS / "realcaps" / "softroce-tutorial" / "nccl"
LATENESS_TOLERANCE = 0.25
DLCSNIFF = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "dlcsniff"


def _decode(files: list[Path], out: Path) -> Path:
    from dlcsniff.decoders.decode_run import decode_to_dir
    decode_to_dir(files, out)
    return out


def _captures(job: str, names: tuple[str, ...] | None = None) -> list[Path]:
    found = sorted((PCAPS / job).glob("*.pcap.gz"))
    return [path for path in found if names is None or path.name.split(".")[0] in names]


@pytest.fixture(scope="module")
def decoded_subset(tmp_path_factory):
    """(job, capture names) → the decode output of only those captures, decoded once per module."""
    outputs: dict[tuple, Path] = {}

    def decoded(job: str, names: tuple[str, ...]) -> Path:
        if (job, names) not in outputs:
            outputs[(job, names)] = _decode(_captures(job, names), tmp_path_factory.mktemp(f"{job}-subset"))
        return outputs[(job, names)]
    return decoded


def _check_straggler(found, truth) -> None:
    assert found.hangs.empty, found.hangs
    assert len(found.stragglers) == 1, found.stragglers
    late = found.stragglers.iloc[0]
    assert (late["role"], late["rank"], late["seq"]) == (truth.role, truth.rank, truth.seq)
    assert abs(late["late_s"] - truth.late_s) <= LATENESS_TOLERANCE * truth.late_s, (late["late_s"], truth.late_s)


def _check_hang(found, truth) -> None:
    assert found.stragglers.empty, found.stragglers
    assert len(found.hangs) == 1, found.hangs
    hang = found.hangs.iloc[0]
    assert (hang["role"], hang["rank"], hang["seq"], hang["kind"]) == (
        truth.role, truth.rank, truth.seq, "push" if truth.role == "worker" else "all_reduce")
    assert tuple(hang["waiting_ranks"]) == truth.waiting


@pytest.mark.parametrize("job", sorted(STRAGGLER_JOBS))
def test_each_straggler_is_named_with_its_lateness(job, decoded_job):
    truth = STRAGGLER_JOBS[job](PCAPS / job)
    _check_straggler(_diagnosis(decoded_job(job)), truth)


def test_the_rank_that_stopped_taking_part_is_a_hang_with_the_ranks_that_waited(decoded_job):
    """Rank 3 slept 12 s before step 5's all-reduce; the others sent their part and failed at their 4 s timeout,
    closing their connections: how long they waited is how long the captures show them waiting."""
    truth = gloo_fault(PCAPS / "gloo_hang")
    found = _diagnosis(decoded_job("gloo_hang"))
    _check_hang(found, truth)
    assert truth.waiting == (0, 1, 2)
    hang = found.hangs.iloc[0]
    assert abs(hang["waited_s"] - truth.waited_s) <= LATENESS_TOLERANCE * truth.waited_s, (hang, truth)
    # the captures went on until rank 3 woke, 12 s after it fell asleep, and failed
    start_ns, end_ns = stall_window_ns(PCAPS / "gloo_hang")
    assert hang["since_s"] >= (end_ns - start_ns) / 1e9 - 0.1


def test_the_worker_that_stopped_pushing_is_a_hang_with_the_worker_that_waited(decoded_job):
    """Worker 1 (ps-lite rank 0) fell asleep before batch 3's pushes; worker 0 pushed and waited for the round's
    answers until the recorder gave up on the job 3 s later and killed it (every connection closed then)."""
    truth = mxnet_fault(PCAPS / "mxnet_hang")
    found = _diagnosis(decoded_job("mxnet_hang"))
    _check_hang(found, truth)
    assert truth.waiting == (1,)
    hang = found.hangs.iloc[0]
    for waited in (hang["since_s"], hang["waited_s"]):
        assert abs(waited - truth.waited_s) <= LATENESS_TOLERANCE * truth.waited_s, (hang, truth)
    assert found.verdict()[0].startswith("hang: worker rank 0 never joined round 3; worker rank 1 waited")


@pytest.mark.parametrize("job,names", [(job, names) for job, subsets in SUBSETS.items() for names in subsets])
def test_faults_are_named_from_subsets_of_the_captures(job, names, decoded_subset):
    found = _diagnosis(decoded_subset(job, names))
    truth = FAULT_JOBS[job](PCAPS / job)
    (_check_hang if job in HANG_JOBS else _check_straggler)(found, truth)


def test_clocks_off_by_seconds_change_nothing(tmp_path):
    """Two ranks' captures shifted by seconds (editcap -t): the job's timeline puts them back (decoders/clocks.py)
    and the straggler is the same, as late."""
    files = []
    for path in _captures("gloo_straggler"):
        shift = {"rank0": "2.5", "rank2": "-3.75"}.get(path.name.split(".")[0])
        if shift is None:
            files.append(path)
            continue
        shifted = tmp_path / path.name.replace(".gz", "")
        subprocess.run([require_tool("editcap"), "-t", shift, str(path), str(shifted)], check=True)
        files.append(shifted)
    found = _diagnosis(_decode(files, tmp_path / "decoded"))
    _check_straggler(found, gloo_fault(PCAPS / "gloo_straggler"))


def _cut(job: str, ts_ns: int, out: Path) -> list[Path]:
    return [capture_cut_before(path, ts_ns, out / path.name.replace(".gz", "")) for path in _captures(job)]


@pytest.mark.parametrize("job,waiting", [("gloo_straggler", [0, 1, 3]), ("mxnet_slow_worker", [1]),
                                         ("mxnet_slow_server", [0, 1])])
def test_captures_stopped_during_the_stall_leave_the_operation_unfinished(job, waiting, tmp_path):
    """Every capture stopped 0.8 s into the stalled node's sleep (editcap -B): the others had entered, the
    stalled node had not (a rank, a worker; the server had every push of the round and answered none), and
    nothing was captured after (a pcap has no end of its own): neither a straggler nor a hang, but the operation
    the captures ended in, with who was missing."""
    start_ns, _ = stall_window_ns(PCAPS / job)
    truth = FAULT_JOBS[job](PCAPS / job)
    found = _diagnosis(_decode(_cut(job, start_ns + 800_000_000, tmp_path / "cut"), tmp_path / "decoded"))
    assert found.stragglers.empty and found.hangs.empty, found.as_json()
    assert len(found.unfinished) == 1, found.unfinished
    missing = found.unfinished.iloc[0]
    assert (missing["role"], missing["rank"], missing["seq"], missing["waiting_ranks"]) == (
        truth.role, truth.rank, truth.seq, waiting)
    assert found.verdict()[0].startswith("unfinished: the captures end")


def test_the_hang_cut_before_the_timeouts_is_unfinished(tmp_path):
    """gloo_hang's captures stopped 2 s after rank 3 fell asleep, before the others' 4 s timeout closed their
    connections: rank 3 is missing from all_reduce #5, but nothing shows the others still waiting."""
    start_ns, _ = stall_window_ns(PCAPS / "gloo_hang")
    found = _diagnosis(_decode(_cut("gloo_hang", start_ns + 2_000_000_000, tmp_path / "cut"), tmp_path / "decoded"))
    assert found.hangs.empty and found.stragglers.empty
    assert [(row.rank, row.seq, row.waiting_ranks) for row in found.unfinished.itertuples()] == [(3, 5, [0, 1, 2])]


@pytest.mark.parametrize("job", HEALTHY)
def test_healthy_bundled_jobs_report_no_straggler_and_no_hang(job, decoded_job):
    """No straggler, no hang, no link held by zero windows (pcaps/gloo's one real zero window, 82 µs, is counted
    and limits nothing), no slow link but the one slowed."""
    found = _diagnosis(decoded_job(job))
    assert found.stragglers.empty, found.stragglers
    assert found.hangs.empty, found.hangs
    assert not found.links["limited_by"].str.contains("zero_windows").any(), found.links
    assert (found.link_health["zero_window_s"] < 0.001).all(), found.link_health
    if job == "gloo":
        assert found.link_health["zero_windows"].max() == 1
    if job == "gloo_slow_link":          # its slowed link: below
        return
    # no link is slow on a healthy job; only real retransmissions are named (mxnet_sync_large: below)
    assert not found.links["limited_by"].str.contains("rate").any(), found.links
    if job != "mxnet_sync_large":
        assert found.links.empty, found.links


def test_a_reader_that_stopped_reading_holds_its_link_by_zero_windows(decoded_job):
    """pcaps/tcp_zero_window: the reader stopped reading three times for 0.4 s; its way in and the sender's way out
    are limited by zero windows, as many as tshark flags, for less time than the reader's record says it did not
    read (the window closes once its buffer is full)."""
    from tests.decoders.test_zero_windows import tshark_zero_windows
    found = _diagnosis(decoded_job(ZERO_WINDOW_JOB))
    assert found.stragglers.empty and found.hangs.empty
    job = json.loads((PCAPS / ZERO_WINDOW_JOB / "job.json").read_text())
    ips = {node["name"]: node["ip"] for node in job["nodes"]}
    links = found.links.set_index(["ip", "direction"])
    assert set(links.index) == {(ips["reader"], "recv"), (ips["sender"], "send")}, found.links
    assert (links["limited_by"] == "zero_windows").all()
    ((count, _),) = tshark_zero_windows(PCAPS / ZERO_WINDOW_JOB / "reader.pcap.gz").values()
    assert (links["zero_windows"] == count).all()
    pauses = json.loads((PCAPS / ZERO_WINDOW_JOB / "reader.json").read_text())["pauses"]
    stopped_s = sum(pause["end_ns"] - pause["start_ns"] for pause in pauses) / 1e9
    assert (links["zero_window_s"].between(stopped_s / 2, stopped_s)).all(), (links, stopped_s)
    assert found.verdict()[0].startswith(f"link: {ips['reader']} recv limited by {count} zero windows, ")


def test_a_gloo_rank_stopped_by_sigstop_is_sent_no_data(decoded_job):
    """gloo_straggler_sigstop: while rank 1 was stopped its peers sent it only NOTIFY_SEND_READY messages (48 bytes:
    Gloo sends a transfer's data once the receiver's NOTIFY_RECV_READY came), so nothing filled its buffers: no zero
    window; a stopped Gloo rank is a straggler, not a held link."""
    found = _diagnosis(decoded_job("gloo_straggler_sigstop"))
    assert found.links.empty and (found.link_health["zero_windows"] == 0).all(), found.link_health


def _real_sets() -> dict[str, list[Path]]:
    sets = {f"nccl_{kind}": sorted(REAL_NCCL.glob(f"{kind}_node*.pcap.gz")) for kind in ("ring2", "tree2")}
    for folder in ("softroce-tutorial/perftest", "pyzmq-docker"):
        for path in sorted((SHARED_REALCAPS / folder).glob("*.pcap")):
            sets[path.stem] = [path]
    return sets


@pytest.mark.parametrize("name", sorted(_real_sets()))
def test_real_captures_from_elsewhere_report_nothing(name, tmp_path):
    files = _real_sets()[name]
    if not all(path.exists() for path in files):
        pytest.skip(f"{name}: not on this machine")
    found = _diagnosis(_decode(files, tmp_path / "decoded"))
    assert found.stragglers.empty and found.hangs.empty and found.links.empty, found.as_json()


def test_the_arrivals_are_where_the_programs_called(decoded_job):
    """Each rank's entry into each collective of the Gloo job is after its program called it and at most 25 ms
    later; its exit before the call returned (the ranks' records: tests of lab/workloads/gloo_job.py)."""
    found = _diagnosis(decoded_job("gloo"))
    calls = []
    for rank in range(4):
        record = json.loads((PCAPS / "gloo" / f"rank{rank}.json").read_text())
        for op in record["operations"]:
            calls += [(rank, tag, op["start_ns"], op["end_ns"]) for tag in op["gloo_tags"]]
    truth = pd.DataFrame(calls, columns=["rank", "seq", "call_ns", "return_ns"])
    matched = found.arrivals.merge(truth, on=["rank", "seq"])
    assert len(matched) == len(found.arrivals) == 80
    after_call = matched["entry_ts_ns"] - matched["call_ns"]
    assert after_call.between(0, 25_000_000).all(), after_call.describe()
    assert (matched["exit_ts_ns"].astype("int64") <= matched["return_ns"]).all()


def test_a_slowed_link_is_blamed_on_its_host(decoded_job):
    """rank 1's link ran at 100 Mbit/s each way: its way out (to rank 0) and in (from rank 2) are limited by rate;
    its ring neighbours' links to and from it are slow too, and explained by rank 1."""
    health = _diagnosis(decoded_job("gloo_slow_link")).link_health.set_index(["node", "direction"])
    limited = health[health["limited_by"] != ""]
    assert set(limited.index) == {("rank 1", "send"), ("rank 1", "recv")}
    assert (limited["limited_by"] == "rate").all()
    explained = health[health["explained_by"] != ""]
    assert set(explained.index) == {("rank 1", "send"), ("rank 1", "recv"), ("rank 0", "recv"), ("rank 2", "send")}
    assert (explained["explained_by"] == "rank 1").all()
    fast = health.drop(index=explained.index)["rate_gb_per_s"]
    assert (limited["rate_gb_per_s"] < fast.min() / 6).all()
    # the 100 Mbit/s shaper lets a 96 KiB burst through at the veth's speed, then 12.5 MB/s
    assert (limited["rate_gb_per_s"] * 8 < 0.2).all()


def _tshark_retransmitted_share(capture: Path) -> dict[tuple[str, str], float]:
    out = subprocess.run([require_tool("tshark"), "-r", str(capture), "-Y", "tcp.len>0", "-T", "fields", "-e",
                          "ip.src", "-e", "ip.dst", "-e", "tcp.len", "-e", "tcp.analysis.retransmission"],
                         capture_output=True, text=True, check=True).stdout
    sent: dict[tuple[str, str], list[int]] = {}
    for line in out.splitlines():
        src, dst, length, again = (line.split("\t") + [""])[:4]
        sent.setdefault((src, dst), [0, 0])
        sent[(src, dst)][0] += int(length)
        sent[(src, dst)][1] += int(length) if again else 0
    return {key: again / total for key, (total, again) in sent.items()}


def test_real_retransmissions_are_named_where_tshark_sees_them(decoded_job):
    """mxnet_sync_large, healthy, retransmitted on three host directions (real TCP retransmissions, the same
    at both ends); each named direction has a stream tshark also sees retransmitted above 1 %."""
    found = _diagnosis(decoded_job("mxnet_sync_large"))
    links = found.links
    assert len(links) == 3 and (links["limited_by"] == "retransmissions").all(), links
    shares: dict[tuple[str, str], float] = {}
    for capture in _captures("mxnet_sync_large"):
        for key, share in _tshark_retransmitted_share(capture).items():
            shares[key] = max(share, shares.get(key, 0.0))
    for row in links.itertuples():
        mine = [share for (src, dst), share in shares.items() if (src if row.direction == "send" else dst) == row.ip]
        assert max(mine) > 0.01, (row.node, row.direction, mine)


def test_roce_paths_hold_the_ports_tshark_reads():
    """The real NCCL ring's four queue pairs per capture: one UDP source port each (rxe derives it from the QP
    number), entropy 0 per host pair; the ports are tshark's."""
    from dlcsniff.analysis.diagnosis import WIRE_STREAM_COLUMNS
    from dlcsniff.analysis.roce_paths import roce_paths
    files = sorted(REAL_NCCL.glob("ring2_node*.pcap.gz"))
    out = subprocess.run([require_tool("tshark"), "-r", str(files[0]), "-Y", "udp.dstport == 4791", "-T", "fields",
                          "-e", "ip.src", "-e", "ip.dst", "-e", "udp.srcport"], capture_output=True, text=True,
                         check=True).stdout
    seen = {tuple(line.split("\t")[:2]): int(line.split("\t")[2]) for line in out.splitlines()}
    assert len(seen) == 4
    import tempfile
    with tempfile.TemporaryDirectory() as scratch:
        paths = roce_paths(load_job_model(_decode(files, Path(scratch) / "out")).wire(WIRE_STREAM_COLUMNS).streams)
        streams = pq.read_table(Path(scratch) / "out" / "streams.parquet").to_pandas()
    roce = streams[(streams["protocol"] == "roce") & (streams["capture"] == files[0].name.split(".")[0])]
    assert {(row.src_ip, row.dst_ip): list(row.udp_src_ports) for row in roce.itertuples()} == {
        key: [port] for key, port in seen.items()}
    assert (paths["src_ports"] == 1).all() and (paths["queue_pairs"] == 1).all()
    assert paths["port_entropy_ratio"].isna().all()          # one queue pair: nothing to spread
    assert len(paths) == 6                              # 3 hosts, both ways


def test_cli_json_and_out(decoded_job, tmp_path):
    """--json's keys are the contract; --out follows the tool's output rule (claimed, labelled, never the
    decode output, not another run's without --force); a directory that is no decode output is one line."""
    decoded = decoded_job("gloo_hang")
    run = subprocess.run([str(DLCSNIFF), "diagnose", str(decoded), "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert list(found) == ["stragglers", "hangs", "links", "unfinished", "judged"]
    assert found["stragglers"] == [] and found["links"] == []
    assert set(found["hangs"][0]) >= {"rank", "seq", "kind", "waiting_ranks", "since_s"}
    out = tmp_path / "diagnosis"
    text = subprocess.run([str(DLCSNIFF), "diagnose", str(decoded), "-o", str(out)], capture_output=True, text=True)
    assert text.returncode == 0 and text.stdout.startswith("hang: rank 3 never joined all_reduce #5; ranks 0, 1, 2 "
                                                           "waited 4.03 s, then their connections went quiet")
    written = json.loads((out / "diagnosis.json").read_text())
    assert {key: written[key] for key in found} == found and written["verdict"][0].startswith("hang: rank 3")
    assert pq.read_schema(out / "arrivals.parquet").equals(ARRIVALS.schema)
    assert pq.read_schema(out / "link_health.parquet").equals(LINK_HEALTH.schema)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "diagnose" and set(manifest["files"]) == {"diagnosis.json", "arrivals.parquet",
                                                                         "link_health.parquet"}
    again = subprocess.run([str(DLCSNIFF), "diagnose", str(decoded), "--out", str(out)], capture_output=True, text=True)
    assert again.returncode == 1 and "--force" in again.stderr
    forced = subprocess.run([str(DLCSNIFF), "diagnose", str(decoded), "--out", str(out), "--force"],
                            capture_output=True, text=True)
    assert forced.returncode == 0
    into_decode = subprocess.run([str(DLCSNIFF), "diagnose", str(decoded), "--out", str(decoded)], capture_output=True,
                                 text=True)
    assert into_decode.returncode == 1 and "input directory" in into_decode.stderr
    (tmp_path / "empty").mkdir()
    wrong = subprocess.run([str(DLCSNIFF), "diagnose", str(tmp_path / "empty")], capture_output=True, text=True)
    assert wrong.returncode == 1 and len(wrong.stderr.strip().splitlines()) == 1 and "Traceback" not in wrong.stderr


def test_stats_carry_the_diagnosis_and_the_network_behaviour(decoded_job, tmp_path):
    """`dlcsniff stats`: summary.json's "diagnosis" is what diagnose --json prints (with its verdict), and the
    network-behaviour tables are written in their schemas."""
    from dlcsniff.analysis import write_statistics
    from dlcsniff.analysis.stats_schema import STATS_TABLES
    decoded = decoded_job("mxnet_slow_worker")
    stats = write_statistics(load_job_model(decoded), tmp_path / "stats")
    summary = json.loads((tmp_path / "stats" / "summary.json").read_text())
    expected = json.loads(json.dumps(_diagnosis(decoded).as_json()))
    assert {key: summary["diagnosis"][key] for key in expected} == expected
    assert summary["diagnosis"]["verdict"][0] == ("straggler: worker rank 0 pushed in round 3 1.20 s after the "
                                                  "others (capture worker1.pcap.gz)")
    for name in ("arrivals", "arrival_spread", "link_health", "burstiness", "on_off", "incast", "size_distributions",
                 "roce_paths", "roce_collectives"):
        assert pq.read_schema(tmp_path / "stats" / f"{name}.parquet").equals(STATS_TABLES[name].schema), name
    spread = stats.network.arrival_spread
    late = spread[spread["seq"] == 3].iloc[0]
    assert late["latest_rank"] == 0 and late["arrival_spread_ns"] > 1_000_000_000
    assert statistics.median(spread["arrival_spread_ns"]) < 10_000_000


def test_the_report_opens_with_the_diagnosis(decoded_job, tmp_path):
    from dlcsniff.analysis import write_html_report
    page = write_html_report(load_job_model(decoded_job("gloo_straggler")), tmp_path / "report.html").read_text()
    first = page.index("<h2")
    assert page[first:].startswith("<h2>Diagnosis</h2>")
    assert "straggler: rank 2 entered all_reduce #6 1.50 s after the others" in page
    assert "id='network'" in page and "id='arrival_lags'" in page


def test_the_report_opens_with_the_diagnosis_in_a_browser(decoded_job, tmp_path):
    """Chromium headless draws the page: no console message, and the first heading on it is the diagnosis,
    with the straggler's line."""
    from dlcsniff.analysis import write_html_report
    from tests.analysis.test_report_browser import WIDTH, _chromium
    report = write_html_report(load_job_model(decoded_job("gloo_straggler")), tmp_path / "report.html")
    dom, console = _chromium(report, tmp_path / "profile", f"--window-size={WIDTH},1000", "--virtual-time-budget=3000",
                             "--dump-dom")
    assert console == []
    headings = re.findall(r"<h2[^>]*>(.*?)</h2>", dom)
    assert headings[0] == "Diagnosis" and "Network behaviour" in headings
    assert "straggler: rank 2 entered all_reduce #6 1.50 s after the others (capture rank2.pcap.gz)" in dom
    _, console = _chromium(report, tmp_path / "profile-shot", f"--window-size={WIDTH},1800",
                           f"--screenshot={tmp_path / 'page.png'}")
    assert console == [] and (tmp_path / "page.png").stat().st_size > 50_000


def test_an_output_decoded_before_the_roce_signal_columns_is_diagnosed_alike(decoded_job, tmp_path):
    """streams.parquet without udp_src_ports … retransmitted_times_ns (an older dlcsniff's): the same diagnosis."""
    import shutil
    decoded = decoded_job("gloo_straggler")
    old = tmp_path / "old"
    shutil.copytree(decoded, old)
    streams = pq.read_table(old / "streams.parquet")
    newer = ["udp_src_ports", "udp_src_port_packets", "cnp_times_ns", "nak_times_ns", "retransmitted_times_ns"]
    pq.write_table(streams.drop(newer), old / "streams.parquet")
    assert _diagnosis(old).as_json() == _diagnosis(decoded).as_json()


@pytest.mark.root
def test_fresh_fault_jobs_are_named_as_their_records_say(tmp_path):
    """The recorder's fault jobs recorded now (other timings than the bundled ones'): a straggler rank and a slow
    server, each named exactly, its lateness within 25 % of what this run's records say."""
    from lab.record import GLOO_FAULT_JOBS, MXNET_JOBS, record_gloo_job, record_mxnet_job
    from tests.conftest import require_root, require_workloads
    require_root()
    python = str(require_workloads())
    straggler = GLOO_FAULT_JOBS["gloo_straggler"]
    gloo_dir = record_gloo_job(tmp_path / "jobs", python, name=straggler.name, training=straggler.training)
    _check_straggler(_diagnosis(_decode(sorted(gloo_dir.glob("*.pcap.gz")), tmp_path / "gloo")),
                     gloo_fault(gloo_dir))
    server_dir = record_mxnet_job(MXNET_JOBS["mxnet_slow_server"], tmp_path / "jobs", python)
    _check_straggler(_diagnosis(_decode(sorted(server_dir.glob("*.pcap.gz")), tmp_path / "mxnet")),
                     mxnet_fault(server_dir))


def test_two_jobs_decoded_together_are_said_to_be_judged_as_one(tmp_path):
    """The real Soft-RoCE NCCL captures hold two jobs (ring2_*, then tree2_* five minutes later, on the same three
    hosts, each rank 0-2 and all-reduce #0-#1): decoded together, decode warns, and the diagnosis judged 2
    collectives where there were 4 without a word. It says the verdict mixes them; one job alone says nothing."""
    both = _decode(sorted(REAL_NCCL.glob("*.pcap.gz")), tmp_path / "both")
    found = _diagnosis(both)
    assert found.jobs == [[f"ring2_node{n}" for n in range(3)], [f"tree2_node{n}" for n in range(3)]]
    assert found.judged()["jobs"] == 2
    assert found.verdict()[0].startswith("the decode holds 2 jobs (ring2_node0.pcap.gz, ring2_node1.pcap.gz, "
                                         "ring2_node2.pcap.gz; tree2_node0.pcap.gz")
    assert found.verdict()[0].endswith("judged as one, their ranks and operations mixed; decode each job on its own")
    one = _diagnosis(_decode(sorted(REAL_NCCL.glob("ring2_*.pcap.gz")), tmp_path / "one"))
    assert one.jobs == [] and one.judged()["jobs"] == 1 and not any("jobs" in line for line in one.verdict())
    # stats and simulate say it too (on stderr, beside --json's document)
    for command in (["stats", str(both), "--out", str(tmp_path / "stats")],
                    ["simulate", str(both), "--out", str(tmp_path / "sim"), "--json"]):
        run = subprocess.run([str(DLCSNIFF), *command], capture_output=True, text=True)
        assert run.returncode == 0 and run.stderr.startswith("warning: the decode holds 2 jobs ("), run.stderr


def test_stats_on_a_plain_tcp_job_points_to_diagnose(decoded_job, tmp_path):
    """The slow reader's job is plain TCP: stats has no tensor or collective to time, and said 'nothing to
    analyse' where diagnose finds its links held by zero windows; it points there now."""
    decoded = decoded_job(ZERO_WINDOW_JOB)
    run = subprocess.run([str(DLCSNIFF), "stats", str(decoded), "--out", str(tmp_path / "stats")],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "(`dlcsniff diagnose` still judges its links)" in run.stderr, run.stderr
    assert _diagnosis(decoded).links["limited_by"].str.contains("zero_windows").all()
