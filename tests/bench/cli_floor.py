"""A floor of the start-up benchmark (tests/bench/startup.py): a typer command with the parameter kinds of
`dlcsniff decode` (paths, optional numbers and texts, flags) parsing its arguments, then importing the modules
named in DLCSNIFF_FLOOR_IMPORTS (comma-separated) and nothing else. Typer 0.29 builds a pydantic adapter for
each parameter it parses, so this costs more than importing typer: what any typer command pays before its work.

    python tests/bench/cli_floor.py CAPTURE --out DIR
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer()


@app.command()
def decode(captures: Annotated[list[Path], typer.Argument()], out_dir: Annotated[Path, typer.Option("--out")],
           as_json: Annotated[bool, typer.Option("--json")] = False,
           progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress")] = None,
           engine: Annotated[str, typer.Option("--engine")] = "pandas",
           scheduler: Annotated[Optional[str], typer.Option("--scheduler")] = None,
           processes: Annotated[Optional[int], typer.Option("--processes", min=0)] = None,
           filter_expr: Annotated[Optional[str], typer.Option("--filter")] = None,
           start: Annotated[Optional[str], typer.Option("--start")] = None,
           end: Annotated[Optional[str], typer.Option("--end")] = None,
           force: Annotated[bool, typer.Option("--force")] = False) -> None:
    for module in filter(None, os.environ.get("DLCSNIFF_FLOOR_IMPORTS", "").split(",")):
        importlib.import_module(module)


if __name__ == "__main__":
    app()
