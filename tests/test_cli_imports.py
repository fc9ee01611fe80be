"""Each command loads what it uses, no more (issue 11: start-up): `import dlcsniff.cli` and the help of every
command load none of the heavy libraries, and decoding loads neither Dask, matplotlib nor bcc. Behaviour, not
timing: which modules a fresh interpreter holds once the command is done (the figures are `make bench`'s)."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from dlcsniff.cli import commands
from tests.conftest import PCAPS, REPO

PYTHON = REPO / ".venv" / "bin" / "python"
COMMANDS = sorted(commands.COMMANDS)
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


# Runs the CLI as the program (main, no argv), then prints the command modules of dlcsniff.cli loaded.
PROGRAM = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(set(sys.modules) & set(COMMANDS.values()))), file=sys.stderr))
from dlcsniff.cli.commands import COMMANDS
sys.argv = ["dlcsniff", *json.loads(sys.argv[1])]
from dlcsniff.cli import main
main()
"""


def program_modules(*args) -> tuple[subprocess.CompletedProcess, list[str]]:
    result = subprocess.run([str(PYTHON), "-c", PROGRAM, json.dumps([str(a) for a in args])], capture_output=True,
                            text=True, timeout=300)
    return result, json.loads(result.stderr.strip().splitlines()[-1])


def test_the_program_loads_the_module_of_its_command_only(tmp_path):
    done, modules = program_modules("decode", PCAPS / "zmq", "--out", tmp_path / "out", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["packets"] > 0, done.stderr
    assert modules == ["dlcsniff.cli.decode"]
    done, modules = program_modules("stats", "-h")
    assert done.returncode == 0 and "Usage: dlcsniff stats" in done.stdout
    assert modules == ["dlcsniff.cli.analyse"]


@pytest.mark.parametrize("args, code", [(["--help"], 0), ([], 2), (["decod"], 2)], ids=str)
def test_the_whole_list_loads_every_command(args, code):
    """The program's help lists every command, in COMMANDS' order; an unknown name's error suggests the close
    ones (click's, from every command's name)."""
    done, modules = program_modules(*args)
    assert done.returncode == code and modules == sorted(set(commands.COMMANDS.values()))
    listed = re.findall(r"^│ (\w+) ", done.stdout, re.MULTILINE)
    assert listed == ([] if args == ["decod"] else list(commands.COMMANDS))
    if args == ["decod"]:
        assert done.stderr.startswith("error: No such command 'decod'. Did you mean 'decode'?")


def test_every_command_is_in_the_module_commands_names():
    """Each module registers, in the order COMMANDS lists them, the commands COMMANDS says it does: no command
    missing from the program's list, none the program would look for in the wrong module."""
    code = ("import json, typer.main\n"
            "from dlcsniff.cli.app import app\n"
            "from dlcsniff.cli.commands import COMMANDS\n"
            "for module in dict.fromkeys(COMMANDS.values()):\n"
            "    __import__(module)\n"
            "print(json.dumps([[info.name or typer.main.get_command_name(info.callback.__name__),\n"
            "                   info.callback.__module__] for info in app.registered_commands]))\n")
    result = subprocess.run([str(PYTHON), "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == [list(item) for item in commands.COMMANDS.items()]
