"""The one reference of every table dlcsniff writes: decode's (decoders/schema.py) and stats' (analysis/
stats_schema.py), as `dlcsniff schema` prints it and as SCHEMA.md holds it (`make schema` writes that file
from here; a test holds the committed file to it)."""
from __future__ import annotations

import json

from dlcsniff.analysis.stats_schema import STATS_TABLES
from dlcsniff.decoders.schema import TABLES, UNIT_SUFFIXES, Table, type_name

REFERENCE: dict[str, Table] = {**TABLES, **STATS_TABLES}
COMMAND_OUTPUTS = {
    "decode": "`dlcsniff decode CAPTURE... --out DIR` writes DIR/<table>.parquet",
    "stats": "`dlcsniff stats DIR --out STATSDIR` writes STATSDIR/<table>.parquet (and summary.json); a ps-lite job "
             "gets iterations … key_updates, a collective job the collective_* tables and connections",
}


def column_rows(table: Table) -> list[dict]:
    return [{"column": column.name, "type": type_name(column.type), "unit": column.unit,
             "description": column.description} for column in table.columns]


def reference_json(tables: list[Table]) -> str:
    """The reference as JSON: a list of tables, each with its columns (what `dlcsniff schema --json` prints)."""
    return json.dumps([{"table": table.name, "file": f"{table.name}.parquet", "command": table.command,
                        "description": table.description, "columns": column_rows(table)} for table in tables],
                      indent=2, ensure_ascii=False)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference_markdown() -> str:
    """SCHEMA.md: every table of REFERENCE with every column, and the naming scheme."""
    suffixes = ", ".join(f"`{suffix}` {unit}" for suffix, unit in UNIT_SUFFIXES)
    lines = [
        "# The tables dlcsniff writes",
        "",
        "Generated from `decoders/schema.py` and `analysis/stats_schema.py` by `make schema` (the same text as",
        "`dlcsniff schema --markdown`; `dlcsniff schema TABLE` prints one table, `--json` for machines). Every",
        "file is Parquet, written in exactly these columns, in this order, with these types.",
        "",
        "Names:",
        "- a time point is integer nanoseconds since the epoch and has `ts` in its name: `ts_first_ns` and",
        "  `ts_last_ns` for the first and last byte of a message (or the start and end of anything that lasts),",
        "  `<what>_ts_ns` for a named instant;",
        f"- a duration, size, rate or drift ends in its unit: {suffixes};",
        "  `bytes` alone is bytes; a few names older than this scheme (`frame_sizes`, `data_sizes`,",
        "  `wire_bytes_sent`, ...) carry the unit inside: the unit column says it;",
        "- a name without a unit is a count, an identifier or a label; a tensor is `tensor_key`, a ps-lite key",
        "  `ps_key`, ranks `rank` or `*_rank`;",
        "- integer columns stay integer where a value is missing (null), strings are `string`, and every column",
        "  has its type even in an empty table; a column has the same type in every table it appears in.",
        "",
        "| table | one row per | written by |",
        "|---|---|---|",
        *(f"| [`{t.name}`](#{t.name}) | {_cell(t.description)} | `dlcsniff {t.command}` |"
          for t in REFERENCE.values()),
    ]
    for command, where in COMMAND_OUTPUTS.items():
        lines += ["", f"## `dlcsniff {command}`", "", where + "."]
        for table in (t for t in REFERENCE.values() if t.command == command):
            lines += ["", f"### {table.name}", "", f"`{table.name}.parquet`: one row per {table.description}.",
                      "", "| column | type | unit | description |", "|---|---|---|---|"]
            lines += [f"| `{row['column']}` | {row['type']} | {row['unit']} | {_cell(row['description'])} |"
                      for row in column_rows(table)]
    return "\n".join(lines) + "\n"
