"""What users of command-line tools expect, command by command, as they would type it (the installed
`dlcsniff` in a subprocess: stdout a pipe, as in a script): -h and -V, flags shown without a value, --json on
every command that prints a result, whole tables through a pipe, -q and -v, numbers out of range refused."""
from __future__ import annotations

import json
import subprocess

import pytest

from dlcsniff.cli import app
from tests.conftest import PCAPS, REPO

DLCSNIFF = REPO / ".venv" / "bin" / "dlcsniff"
COMMANDS = sorted(command.name or command.callback.__name__ for command in app.registered_commands)


def run(*args, check: bool = True, columns: int = 80) -> subprocess.CompletedProcess:
    result = subprocess.run([str(DLCSNIFF), *map(str, args)], capture_output=True, text=True, env={
        "PATH": "/usr/bin:/bin", "COLUMNS": str(columns), "LC_ALL": "C.UTF-8"})
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_short_options_for_help_and_version():
    assert run("-V").stdout.startswith("dlcsniff ")
    assert "Usage: dlcsniff" in run("-h").stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_short_help_and_flags_without_a_value(command):
    text = run(command, "-h").stdout
    assert "Usage: dlcsniff " + command in text
    assert "<bool>" not in text, text


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    out = tmp_path_factory.mktemp("decoded") / "sync"
    run("decode", PCAPS / "mxnet_sync", "--out", out)
    return out


@pytest.mark.parametrize("args", [
    ["dlc", "{decoded}", "--out", "{tmp}/dlc"],
    ["stats", "{decoded}", "--out", "{tmp}/stats"],
    ["report", "{decoded}", "--out", "{tmp}/report.html"],
    ["export", "{decoded}", "--format", "chrome", "--out", "{tmp}/trace.json"],
    ["export", "{decoded}", "--format", "chakra", "--out", "{tmp}/et"],
    ["decode", PCAPS / "zmq", "--out", "{tmp}/zmq"],
], ids=lambda args: "-".join(str(a) for a in args[:3] if "{" not in str(a) and "/" not in str(a)))
def test_every_command_that_prints_a_result_prints_it_as_json(args, decoded, tmp_path):
    argv = [str(a).format(decoded=decoded, tmp=tmp_path) for a in args]
    result = json.loads(run(*argv, "--json").stdout)
    assert isinstance(result, dict) and result


def test_tables_stay_whole_through_a_pipe(decoded, tmp_path):
    """Through a pipe there is no terminal width to fit: no row of a table is cut or folded."""
    text = run("stats", decoded, "--out", tmp_path / "stats", columns=40).stdout
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert rows and not any("…" in row for row in rows)
    # each row on one line: a metric's name and its value together, however narrow the terminal says it is
    assert any("mean overlap ratio" in row and "%" in row for row in rows)


def test_quiet_prints_nothing_but_errors_and_verbose_says_how_long(tmp_path):
    assert run("-q", "decode", PCAPS / "zmq", "--out", tmp_path / "q").stdout == ""
    verbose = run("-v", "decode", PCAPS / "zmq", "--out", tmp_path / "v")
    assert "decoded " in verbose.stderr and " s" in verbose.stderr
    failed = run("-q", "decode", PCAPS / "zmq", "--out", tmp_path / "q", check=False)   # not without --force
    assert failed.returncode == 1 and "error:" in failed.stderr
    # after the command name too, where users type them; -- ends the options
    assert run("decode", PCAPS / "zmq", "--out", tmp_path / "q2", "-q").stdout == ""
    assert "decoded " in run("decode", PCAPS / "zmq", "--out", tmp_path / "v2", "--verbose").stderr
    both = run("-q", "decode", PCAPS / "zmq", "--out", tmp_path / "qv", "-v", check=False)
    assert both.returncode == 1 and "exclude each other" in both.stderr
    literal = run("decode", "--out", tmp_path / "dash", "--", "-q", check=False)
    assert literal.returncode == 1 and "-q: no such file" in literal.stderr


@pytest.mark.parametrize("args", [
    ["decode", PCAPS / "zmq", "--out", "{tmp}/o", "--workers", "-3"],
    ["stats", PCAPS / "zmq", "--out", "{tmp}/o", "--engine", "dask", "--workers", "0"],
])
def test_numbers_out_of_range_are_refused_before_any_work(args, tmp_path):
    result = run(*(str(a).format(tmp=tmp_path) for a in args), check=False)
    assert result.returncode == 2 and "Invalid value for '--workers'" in result.stderr
    assert not (tmp_path / "o").exists()


def test_a_flag_does_not_take_the_next_argument_as_its_value(tmp_path):
    """`decode --json true x`: true is a capture path (a flag has no value), and the error says so."""
    result = run("decode", "--json", "true", PCAPS / "zmq", "--out", tmp_path / "o", check=False)
    assert result.returncode == 1 and "true: no such file" in result.stderr


def test_the_program_leaves_with_its_exit_code_its_output_and_its_exit_handlers(tmp_path):
    """`dlcsniff` skips the interpreter's teardown (dlcsniff.cli._leave): what it printed, its exit code and
    the exit handlers registered (atexit) must all still be there, through pipes."""
    program = ("import atexit, sys\n"
               "atexit.register(lambda: print('handler ran', file=sys.stderr))\n"
               "from dlcsniff.cli import main\n"
               "main()\n")
    script = tmp_path / "program.py"
    script.write_text(program)
    python = str(REPO / ".venv" / "bin" / "python")

    def program_run(*args):
        return subprocess.run([python, str(script), *map(str, args)], capture_output=True, text=True)

    version = program_run("-V")
    assert version.returncode == 0 and version.stdout.startswith("dlcsniff ")
    assert version.stderr == "handler ran\n"
    decoded = program_run("decode", PCAPS / "zmq", "--out", tmp_path / "out", "--json")
    assert decoded.returncode == 0, decoded.stderr
    assert json.loads(decoded.stdout)["packets"] > 0 and decoded.stderr.endswith("handler ran\n")
    missing = program_run("decode", tmp_path / "nothing.pcap", "--out", tmp_path / "out2")
    assert missing.returncode == 1 and "no such file" in missing.stderr and missing.stderr.endswith("handler ran\n")
    unknown = program_run("no-such-command")
    assert unknown.returncode == 2 and unknown.stderr.endswith("handler ran\n")
