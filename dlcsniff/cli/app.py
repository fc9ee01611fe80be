"""The typer application every command registers on (`command`), and what the commands share: the consoles,
the one-line error, warnings and details by verbosity, the options several commands take.

Habits of the command line: -h/--help, -V/--version, -q/--quiet (errors only), -v/--verbose (what each step
took, every detail); flags take no value (their help shows none); output to a pipe or a file keeps whole
tables and lines (no terminal width to fit); numbers out of range are refused before any work.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from dlcsniff import __version__


class _FlagHelp:
    """-h/--help is a flag like the others: no value placeholder in the help, and False when not given (typer
    would otherwise coerce its missing value through pydantic, an import a run without --help may not need)."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
            option.default = False
        return option


class _Group(_FlagHelp, TyperGroup):
    pass


class _Command(_FlagHelp, TyperCommand):
    pass


app = typer.Typer(
    cls=_Group,
    help="See what a distributed deep-learning job puts on the network, per tensor, without touching the job.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def command(*args, **kwargs):
    """`app.command` for dlcsniff's commands (their help shows flags without a value placeholder)."""
    return app.command(*args, cls=_Command, **kwargs)


# Not a terminal (a pipe, a file): no width to fit, so whole tables and unbroken lines.
_WIDE = 100_000
out = Console(width=None if sys.stdout.isatty() else _WIDE)
err = Console(stderr=True, width=None if sys.stderr.isatty() else _WIDE)
_verbosity = {"level": 0}     # -1 quiet, 0 normal, 1 verbose


def fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def warn(message: str) -> None:
    if _verbosity["level"] >= 0:
        err.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def detail(message: str) -> None:
    """What -v adds: how long a step took, and the like (on stderr: stdout stays the result)."""
    if _verbosity["level"] > 0:
        err.print(f"[dim]{message}[/]", highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        out.print(f"dlcsniff {__version__}")
        raise typer.Exit()


Flag = dict(metavar="")


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_version, is_eager=True, **Flag,
                                          help="Print the version and exit.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", **Flag, help="Print errors only.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", **Flag, help="Also say how long each step took, "
                                          "and every detail.")] = False,
) -> None:
    """Capture, decode and analyse distributed deep-learning traffic."""
    if quiet and verbose:
        fail("--quiet and --verbose exclude each other")
    _verbosity["level"] = -1 if quiet else 1 if verbose else 0
    out.quiet = quiet


Engine = Annotated[Literal["pandas", "dask"], typer.Option(
    "--engine", help="pandas: this machine's processes; dask: a Dask cluster (a local one unless --scheduler).")]
SchedulerAddress = Annotated[Optional[str], typer.Option(
    "--scheduler", help="Address of a running Dask scheduler (e.g. tcp://10.0.0.5:8786), for --engine dask; "
    "its workers must see the same files under the same absolute paths.")]


def check_engine(engine: str, scheduler: Optional[str]) -> None:
    if scheduler is not None and engine != "dask":
        fail("--scheduler needs --engine dask")


DecodeDir = Annotated[Path, typer.Argument(metavar="DECODE_DIR", help="The --out directory of `dlcsniff decode`.")]
Force = Annotated[bool, typer.Option("--force", **Flag, help="Replace the output of an earlier run in --out (its "
                                     "files only, as its manifest.json lists them).")]
Json = Annotated[bool, typer.Option("--json", **Flag, help="Print the result as JSON (on stdout).")]
