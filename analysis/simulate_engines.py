"""The network simulators a replay can run on, each simulation in a process of its own.

SimGrid's engine and ns-3's simulator are process-wide singletons (SimGrid aborts on a second engine): every
replay runs in a forked child, which sends its result back through a pipe (a pickle) and exits. Several
replays (a what-if curve) run side by side, one child per core at most. Each child imports its simulator:
a process that once loaded ns-3 (cppyy, which installs its own signal handlers) cannot run SimGrid after it.
"""
from __future__ import annotations

import os
import pickle
import selectors
import struct
import tempfile
import time
from collections.abc import Sequence

import pandas as pd

from dlcsniff.analysis.simulate_network import Links
from dlcsniff.analysis.simulate_replay import Program, ReplayError, replay

ENGINES = ("simgrid", "ns3")
_LENGTH = struct.Struct("<Q")


def _simulate(engine: str, program: Program, links: Links) -> pd.DataFrame:
    if engine == "simgrid":
        import dlcsniff.analysis.simulate_simgrid as simulator
    elif engine == "ns3":
        import dlcsniff.analysis.simulate_ns3 as simulator
    else:
        raise ReplayError(f"unknown engine {engine!r} (one of {', '.join(ENGINES)})")
    return simulator.run(links, lambda network: replay(program, network))


def _child(engine: str, program: Program, links: Links, write_fd: int) -> None:
    try:
        began = time.perf_counter()
        times = _simulate(engine, program, links)
        times.attrs["wall_s"] = time.perf_counter() - began
        outcome = ("result", times)
    except ReplayError as exc:
        outcome = ("error", str(exc))
    except BaseException as exc:                              # reported to the parent, never a traceback
        outcome = ("error", f"the {engine} simulation failed: {type(exc).__name__}: {exc}")
    data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    with os.fdopen(write_fd, "wb") as out:
        out.write(_LENGTH.pack(len(data)) + data)


def _fork(engine: str, program: Program, links: Links, stderr_path: str) -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 0
        try:
            # the simulators' own chatter (SimGrid's configuration, cppyy's JIT) goes to a file the parent reads
            # only when the child dies
            with open(stderr_path, "wb") as stderr:
                os.dup2(stderr.fileno(), 2)
            _child(engine, program, links, write_fd)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, "rb") as said:
            return " / ".join(said.read().decode(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def simulate_all(engine: str, runs: Sequence[tuple[Program, Links]], processes: int | None = None
                 ) -> list[pd.DataFrame]:
    """Replay each (program, links) on `engine`, up to `processes` at once (default: one per core); the
    message times of each (simulate_replay.TIMES_COLUMNS; attrs["wall_s"]: the simulation's wall time), in
    order."""
    if engine not in ENGINES:
        raise ReplayError(f"unknown engine {engine!r} (one of {', '.join(ENGINES)})")
    processes = max(1, processes or os.cpu_count() or 1)
    results: list[pd.DataFrame | None] = [None] * len(runs)
    waiting = list(enumerate(runs))
    running: dict[int, tuple[int, int, bytearray]] = {}       # read fd -> (run, pid, bytes so far)
    errors = []
    with selectors.DefaultSelector() as selector, tempfile.TemporaryDirectory(prefix="dlcsniff-simulate-") as logs:
        while waiting or running:
            while waiting and len(running) < processes:
                index, (program, links) = waiting.pop(0)
                pid, fd = _fork(engine, program, links, os.path.join(logs, f"{index}.stderr"))
                running[fd] = (index, pid, bytearray())
                selector.register(fd, selectors.EVENT_READ)
            for key, _ in selector.select():
                fd = key.fd
                index, pid, buffer = running[fd]
                chunk = os.read(fd, 1 << 20)
                if chunk:
                    buffer += chunk
                    continue
                selector.unregister(fd)
                os.close(fd)
                del running[fd]
                _, status = os.waitpid(pid, 0)
                if len(buffer) < _LENGTH.size:
                    said = _tail(os.path.join(logs, f"{index}.stderr"))
                    errors.append(f"the {engine} simulation died (wait status {status})"
                                  + (f": {said}" if said else ""))
                    continue
                kind, value = pickle.loads(bytes(buffer[_LENGTH.size:]))
                if kind == "error":
                    errors.append(value)
                else:
                    results[index] = value
    if errors:
        raise ReplayError(errors[0])
    return results
