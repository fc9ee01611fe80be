"""The registry is the only place the generic code learns of protocols: outside decoders/protocols/, the
decoders and the CLI name no protocol (string constants other than docstrings) and import no protocol's
module. Counted with `ast`, as issue 20 measures it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from dlcsniff.decoders.protocols import COLUMN_PACKAGES, JOB_STEPS, REGISTRY, protocol_columns, protocol_tables
from dlcsniff.decoders.schema import TABLES
from tests.conftest import REPO

# a protocol's name as code spells it: a whole identifier-like constant, or one of its parts (pslite_nodes)
PROTOCOL_NAME = re.compile(r"^(?:[A-Za-z0-9]+[_.-])*(?:pslite|ps-lite|zmtp|gloo|tcpstore|nccl|roce)"
                           r"(?:[_.-]?[A-Za-z0-9]+)*$", re.IGNORECASE)
# what remains named: the probe records' import of libnccl's API as the uprobes see it
# (decoders/formats/probe_events.py reads decoders.protocols.nccl.probes); to shrink, never to grow
ALLOWED = 1
# the job-wide API (decoders/protocols/job_step.py)
JOB_HOOKS = {"resolve_job", "summary", "event_summary", "unclaimed", "warnings", "message_sides",
             "reference_captures", "says", "says_tables"}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _protocol_module(name: str) -> bool:
    """A module of a protocol's package (decoders/protocols/<name>/), not the registry or the shared API."""
    parts = name.split(".")
    return (len(parts) >= 4 and parts[:3] == ["dlcsniff", "decoders", "protocols"]
            and (REPO / "decoders" / "protocols" / parts[3]).is_dir())


def protocol_mentions(path: Path) -> list[str]:
    """Where a file names a protocol: `line: constant` or `line: import module`."""
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if PROTOCOL_NAME.match(node.value):
                found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            if any(_protocol_module(t) for t in targets):
                found.append(f"{node.lineno}: import {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _protocol_module(a.name)]
    return sorted(found, key=lambda mention: int(mention.split(":")[0]))


def generic_files() -> list[Path]:
    decoders = [p for p in (REPO / "decoders").rglob("*.py") if (REPO / "decoders" / "protocols") not in p.parents]
    return sorted(decoders + list((REPO / "dlcsniff").rglob("*.py")))


def test_the_generic_code_names_no_protocol():
    mentions = {str(p.relative_to(REPO)): found for p in generic_files() if (found := protocol_mentions(p))}
    assert sum(map(len, mentions.values())) <= ALLOWED, mentions


def test_the_count_sees_what_it_counts(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""pslite in a docstring does not count."""\n'
                      'from dlcsniff.decoders.protocols.pslite import job\n'
                      'from dlcsniff.decoders.protocols import REGISTRY\n'
                      'x = {"roce": 1, "zmtp_messages": 2, "tcp": 3, "processes": 4}\n')
    assert protocol_mentions(sample) == ["2: import dlcsniff.decoders.protocols.pslite",
                                         "4: 'roce'", "4: 'zmtp_messages'"]


def test_every_job_step_offers_the_job_api_and_nothing_like_it():
    for entry in JOB_STEPS:
        modules = entry.hooks()
        offered = {name for module in modules for name in JOB_HOOKS if callable(getattr(module, name, None))}
        assert offered, entry.name
        # a hook misspelt is never called: public functions of a summary module are hooks
        for module in modules:
            if module.__name__.endswith(".summary"):
                public = {name for name, value in vars(module).items() if callable(value) and not name.startswith("_")
                          and getattr(value, "__module__", None) == module.__name__}
                assert public <= JOB_HOOKS, (module.__name__, public - JOB_HOOKS)
    assert {entry.name for entry in REGISTRY} | {"zmtp", "tcpstore", "nccl"} >= {e.name for e in JOB_STEPS}


def test_each_protocol_block_of_columns_stands_whole_after_its_anchor():
    for table in ("streams", "messages"):
        names = list(TABLES[table].names)
        assert len(names) == len(set(names)), table
        for anchor, rows in protocol_columns(table):
            at = names.index(anchor) + 1
            assert names[at:at + len(rows)] == [row[0] for row in rows], (table, anchor)
    order = list(TABLES)
    for anchor, (name, *_) in protocol_tables():
        assert order[order.index(anchor) + 1] == name
    assert all((REPO / "decoders" / "protocols" / package / "columns.py").is_file() for package in COLUMN_PACKAGES)
