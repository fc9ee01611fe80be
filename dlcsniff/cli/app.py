"""The typer application every command registers on, and what the commands share: the consoles, the one-line
error, the options several commands take."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.console import Console

from dlcsniff import __version__

app = typer.Typer(
    help="See what a distributed deep-learning job puts on the network, per tensor, without touching the job.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

def fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _version(value: bool) -> None:
    if value:
        out.print(f"dlcsniff {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
) -> None:
    """Capture, decode and analyse distributed deep-learning traffic."""


Engine = Annotated[Literal["pandas", "dask"], typer.Option(
    "--engine", help="pandas: this machine's processes; dask: a Dask cluster (a local one unless --scheduler).")]
SchedulerAddress = Annotated[Optional[str], typer.Option(
    "--scheduler", help="Address of a running Dask scheduler (e.g. tcp://10.0.0.5:8786), for --engine dask; "
    "its workers must see the same files under the same absolute paths.")]


def check_engine(engine: str, scheduler: Optional[str]) -> None:
    if scheduler is not None and engine != "dask":
        fail("--scheduler needs --engine dask")


DecodeDir = Annotated[Path, typer.Argument(help="The --out directory of `dlcsniff decode`.")]
Force = Annotated[bool, typer.Option("--force", help="Replace the output of an earlier run in --out (its files "
                                     "only, as its manifest.json lists them).")]
