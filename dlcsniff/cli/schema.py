"""`dlcsniff schema`: the reference of every table dlcsniff writes (analysis.schema_reference)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from dlcsniff.cli.app import Flag, Json, command, fail, out, step


@command()
def schema(
    table: Annotated[Optional[str], typer.Argument(metavar="[TABLE]", help="One table (e.g. messages, "
                                                   "iterations); all of them when not given.")] = None,
    as_json: Json = False,
    markdown: Annotated[bool, typer.Option("--markdown", **Flag, help="Print SCHEMA.md (every table, Markdown).")
                        ] = False,
) -> None:
    """Every table `decode` and `stats` write: its columns, their types, units and meaning.

    Examples: dlcsniff schema; dlcsniff schema events; dlcsniff schema requests --json
    """
    with step("loaded the table reference"):
        from dlcsniff.analysis.schema_reference import REFERENCE, column_rows, reference_json, reference_markdown

    if markdown and (table is not None or as_json):
        fail("--markdown prints every table, as Markdown: without TABLE and --json")
    if table is not None and table not in REFERENCE:
        fail(f"no table {table!r}: the tables are {', '.join(REFERENCE)}")
    chosen = list(REFERENCE.values()) if table is None else [REFERENCE[table]]
    if markdown:
        print(reference_markdown(), end="")
        return
    if as_json:
        print(reference_json(chosen))
        return
    for found in chosen:
        shown = Table(title=f"{found.name}.parquet (dlcsniff {found.command}): one row per {found.description}",
                      title_justify="left")
        for name in ("column", "type", "unit", "description"):
            shown.add_column(name)
        for row in column_rows(found):
            shown.add_row(row["column"], row["type"], row["unit"], row["description"])
        out.print(shown)
