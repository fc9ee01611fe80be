"""How busy the machine's cores were over a stretch of wall-clock time: /proc/stat's CPU line sampled every
SAMPLE_S in a thread while a job runs, read afterwards over the window the job's own records date (its training
steps, not its start-up).

busy share = 1 - (idle + iowait) / all, summed over every core; interrupts = (irq + softirq) / all.
"""
from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass

SAMPLE_S = 0.05
_IDLE, _IOWAIT, _IRQ, _SOFTIRQ = 3, 4, 5, 6


def _cpu_line() -> list[int]:
    with open("/proc/stat") as stat:
        return [int(value) for value in stat.readline().split()[1:]]


@dataclass(frozen=True, slots=True)
class Load:
    busy_share: float
    interrupt_share: float
    seconds: float


class MachineLoad:
    """`with MachineLoad() as load: ...` then `load.over(first_s, last_s)` (time.time() seconds)."""

    def __init__(self) -> None:
        self._times: list[float] = []
        self._samples: list[list[int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self._times.append(time.time())
            self._samples.append(_cpu_line())
            if self._stop.wait(SAMPLE_S):
                return

    def __enter__(self) -> MachineLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def over(self, first_s: float, last_s: float) -> Load | None:
        """The cores' load between the samples just inside [first_s, last_s]; None when the window holds fewer
        than two samples."""
        first = bisect.bisect_left(self._times, first_s)
        last = bisect.bisect_right(self._times, last_s) - 1
        if last <= first:
            return None
        spent = [after - before for before, after in zip(self._samples[first], self._samples[last])]
        total = sum(spent)
        if total <= 0:
            return None
        return Load(1 - (spent[_IDLE] + spent[_IOWAIT]) / total, (spent[_IRQ] + spent[_SOFTIRQ]) / total,
                    self._times[last] - self._times[first])
