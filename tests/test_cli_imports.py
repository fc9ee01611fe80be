"""Each command loads what it uses, no more (issue 11: start-up): `import dlcsniff.cli` and the help of every
command load none of the heavy libraries, and decoding loads neither Dask, matplotlib nor bcc. Behaviour, not
timing: which modules a fresh interpreter holds once the command is done (the figures are `make bench`'s)."""
from __future__ import annotations

import json
import subprocess

import pytest

from dlcsniff.cli import app
from tests.conftest import PCAPS, REPO

PYTHON = REPO / ".venv" / "bin" / "python"
COMMANDS = sorted(command.name or command.callback.__name__ for command in app.registered_commands)
HEAVY = ("pandas", "numpy", "pyarrow", "dask", "distributed", "matplotlib", "bcc", "pydantic", "google", "scapy",
         "dpkt", "zmq")
# Runs the CLI as the installed script does, then prints the top-level packages loaded (on stderr's last line).
RUN = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})), file=sys.stderr))
sys.argv = ["dlcsniff", *json.loads(sys.argv[1])]
from dlcsniff.cli import app
app(prog_name="dlcsniff")
"""


def loaded(*args) -> set[str]:
    result = subprocess.run([str(PYTHON), "-c", RUN, json.dumps([str(a) for a in args])], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stderr.strip().splitlines()[-1]))


def test_importing_the_cli_loads_nothing_heavy():
    result = subprocess.run([str(PYTHON), "-c", "import sys, dlcsniff.cli; print(' '.join(sys.modules))"],
                            capture_output=True, text=True, check=True)
    assert not {name.split(".")[0] for name in result.stdout.split()} & set(HEAVY)


@pytest.mark.parametrize("args", [["--help"], *([command, "--help"] for command in COMMANDS)], ids=" ".join)
def test_help_loads_nothing_heavy(args):
    assert not loaded(*args) & set(HEAVY)


def test_decoding_loads_neither_dask_nor_plotting_nor_bcc(tmp_path):
    modules = loaded("decode", PCAPS / "mxnet_sync", "--out", tmp_path / "out", "--processes", "1", "--engine",
                     "pandas", "--no-progress")
    assert {"numpy", "pyarrow"} <= modules              # it did decode and write the tables
    # nor pydantic: typer would coerce every parameter through it (dlcsniff/cli/coercion.py)
    assert not modules & {"dask", "distributed", "matplotlib", "bcc", "scapy", "dpkt", "zmq", "pydantic"}
