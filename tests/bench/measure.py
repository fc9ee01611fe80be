"""How `make bench` times a command: wall time, CPU time and peak memory of its whole process tree, over runs that
alternate with the commands it is compared with (the machine is shared: other work comes and goes), as medians.

- wall: from start to exit; cpu: user + system time of the command and every process it waited for (os.wait4),
  the figure least moved by other work on the machine;
- memory, sampled every SAMPLE_S: the peak resident set (RSS) of its largest process (each process's own
  high-water mark, VmHWM, as last seen: not the kernel's maxrss from wait4, which counts the pages of this
  process, the one that forked the command, up to its exec), and the peaks of the summed RSS of every process
  in the command's session (a forked worker's pages shared with its parent count twice) and of their summed
  proportional sets (PSS: a page shared by n processes counts 1/n in each, processes outside the command
  included).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass

SAMPLE_S = 0.01
MB = 2 ** 20


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    max_process_rss_mb: float
    peak_rss_mb: float
    peak_pss_mb: float
    finished: bool = True          # False: stopped at the time limit


def _session_memory(session: int) -> tuple[int, int, int]:
    """(summed RSS, summed PSS, the highest VmHWM) in bytes of the processes in one session."""
    rss = pss = hwm = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) != session:          # field 6 of stat: the session id
                continue
            with open(f"/proc/{entry.name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]) * 1024)
            with open(f"/proc/{entry.name}/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith(b"Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith(b"Pss:"):
                        pss += int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            continue
    return rss, pss, hwm


def measure(argv: list[str], *, env: dict | None = None, timeout_s: float | None = None) -> Run:
    """Run argv once (its own session, output discarded); a failure ends the benchmark with its stderr."""
    began = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            env=None if env is None else {**os.environ, **env})
    peak_rss = peak_pss = largest = 0
    finished = True
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if timeout_s is not None and time.perf_counter() - began > timeout_s:
            os.killpg(proc.pid, 9)
            finished = False
            continue
        rss, pss, hwm = _session_memory(proc.pid)
        peak_rss, peak_pss, largest = max(peak_rss, rss), max(peak_pss, pss), max(largest, hwm)
        time.sleep(SAMPLE_S)
    wall = time.perf_counter() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    if finished and proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.read().decode(errors='replace')}")
    proc.stderr.close()
    return Run(wall, usage.ru_utime + usage.ru_stime, largest / MB, peak_rss / MB, peak_pss / MB, finished)


def alternate(commands: dict[str, dict], repeat: int) -> dict[str, dict]:
    """Each command (label -> {"argv": [...], "env": {...}, "timeout_s": ...}) `repeat` times, in turn, one run
    of each per round: per label the medians of wall and CPU time, the highest peaks of memory, every run."""
    runs: dict[str, list[Run]] = {label: [] for label in commands}
    for _ in range(repeat):
        for label, spec in commands.items():
            runs[label].append(measure(spec["argv"], env=spec.get("env"), timeout_s=spec.get("timeout_s")))
    return {label: summarise(found) for label, found in runs.items()}


def summarise(runs: list[Run]) -> dict:
    return {"wall_s": round(statistics.median(r.wall_s for r in runs), 3),
            "cpu_s": round(statistics.median(r.cpu_s for r in runs), 3),
            "max_process_rss_mb": round(max(r.max_process_rss_mb for r in runs), 1),
            "peak_rss_mb": round(max(r.peak_rss_mb for r in runs), 1),
            "peak_pss_mb": round(max(r.peak_pss_mb for r in runs), 1),
            "finished": all(r.finished for r in runs),
            "runs": [{k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(r).items()} for r in runs]}


def compile_bytecode(repo) -> None:
    """Our modules' bytecode, compiled before anything is timed: a checkout run with PYTHONDONTWRITEBYTECODE=1
    would otherwise compile them from source on every run, as no installed copy does."""
    import compileall

    for package in ("dlcsniff", "decoders", "analysis", "sniffer"):
        compileall.compile_dir(repo / package, quiet=1)


def load() -> dict:
    """The machine's load average and cores, to read the figures by."""
    return {"cores": len(os.sched_getaffinity(0)), "load_average_1min": round(os.getloadavg()[0], 2)}
