"""Rates, sizes and durations as users write them (tc's and iperf's units), through the real command line: what
each spelling becomes in the command's parameters (simulate's what-if, capture's daemon options), what is refused
(bare numbers, ambiguous and wrong-kind units: exit 2, one line naming the units), and the deprecated --*-mb
spellings; and parse(format(x)) == x for every quantity."""
from __future__ import annotations

import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import dlcsniff.analysis
import dlcsniff.analysis.simulate as simulate_module
import dlcsniff.sniffer.options as capture_options
from dlcsniff.cli import app
from dlcsniff.decoders.quantities import (format_duration, format_rate, format_size, parse_duration, parse_rate,
                                     parse_size)
from tests.conftest import REPO

DLCSNIFF = REPO / ".venv" / "bin" / "dlcsniff"
runner = CliRunner()

RATES = {
    # bits: tc's spellings (any case), SI's, iperf's
    "100bit": 100, "100kbit": 100e3, "100Kbit": 100e3, "200mbit": 200e6, "200Mbit": 200e6, "10Gbit": 10e9,
    "10gbit": 10e9, "1Tbit": 1e12, "1Kibit": 1024, "1mibit": 2 ** 20, "1Gibit": 2 ** 30,
    "8bps": 8, "3kbps": 3e3, "100Mbps": 100e6, "10Gbps": 10e9, "100Mbit/s": 100e6, "100Mb/s": 100e6,
    "2.5gbit/s": 2.5e9, "1e9bit": 1e9, "100M": 100e6, "10G": 10e9, "1.6G": 1.6e9, "50k": 50e3,
    # bytes: B is a byte
    "1B/s": 8, "1Bps": 8, "10kB/s": 80e3, "10MB/s": 80e6, "10GB/s": 80e9, "10GBps": 80e9, "10MBps": 80e6,
    "1KiB/s": 8 * 1024, "1MiB/s": 8 * 2 ** 20, "1GiB/s": 8 * 2 ** 30, "1MiBps": 8 * 2 ** 20,
}
SIZES = {
    "96B": 96, "1kB": 1000, "1KB": 1000, "100MB": 100_000_000, "20GB": 20 * 10 ** 9, "1TB": 10 ** 12,
    "1KiB": 1024, "64MiB": 64 << 20, "2GiB": 2 << 30, "1TiB": 1 << 40,
    # tc's and iperf3 -n's bare multipliers are binary
    "64k": 64 << 10, "64K": 64 << 10, "64m": 64 << 20, "64M": 64 << 20, "1G": 1 << 30,
    "8kbit": 1000, "8Mbit": 10 ** 6, "0": 0,
}
DURATIONS = {"5ns": 5e-9, "50us": 50e-6, "50µs": 50e-6, "50μs": 50e-6, "50usec": 50e-6, "0.2ms": 0.2e-3,
             "3msec": 3e-3, "1s": 1.0, "2sec": 2.0, "2min": 120.0, "1h": 3600.0, "0": 0.0}


@pytest.fixture
def what_if(monkeypatch):
    """simulate's parsed what-if (and captured rate), caught where the command hands them to the library."""
    seen = {}

    def caught(decode_dir, out_dir, what_if, **options):
        seen.update(what_if=what_if, captured=options["captured_rate_bit_s"])
        raise simulate_module.AnalysisError("caught")
    monkeypatch.setattr(simulate_module, "write_simulation", caught)
    # the command loads the job model first: the directory stands for it (an empty one is refused)
    monkeypatch.setattr(dlcsniff.analysis, "load_job_model", lambda decode_dir: decode_dir)
    return seen


@pytest.fixture
def daemon_options(monkeypatch):
    """capture's daemon options, caught where the command would become the daemon."""
    seen = {}
    monkeypatch.setattr(capture_options, "exec_daemon", lambda options: seen.setdefault("options", options))
    return seen


def _simulate(tmp_path, *options):
    return runner.invoke(app, ["simulate", str(tmp_path), "--out", str(tmp_path / "sim"), *options])


@pytest.mark.parametrize("text, bit_s", RATES.items(), ids=list(RATES))
def test_every_rate_spelling_reaches_simulate_as_its_bits_per_second(tmp_path, what_if, text, bit_s):
    result = _simulate(tmp_path, "--bandwidth", text, "--captured-bandwidth", text)
    assert result.exit_code == 1 and "caught" in result.output, result.output
    assert what_if["what_if"].bandwidth_bit_s == pytest.approx(bit_s, rel=1e-12)
    assert what_if["captured"] == pytest.approx(bit_s, rel=1e-12)


@pytest.mark.parametrize("text, seconds", DURATIONS.items(), ids=list(DURATIONS))
def test_every_duration_spelling_reaches_simulate_as_seconds(tmp_path, what_if, text, seconds):
    result = _simulate(tmp_path, "--latency", text)
    assert result.exit_code == 1 and "caught" in result.output, result.output
    assert what_if["what_if"].latency_s == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("text, size", SIZES.items(), ids=list(SIZES))
