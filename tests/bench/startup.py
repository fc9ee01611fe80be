"""Benchmark of start-up (`make bench`, section startup; issue 11, item 1).

- `dlcsniff decode` of a small bundled capture (a node of a real MXNet job, 391 kB gzip-compressed) against
  `tshark -r F -q -z conv,tcp` on the same file, alternated; targets: at most half of tshark's time, peak
  memory under 100 MB;
- `--help` of dlcsniff and of every command; target: under 0.15 s;
- beside them the floors under any decode in Python that writes Parquet with pyarrow: the interpreter alone, the
  CLI's own libraries (typer, rich), pyarrow.parquet, and pandas with it (the decode's timeline and the
  collective tables are computed with pandas); and a typer command of decode's parameter kinds parsing its
  arguments (tests/bench/cli_floor.py: typer builds a pydantic adapter per parameter), alone and then importing
  pyarrow.parquet and pandas: what `dlcsniff decode` loads before it reads a packet, the floor of target 1.

Our modules' bytecode is compiled first (tests.bench.measure.compile_bytecode: 0.1 s of a small decode).
"""
from __future__ import annotations

from tests.bench.__main__ import OUT, REPO, VENV_BIN
from tests.bench.measure import alternate, compile_bytecode, load

SMALL = REPO / "pcaps" / "mxnet_sparse" / "worker1.pcap.gz"
REPEAT = 7
PYTHON = str(VENV_BIN / "python")
DLCSNIFF = str(VENV_BIN / "dlcsniff")
FLOORS = {
    "python -c pass": "pass",
    "python: import typer, rich (the CLI's floor)": "import typer, rich.console",
    "python: import pyarrow.parquet": "import pyarrow.parquet",
    "python: import pandas, pyarrow.parquet": "import pandas, pyarrow.parquet",
}


CLI_FLOOR = str(REPO / "tests" / "bench" / "cli_floor.py")
CLI_FLOORS = {
    "typer command parsing decode's arguments": "",
    "typer command parsing decode's arguments, then pyarrow.parquet and pandas": "pyarrow.parquet,pandas",
}


def run() -> dict:
    from dlcsniff.cli.commands import COMMANDS

    compile_bytecode(REPO)
    before = load()
    decode = {
        "dlcsniff decode": {"argv": [DLCSNIFF, "decode", str(SMALL), "--out", str(OUT / "startup-decoded"),
                                     "--force"]},
        "tshark -q -z conv,tcp": {"argv": ["tshark", "-r", str(SMALL), "-q", "-z", "conv,tcp"]},
        **{label: {"argv": [PYTHON, "-c", code]} for label, code in FLOORS.items()},
        **{label: {"argv": [PYTHON, CLI_FLOOR, str(SMALL), "--out", str(OUT / "startup-floor")],
                   "env": {"DLCSNIFF_FLOOR_IMPORTS": imports}} for label, imports in CLI_FLOORS.items()},
    }
    decode_runs = alternate(decode, REPEAT)
    commands = sorted(COMMANDS)
    helps = alternate({" ".join(["dlcsniff", *args, "--help"]): {"argv": [DLCSNIFF, *args, "--help"]}
                       for args in [[], *([c] for c in commands)]}, REPEAT)
    ours, tshark = decode_runs["dlcsniff decode"], decode_runs["tshark -q -z conv,tcp"]
    floor = decode_runs["typer command parsing decode's arguments, then pyarrow.parquet and pandas"]
    slowest_help = max(helps.values(), key=lambda r: r["wall_s"])
    return {
        "capture": str(SMALL.relative_to(REPO)), "capture_kb": round(SMALL.stat().st_size / 1024),
        "repeat": REPEAT, "machine": {"before": before, "after": load()},
        "decode": decode_runs, "help": {label: {k: v for k, v in r.items() if k != "runs"} for label, r in helps.items()},
        "ratios": {
            "decode_vs_tshark_wall": round(ours["wall_s"] / tshark["wall_s"], 2),
            "decode_vs_tshark_cpu": round(ours["cpu_s"] / tshark["cpu_s"], 2),
            "pyarrow_floor_vs_tshark_cpu": round(decode_runs["python: import pyarrow.parquet"]["cpu_s"]
                                                 / tshark["cpu_s"], 2),
            # what the decode loads before any work, against tshark's whole run: above 0.5, target 1 is out of
            # reach for any decode built on typer, pyarrow and pandas
            "decode_floor_vs_tshark_wall": round(floor["wall_s"] / tshark["wall_s"], 2),
            "decode_vs_its_floor_wall": round(ours["wall_s"] / floor["wall_s"], 2),
        },
        "targets": {
            "decode at most half of tshark's time (wall)": ours["wall_s"] <= 0.5 * tshark["wall_s"],
            "decode peak RSS under 100 MB": ours["max_process_rss_mb"] < 100,
            "every --help under 0.15 s (wall)": slowest_help["wall_s"] < 0.15,
            "every --help under 0.15 s (cpu)": max(r["cpu_s"] for r in helps.values()) < 0.15,
        },
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
