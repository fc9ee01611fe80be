"""`dlcsniff capture` run as a user runs it, for the capture daemon's tests and benchmarks."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
import pytest
from tests.conftest import REPO
import pandas as pd
import pyarrow.parquet as pq


DLCSNIFF = REPO / ".venv" / "bin" / "dlcsniff"


TOOL_PYTHON = REPO / ".venv" / "bin" / "python"


READY_RE = re.compile(r"capturing on (\S+) into (.+) \(set (\d+)\)")
# the probes and the cut are loaded in the background: the lines that end their start
PROBES_RE = re.compile(r"eBPF probes (attached|off)")
PAYLOAD_RE = re.compile(r"payload: (\S+)")


START_TIMEOUT_S = 120.0        # the root helper's load: a second, longer on 2 busy cores


STOP_TIMEOUT_S = 5.0           # the promise for SIGTERM/SIGINT


def process_tree_cpu_s(pid: int) -> float | None:
    """User + system CPU of a process from its exec on (`dlcsniff capture` and the daemon it becomes: one pid),
    its children that exited, and its live children (the root helpers); None once it is gone."""
    def times(task: int, fields: slice) -> int:
        return sum(int(value) for value in Path(f"/proc/{task}/stat").read_text().rsplit(")", 1)[1].split()[fields])

    try:
        children = [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        ticks = times(pid, slice(11, 15))
        for child in children:
            try:
                ticks += times(child, slice(11, 13))
            except OSError:            # just exited: its CPU is its parent's once collected
                continue
    except OSError:
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


class RunningDaemon:
    """`dlcsniff capture ARGS` started (in a namespace when given), its stderr collected as it comes."""

    def __init__(self, args: list[str], *, netns: str | None = None, wrapper: tuple[str, ...] = (),
                 stdin: int = subprocess.DEVNULL, env: dict[str, str] | None = None) -> None:
        """`wrapper`: a command that runs the daemon (exec'ing it, so that signals reach it)."""
        argv = [*wrapper, str(DLCSNIFF), "capture", *args]
        if netns is not None:
            argv = ["ip", "netns", "exec", netns, *argv]
        self.process = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=env)
        self.lines: list[str] = []
        self.ready_cpu_s: float | None = None       # CPU of its processes when its ready line came
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            if self.ready_cpu_s is None and READY_RE.search(line):
                self.ready_cpu_s = process_tree_cpu_s(self.process.pid)
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float = START_TIMEOUT_S, *, count: int = 1) -> re.Match:
        """The `count`-th line matching `pattern`, once it is printed."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                found = [match for line in self.lines if (match := regex.search(line))]
                if len(found) >= count:
                    return found[count - 1]
                if self.process.poll() is not None and not self._reader.is_alive():
                    pytest.fail(f"daemon exited ({self.process.returncode}) before {pattern!r}:\n{self.stderr}")
                if time.monotonic() > deadline:
                    pytest.fail(f"no {pattern!r} from the daemon within {timeout_s} s:\n{self.stderr}")
                self._changed.wait(0.2)

    def wait_ready(self, *, probes: bool = True) -> re.Match:
        """Wait for "capturing on" and, with `probes`, for the probes and the cut to be attached or off."""
        ready = self.wait_for(READY_RE.pattern)
        if probes:
            self.wait_loaded(probes="eBPF probes loading" in ready.string)
        return ready

    def wait_loaded(self, *, probes: bool = True, count: int = 1) -> None:
        """Wait for the `count`-th run's payload line and (`probes`) its probes' line."""
        self.wait_for(PAYLOAD_RE.pattern, count=count)
        if probes:
            self.wait_for(PROBES_RE.pattern, count=count)

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        self.process.send_signal(signum)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float) -> int:
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"daemon still running {timeout_s} s later:\n{self.stderr}")
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def decode_zmtp(directory: Path, out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`dlcsniff decode` of a daemon's directory: its streams and its ZMTP messages (commands left out)."""
    done = subprocess.run([str(DLCSNIFF), "decode", str(directory), "--out", str(out)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    zmtp = pq.read_table(out / "zmtp.parquet").to_pandas()
    return pq.read_table(out / "streams.parquet").to_pandas(), zmtp[zmtp["command"].isna()]
