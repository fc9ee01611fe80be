"""One vocabulary on the command line (issue 20): an option's name means one thing in every command, walked on
typer's click command tree; the renamed options' old spellings still work, with a one-line warning; every
error is one line `error: ...` with the exit codes the help and the README state."""
from __future__ import annotations

import collections
import re
import subprocess

import pytest
import typer.main

from dlcsniff.cli import app
from dlcsniff.cli.app import EXIT_CODES, respell
from tests.conftest import PCAPS, REPO

DLCSNIFF = REPO / ".venv" / "bin" / "dlcsniff"
GROUP = typer.main.get_command(app)
# every command, as click's help and completion find them (the group builds a command when first asked for it)
COMMANDS = dict(sorted((name, GROUP.get_command(GROUP.context_class(GROUP), name))
                       for name in GROUP.list_commands(GROUP.context_class(GROUP))))


def _options(command) -> list:
    """The options a command shows (hidden ones are old spellings kept for scripts, e.g. --rotate-mb)."""
    return [param for param in command.params if param.param_type_name == "option" and not param.hidden]


def _shown(command, option) -> str:
    """How the help shows the option: its names and its value ("-o, --out <path>", "--force")."""
    ctx = command.make_context(command.name, [], resilient_parsing=True)
    return option.get_help_record(ctx)[0]


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(DLCSNIFF), *map(str, args)], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "80", "LC_ALL": "C.UTF-8"})


def test_an_option_name_means_one_thing_in_every_command():
    """The same names together (-o is --out), the same kind of value (a flag, N, EXPR, a choice of the same
    words) wherever a name is used."""
    shown = collections.defaultdict(set)
    for name, command in COMMANDS.items():
        for option in _options(command):
            for spelling in option.opts + option.secondary_opts:
                shown[spelling].add(_shown(command, option))
    assert {spelling: forms for spelling, forms in shown.items() if len(forms) > 1} == {}


def test_the_decided_names():
    """decode/stats count processes (--processes), simulate's what-if counts training workers
    (--training-workers) on a --simulator; no command has --workers; -f is --filter, export's format -F."""
    names = {name: {spelling for option in _options(command) for spelling in option.opts + option.secondary_opts}
             for name, command in COMMANDS.items()}
    assert not [name for name, spellings in names.items() if "--workers" in spellings]
    assert {"--processes"} <= names["decode"] & names["stats"]
    assert {"--training-workers", "--simulator"} <= names["simulate"] and "--engine" not in names["simulate"]
    assert {"-F", "--format"} <= names["export"] and "-f" not in names["export"]
    assert [name for name, spellings in names.items() if "-f" in spellings] == ["capture", "decode"]


def test_every_command_that_writes_an_output_takes_force():
    """--out or --install: the command writes, and --force is how an earlier output is replaced. capture is the
    exception: its directory is never emptied, a restart adds a new file set."""
    writers = {name for name, command in COMMANDS.items()
               if {"--out", "--install"} & {s for option in _options(command) for s in option.opts}}
    forced = {name for name, command in COMMANDS.items() if any("--force" in o.opts for o in _options(command))}
    assert writers - forced == {"capture"} and forced <= writers


def test_an_old_spelling_is_no_option_any_more_and_its_new_one_is():
    renamed = {name: command.renamed for name, command in COMMANDS.items() if command.renamed}
    assert renamed == {"decode": {"--workers": "--processes"}, "stats": {"--workers": "--processes"},
                       "export": {"-f": "-F"}, "simulate": {"--workers": "--training-workers",
                                                           "--engine": "--simulator"}}
    for name, spellings in renamed.items():
        current = {s for option in _options(COMMANDS[name]) for s in option.opts + option.secondary_opts}
        assert not set(spellings) & current and set(spellings.values()) <= current


@pytest.mark.parametrize("args, expected", [
    (["--workers", "2", "x"], ["--processes", "2", "x"]),
    (["--workers=2"], ["--processes=2"]),
    (["-fchrome", "-f", "chakra"], ["-Fchrome", "-F", "chakra"]),
    (["--workers", "2", "--", "--workers"], ["--processes", "2", "--", "--workers"]),   # after --: an argument
    (["--workers-file", "--processes"], ["--workers-file", "--processes"]),
])
def test_old_spellings_are_respelled_up_to_the_double_dash(args, expected):
    assert respell(args, {"--workers": "--processes", "-f": "-F"}, "dlcsniff x") == expected


def test_an_old_spelling_still_works_and_says_so_in_one_line(tmp_path):
    old = run("decode", PCAPS / "zmq", "--out", tmp_path / "old", "--workers", "0", "--json")
    new = run("decode", PCAPS / "zmq", "--out", tmp_path / "new", "--processes", "0", "--json")
    assert old.returncode == new.returncode == 0, old.stderr
    assert old.stderr == "warning: `dlcsniff decode --workers` is deprecated: use --processes\n"
    assert new.stderr == ""
    assert old.stdout.replace(str(tmp_path / "old"), "OUT") == new.stdout.replace(str(tmp_path / "new"), "OUT")
    # and the new spelling's checks apply to the old one
    refused = run("stats", tmp_path / "new", "--out", tmp_path / "s", "--engine", "dask", "--workers", "0")
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "warning: `dlcsniff stats --workers` is deprecated: use --processes",
        "error: Invalid value for '--processes': 0 is not in the range x>=1 (see `dlcsniff stats -h`)"]


@pytest.mark.parametrize("args, code, says", [
    (["decode", PCAPS / "zmq", "--out", "{tmp}/o", "--wrokers", "2"], 2, "No such option: --wrokers"),
    (["decode", PCAPS / "zmq", "--out", "{tmp}/o", "--processes", "many"], 2, "'many' is not a valid integer"),
    (["decode", PCAPS / "zmq"], 2, "Missing option '--out'"),
    (["decode"], 2, "Missing argument 'CAPTURE...'"),
    (["export", "{tmp}", "-F", "png", "--out", "{tmp}/x"], 2, "'png' is not one of 'chrome', 'chakra'"),
    (["decoed", PCAPS / "zmq"], 2, "No such command 'decoed'"),
    (["decode", "{tmp}/nothing.pcap", "--out", "{tmp}/o"], 1, "nothing.pcap: no such file"),
    (["stats", "{tmp}", "--out", "{tmp}/s"], 1, "not the output of `dlcsniff decode`"),
])
def test_every_error_is_one_line_with_its_exit_code(args, code, says, tmp_path):
    result = run(*(str(arg).format(tmp=tmp_path) for arg in args))
    assert result.returncode == code, result.stderr
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: ") and says in result.stderr


def _words(text: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_the_help_and_the_readme_state_the_exit_codes(command):
    shown = _words(run(*filter(None, [command]), "-h").stdout)
    assert EXIT_CODES.removesuffix(".") in shown
    if command == "capture":
        assert "3 the disk budget or the disk ran out" in shown
    assert EXIT_CODES in _words((REPO / "README.md").read_text())


def test_the_readme_lists_the_shared_options_and_the_old_spellings():
    """The README's table of the options several commands share, and of the old spellings, names every one."""
    used = collections.Counter(spelling for command in COMMANDS.values() for option in _options(command)
                               for spelling in option.opts if spelling.startswith("--"))
    old = {spelling for command in COMMANDS.values() for spelling in command.renamed}
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| option | means |"):]
    table = table[:table.index("\n\n")]
    missing = {spelling for spelling, n in used.items() if n > 1} | old
    assert {spelling for spelling in missing if f"`{spelling}" not in table} == set()
