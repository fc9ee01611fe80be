"""What users of command-line tools expect, command by command, as they would type it (the installed
`dlcsniff` in a subprocess: stdout a pipe, as in a script): -h and -V, flags shown without a value, --json on
every command that prints a result, whole tables through a pipe, -q and -v, numbers out of range refused."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from dlcsniff.cli import commands
from tests.conftest import PCAPS, REPO

DLCSNIFF = REPO / ".venv" / "bin" / "dlcsniff"
COMMANDS = sorted(commands.COMMANDS)


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



# A measured figure: a cost in points, a share, a ratio, a time (figures go stale: they belong in README and the
# bench, not in --help). Limits and rules (64 KiB, 0700) and the spellings of a value (90s) are not measurements.
MEASURED_FIGURE = r"\d+(\.\d+)?(\s*(points?\b|%|×)|\s+(x|s|ms|seconds?)\b)"


def test_capture_help_quotes_no_measured_figure():
    """Issue 21 item 4: `--zmq-events` quoted the points its choices cost on one machine, once."""
    import re

    text = " ".join(run("capture", "-h", columns=1000).stdout.split())
    assert re.findall(MEASURED_FIGURE, text) == [], text

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


STEP = re.compile(r"^ *\S.* in [0-9]+\.[0-9]{2} s$")          # -v's line for a step: "<what> in 0.52 s"


VERBOSE_RUNS = [
    ["decode", PCAPS / "zmq", "--out", "{tmp}/o"],
    ["dlc", "{decoded}", "--out", "{tmp}/dlc"],
    ["stats", "{decoded}", "--out", "{tmp}/stats"],
    ["report", "{decoded}", "--out", "{tmp}/report.html"],
    ["export", "{decoded}", "-F", "chrome", "--out", "{tmp}/trace.json"],
    ["diagnose", "{decoded}"],
    ["simulate", "{decoded}", "--out", "{tmp}/sim"],
    ["schema", "events"],
    ["wireshark", "--out", "{tmp}/plugins"],
    ["capture", "--print-bpf"],
]


def test_every_command_is_run_verbose():
    assert sorted(args[0] for args in VERBOSE_RUNS) == COMMANDS


@pytest.mark.parametrize("args", VERBOSE_RUNS, ids=lambda args: str(args[0]))
def test_verbose_says_what_each_step_took_on_every_command(args, decoded, tmp_path):
    """-v: one line a step on stderr, `<what> in <seconds> s`; without it, none (stdout the same result)."""
    argv = [str(a).format(decoded=decoded, tmp=tmp_path) for a in args]
    verbose = run("-v", *argv)
    steps = [line for line in verbose.stderr.splitlines() if not line.startswith("warning: ")]
    assert steps and all(STEP.match(line) for line in steps), verbose.stderr
    plain = run(*argv, "--force") if "--out" in argv else run(*argv)
    assert not [line for line in plain.stderr.splitlines() if STEP.match(line)], plain.stderr


@pytest.mark.parametrize("args", [
    ["decode", PCAPS / "zmq", "--out", "{tmp}/o", "--processes", "-3"],
    ["stats", PCAPS / "zmq", "--out", "{tmp}/o", "--engine", "dask", "--processes", "0"],
])
def test_numbers_out_of_range_are_refused_before_any_work(args, tmp_path):
    result = run(*(str(a).format(tmp=tmp_path) for a in args), check=False)
    assert result.returncode == 2 and "Invalid value for '--processes'" in result.stderr
    assert not (tmp_path / "o").exists()


def test_a_path_is_printed_as_given(tmp_path):
    """A name that reads like an emoji code (rich's `:b:`, `:cat:`) stays as it is in what dlcsniff prints."""
    missing = tmp_path / "node:b:1" / "c:cat:"
    result = run("decode", missing, "--out", tmp_path / "o", check=False)
    assert result.returncode == 1 and f"{missing}: no such file" in result.stderr, result.stderr


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


def test_ctrl_c_while_the_command_line_loads_ends_the_program_without_a_traceback(tmp_path):
    """^C in the tenth of a second typer, rich and the command's modules load (dlcsniff.program) ends the program
    as ^C does once it runs: exit status 130 and nothing on stderr. The interrupt is raised where a real one lands
    most often, while dlcsniff.cli is imported."""
    script = tmp_path / "program.py"
    script.write_text("import sys\n"
                      "class Interrupt:\n"
                      "    def find_spec(self, name, path=None, target=None):\n"
                      "        if name == 'dlcsniff.cli':\n"
                      "            raise KeyboardInterrupt\n"
                      "sys.meta_path.insert(0, Interrupt())\n"
                      "from dlcsniff.program import main\n"
                      "main()\n")
    result = subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(script), "-V"],
                            capture_output=True, text=True)
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "")
    entry = [line for line in (REPO / "pyproject.toml").read_text().splitlines() if line.startswith("dlcsniff =")]
    assert entry == ['dlcsniff = "dlcsniff.program:main"']


def test_the_program_seldom_walks_what_lives_to_its_end(tmp_path):
    """A decode allocates mostly what lives to its end (modules, tables): the program's garbage collector makes
    few young collections over it (dlcsniff.cli.GC_THRESHOLDS; the interpreter's default made hundreds on a small
    capture), and still finds the garbage cycles there are (gc.collect after each capture)."""
    script = tmp_path / "program.py"
    script.write_text("import atexit, gc, json, sys\n"
                      "atexit.register(lambda: print(json.dumps(gc.get_stats()), file=sys.stderr))\n"
                      "from dlcsniff.cli import main\n"
                      "main()\n")
    result = subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(script), "decode",
                             str(PCAPS / "mxnet_sparse" / "worker1.pcap.gz"), "--out", str(tmp_path / "out"),
                             "--processes", "0", "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    young, _, oldest = json.loads(result.stderr.strip().splitlines()[-1])
    assert young["collections"] < 50
    assert oldest["collected"] > 0


@pytest.mark.parametrize("command", [["stats"], ["dlc"], ["diagnose"], ["simulate"],
                                     ["export", "--format", "chakra"],
                                     ["export", "--format", "chrome", "--out", "{tmp}/out/trace.json"],
                                     ["report", "--out", "{tmp}/out/report.html"]])
def test_a_directory_that_is_no_decode_output_is_refused_before_any_output_is_made(command, tmp_path):
    """`stats DIR --out OUT` on a directory `decode` did not write said so only after making OUT, left empty
    (`export --format chrome` made the trace's folder)."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a decode output\n")
    out = [] if "--out" in command else ["--out", tmp_path / "out"]
    result = run(command[0], tmp_path / "notes", *(a.format(tmp=tmp_path) for a in command[1:]), *out, check=False)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "not the output of `dlcsniff decode`" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()