def test_every_size_spelling_reaches_the_capture_daemon_as_bytes(tmp_path, daemon_options, text, size):
    # --max-disk and --rotate-size need at least 1 MB: a small size is checked as the snaplen
    option = "--max-disk" if size >= 10 ** 6 else "--snaplen"
    result = runner.invoke(app, ["capture", "-i", "lo", "--out", str(tmp_path / "cap"), option, text,
                                 "--duration", "90s"])
    assert result.exit_code == 0, result.output
    options = daemon_options["options"]
    assert (options.max_disk_bytes if option == "--max-disk" else options.snaplen) == size
    assert options.duration_s == 90


def test_capture_sizes_default_to_the_old_options_defaults(tmp_path, daemon_options):
    assert runner.invoke(app, ["capture", "-i", "lo", "--out", str(tmp_path / "cap")]).exit_code == 0
    options = daemon_options["options"]
    assert (options.rotate_bytes, options.buffer_bytes, options.max_disk_bytes) == (100 * 10 ** 6, 64 << 20, None)


@pytest.mark.parametrize("old, new, value, field, size", [
    ("--rotate-mb", "--rotate-size", "5", "rotate_bytes", 5 * 10 ** 6),
    ("--max-disk-mb", "--max-disk", "20000", "max_disk_bytes", 20 * 10 ** 9),
    ("--buffer-mb", "--buffer-size", "8", "buffer_bytes", 8 << 20),
])
def test_the_mb_spellings_still_work_with_a_one_line_deprecation_warning(tmp_path, daemon_options, old, new, value,
                                                                         field, size):
    result = runner.invoke(app, ["capture", "-i", "lo", "--out", str(tmp_path / "cap"), old, value])
    assert result.exit_code == 0, result.output
    assert getattr(daemon_options["options"], field) == size
    warning = [line for line in result.output.splitlines() if "deprecated" in line]
    assert warning == [f"warning: {old} is deprecated: give {new} {format_size(size)}"]
    both = runner.invoke(app, ["capture", "-i", "lo", "--out", str(tmp_path / "cap"), old, value, new, "1GB"])
    assert both.exit_code == 2 and "the same option" in both.output


def _refused(*args) -> str:
    """The one stderr line of a usage error (exit 2) of the installed command."""
    done = subprocess.run([str(DLCSNIFF), *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "1000", "LC_ALL": "C.UTF-8"})
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "Invalid value" in line or "error:" in line]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("option, text, needle", [
    ("--bandwidth", "10", "has no unit"), ("--bandwidth", "100", "has no unit"),
    ("--captured-bandwidth", "200", "has no unit"), ("--latency", "5", "has no unit"),
    ("--bandwidth", "10GB", "GB is a size"), ("--bandwidth", "10mbps", "ambiguous"),
    ("--bandwidth", "10gbps", "ambiguous"), ("--bandwidth", "fast", "not a rate"), ("--bandwidth", "0", "more than 0"),
    ("--bandwidth", "-5Mbit", "not a rate"), ("--latency", "5m", "not a duration"),
    ("--latency", "1 minute", "not a duration"), ("--latency", "5Mbit", "not a duration"),
])
def test_simulate_refuses_a_quantity_without_its_unit_naming_the_units(tmp_path, option, text, needle):
    line = _refused("simulate", str(tmp_path), "--out", str(tmp_path / "sim"), option, text)
    assert needle in line and option in line
    # the line lists the units, or the two it may mean
    if needle == "ambiguous":
        assert "bit or" in line and "B/s" in line
    elif needle != "more than 0":
        assert ("us" in line and "ms" in line) if option == "--latency" else ("Mbit" in line and "MB/s" in line)


@pytest.mark.parametrize("option, text, needle", [
    ("--snaplen", "96", "has no unit"), ("--rotate-size", "100", "has no unit"), ("--max-disk", "20000", "no unit"),
    ("--buffer-size", "64", "has no unit"), ("--duration", "30", "has no unit"),
    ("--buffer-size", "64mb", "ambiguous"), ("--max-disk", "1Gb", "ambiguous"), ("--rotate-size", "1MB/s", "a rate"),
    ("--snaplen", "1.5B", "whole number of bytes"), ("--duration", "1Mbit", "not a duration"),
])
def test_capture_refuses_a_quantity_without_its_unit_naming_the_units(tmp_path, option, text, needle):
    line = _refused("capture", "-i", "lo", "--out", str(tmp_path / "cap"), option, text)
    assert needle in line and option in line
    if needle == "ambiguous":
        assert "B or" in line and "bit" in line
    elif needle != "whole number of bytes":
        assert ("MiB" in line and "kB" in line) if option != "--duration" else "ms" in line


@given(st.floats(min_value=1e-3, max_value=1e15, allow_nan=False))
def test_a_rate_reads_back_as_it_is_shown(bit_s):
    assert parse_rate(format_rate(bit_s)) == pytest.approx(bit_s, rel=1e-5)


@given(st.integers(min_value=0, max_value=1 << 50))
def test_a_size_reads_back_exactly_as_it_is_shown(size):
    assert parse_size(format_size(size)) == size


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_a_duration_reads_back_as_it_is_shown(seconds):
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=1e-5, abs=1e-15)
