"""`dlcsniff capture` run as a user runs it, for the capture daemon's tests and benchmarks."""
from __future__ import annotations

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


START_TIMEOUT_S = 120.0        # bcc compiles the probes at start: seconds on 2 busy cores


STOP_TIMEOUT_S = 5.0           # the promise for SIGTERM/SIGINT


class RunningDaemon:
    """`dlcsniff capture ARGS` started (in a namespace when given), its stderr collected as it comes."""

    def __init__(self, args: list[str], *, netns: str | None = None) -> None:
        argv = [str(DLCSNIFF), "capture", *args]
        if netns is not None:
            argv = ["ip", "netns", "exec", netns, *argv]
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float = START_TIMEOUT_S) -> re.Match:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for line in self.lines:
                    if found := regex.search(line):
                        return found
                if self.process.poll() is not None and not self._reader.is_alive():
                    pytest.fail(f"daemon exited ({self.process.returncode}) before {pattern!r}:\n{self.stderr}")
                if time.monotonic() > deadline:
                    pytest.fail(f"no {pattern!r} from the daemon within {timeout_s} s:\n{self.stderr}")
                self._changed.wait(0.2)

    def wait_ready(self) -> re.Match:
        return self.wait_for(READY_RE.pattern)

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
