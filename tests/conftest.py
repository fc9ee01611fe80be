"""Shared fixtures. Tests that need something this machine kind has (root, tcpdump, tshark, the workload
venv) fail loudly when it is missing: `make test` installs all of it, so a missing piece is a set-up bug.

tests/ mirrors the code: decoders/, analysis/, sniffer/ and lab/ hold the tests of those folders, support/ the
helpers they share (ground truth, capture generators, drivers of the real tools), bench/ `make bench`.
Tests that need root are marked `root` (every module that starts namespaces, tcpdump or the daemon)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parent.parent
PCAPS = REPO / "pcaps"
WORKLOAD_PYTHON = REPO / ".venv-workloads" / "bin" / "python"


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run `make setup` (it installs the system packages)")
    return path


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (network namespaces, packet capture); CI and `make test` run as root")


def require_workloads() -> Path:
    if not WORKLOAD_PYTHON.exists():
        pytest.fail("the workload venv is missing: run `make workloads`")
    return WORKLOAD_PYTHON


@pytest.fixture(scope="session")
def pcaps_dir() -> Path:
    return PCAPS


@pytest.fixture(scope="session")
def decoded_job(tmp_path_factory) -> Callable[[str], Path]:
    """A bundled job's name → its decode output, decoded once per session exactly as `dlcsniff decode` does
    (decoders.decode_run.decode_to_dir: tables, events, clocks, manifest). Tests must not write into it."""
    from dlcsniff.decoders.decode_run import decode_to_dir

    outputs: dict[str, Path] = {}

    def decoded(name: str) -> Path:
        if name not in outputs:
            out = tmp_path_factory.mktemp(f"decoded-{name.replace('/', '-')}")
            decode_to_dir([PCAPS / name], out)
            outputs[name] = out
        return outputs[name]
    return decoded


def capture_cut_before(source: Path, ts_ns: int, path: Path) -> Path:
    """A copy of a capture holding only its packets before ts_ns (editcap -B): a capture that stopped early."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([require_tool("editcap"), "-B", f"{ts_ns / 1e9:.6f}", str(source), str(path)], check=True)
    return path
