"""A job as a program of messages, and its replay over a simulated network.

A `Program` is what `dlcsniff simulate` replays: every message a job sends (source and destination node, size),
and when each may leave. A message is *issued* once every message it depends on was delivered (or, for an
"issued" dependency, issued) and then `delay_s` more seconds passed (the computation between them); a message
without dependencies is issued `delay_s` after the start. Issued messages leave in order on their connection
(one TCP connection per direction and pair of nodes, as ps-lite's and Gloo's are): a message starts when the
one before it on the connection was delivered, and its transfer is the network simulator's (simulate_simgrid,
simulate_ns3). So a message is dated as a capture dates it: its send by the first byte on the wire (`start_s`),
its receipt by the last (`end_s`).

`replay` is the event loop both simulators share: it knows nothing of the network beyond `Network` (start a
transfer; let simulated time run to a date or to the next delivery).
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

DELIVERED, ISSUED = 0, 1          # what a dependency waits for
PROGRAM_COLUMNS = ("src", "dst", "size_bytes", "delay_s")
TIMES_COLUMNS = ("issue_s", "start_s", "end_s")
_EPSILON_S = 1e-12


class ReplayError(Exception):
    """The program cannot be replayed (a dependency cycle, a message nothing delivers)."""


@dataclass(frozen=True, slots=True)
class Program:
    """messages: PROGRAM_COLUMNS, one row per message (row number = message id; src/dst are node indices), and
    optionally `message`: the job's message a row is a part of (a message sent in parts, see `message_times`);
    deps: child, parent (message ids) and kind (DELIVERED or ISSUED)."""

    messages: pd.DataFrame
    deps: pd.DataFrame
    nodes: int

    def __post_init__(self) -> None:
        bad = self.deps[(self.deps["child"] == self.deps["parent"])]
        if len(bad):
            raise ReplayError(f"message {int(bad['child'].iloc[0])} depends on itself")


class Network(Protocol):
    """A simulated network as the replay drives it."""

    def now(self) -> float: ...

    def start(self, message: int, src: int, dst: int, size_bytes: float) -> None:
        """Begin transferring a message now."""

    def advance(self, until_s: float) -> list[tuple[int, float]]:
        """Let simulated time run until the next delivery (returned with its time) or until `until_s`
        (math.inf: until the next delivery), whichever comes first."""


def _children(deps: pd.DataFrame, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of the dependency graph by parent: (offsets, child, kind)."""
    order = np.argsort(deps["parent"].to_numpy(), kind="stable")
    parent = deps["parent"].to_numpy()[order]
    offsets = np.searchsorted(parent, np.arange(n + 1))
    return offsets, deps["child"].to_numpy()[order], deps["kind"].to_numpy()[order]


def replay(program: Program, network: Network) -> pd.DataFrame:
    """Every message's issue, start (first byte) and end (last byte delivered) in simulated seconds
    (TIMES_COLUMNS, one row per message of the program)."""
    messages = program.messages
    n = len(messages)
    src = messages["src"].to_numpy(np.int64)
    dst = messages["dst"].to_numpy(np.int64)
    size = messages["size_bytes"].to_numpy(np.float64)
    delay = messages["delay_s"].to_numpy(np.float64)
    offsets, child, kind = _children(program.deps, n)
    waiting = np.bincount(program.deps["child"].to_numpy(np.int64), minlength=n)
    ready_at = np.zeros(n)
    issue, start, end = (np.full(n, np.nan) for _ in range(3))
    timers = [(float(delay[m]), int(m)) for m in np.flatnonzero(waiting == 0)]
    heapq.heapify(timers)
    queues: dict[tuple[int, int], deque] = {}
    busy: set[tuple[int, int]] = set()
    in_flight = 0

    def satisfied(parent: int, kind_done: int, at: float) -> None:
        for i in range(offsets[parent], offsets[parent + 1]):
            if kind[i] != kind_done:
                continue
            c = child[i]
            ready_at[c] = max(ready_at[c], at)
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(timers, (ready_at[c] + delay[c], int(c)))

    def begin(message: int, at: float) -> None:
        nonlocal in_flight
        start[message] = at
        in_flight += 1
        network.start(message, int(src[message]), int(dst[message]), float(size[message]))

    while True:
        now = network.now()
        while timers and timers[0][0] <= now + _EPSILON_S:
            _, message = heapq.heappop(timers)
            issue[message] = now
            satisfied(message, ISSUED, now)
            connection = (int(src[message]), int(dst[message]))
            if connection in busy:
                queues.setdefault(connection, deque()).append(message)
            else:
                busy.add(connection)
                begin(message, now)
        if not timers and in_flight == 0:
            break
        for message, at in network.advance(timers[0][0] if timers else math.inf):
            in_flight -= 1
            end[message] = at
            satisfied(message, DELIVERED, at)
            connection = (int(src[message]), int(dst[message]))
            queue = queues.get(connection)
            if queue:
                begin(queue.popleft(), at)
            else:
                busy.discard(connection)
    stuck = int(np.isnan(end).sum())
    if stuck:
        raise ReplayError(f"{stuck} of {n} messages were never sent: their dependencies form a cycle or wait "
                          "for a message the program does not hold")
    return pd.DataFrame({"issue_s": issue, "start_s": start, "end_s": end})


def message_times(program: Program, times: pd.DataFrame) -> pd.DataFrame:
    """The replay's times per job message when the program sends some in parts (its `message` column): issued
    and started with its first part, delivered with its last; `times` itself otherwise."""
    if "message" not in program.messages.columns:
        return times
    parts = times.assign(message=program.messages["message"].to_numpy())
    found = parts.groupby("message", sort=True).agg(issue_s=("issue_s", "min"), start_s=("start_s", "min"),
                                                    end_s=("end_s", "max"))
    return found.reset_index(drop=True).rename_axis(None)
