"""Decode outputs compared table by table: the check that a change to how decoding runs (the compiled record walk,
the order of imports, processes) changes nothing it writes.

    .venv/bin/python -m tests.support.decode_compare decode OUT_ROOT     # every job in pcaps/ into OUT_ROOT/<job>
    .venv/bin/python -m tests.support.decode_compare compare A_ROOT B_ROOT

`compare` reads every Parquet table of every job in both roots and reports each difference: a table only one
side has, its Arrow schema (names and types), the pandas metadata that restores its dtypes, or its rows. What
the manifest records of the run itself (when, which command, the input paths) may differ; the rest of it and
the tables' rows may not. Exit status 1 when anything differs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
PCAPS = REPO / "pcaps"
DLCSNIFF = REPO / ".venv" / "bin" / "dlcsniff"
RUN_FIELDS = ("created_utc", "command")      # what a manifest says about the run, not the result
MANIFEST_KEY = b"dlcsniff.manifest"


def bundled_jobs() -> list[Path]:
    """Every directory of pcaps/ that holds captures (pcaps/realcaps has them a level or two deeper)."""
    return sorted({p.parent for p in PCAPS.rglob("*.pcap*") if not any(part.startswith(".") for part in p.parts)})


def decode_all(out_root: Path, jobs: list[Path] | None = None, env: dict | None = None) -> list[Path]:
    """`dlcsniff decode JOB --out OUT_ROOT/<job's path in pcaps/> --force` for every job (default: every job in
    pcaps/)."""
    outs = []
    for job in jobs or bundled_jobs():
        out = Path(out_root) / job.relative_to(PCAPS)
        subprocess.run([str(DLCSNIFF), "-q", "decode", str(job), "--out", str(out), "--force"], check=True,
                       env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL)
        outs.append(out)
    return outs


def _manifest_result(manifest: dict) -> dict:
    """The manifest less the run's own fields, its inputs named by file name (runs may name them by other paths)."""
    result = {key: value for key, value in manifest.items() if key not in RUN_FIELDS}
    result["inputs"] = [{**entry, "path": Path(entry["path"]).name} for entry in result.get("inputs", [])]
    return result


def compare_dirs(a: Path, b: Path) -> list[str]:
    """The differences between two decode outputs (an empty list: the same tables)."""
    import pyarrow.parquet as pq

    a, b = Path(a), Path(b)
    found = []
    names_a = {p.name for p in a.glob("*.parquet")}
    names_b = {p.name for p in b.glob("*.parquet")}
    found += [f"{name}: only in {a}" for name in sorted(names_a - names_b)]
    found += [f"{name}: only in {b}" for name in sorted(names_b - names_a)]
    for name in sorted(names_a & names_b):
        ta, tb = pq.read_table(a / name), pq.read_table(b / name)
        meta_a, meta_b = ta.schema.metadata or {}, tb.schema.metadata or {}
        if ta.schema.remove_metadata() != tb.schema.remove_metadata():
            found.append(f"{name}: schemas differ:\n{ta.schema.remove_metadata()}\n--\n{tb.schema.remove_metadata()}")
        elif meta_a.get(b"pandas") != meta_b.get(b"pandas"):
            found.append(f"{name}: pandas metadata differs")
        elif not ta.equals(tb):
            found.append(f"{name}: rows differ ({ta.num_rows} vs {tb.num_rows} rows)")
        manifests = [json.loads(m.get(MANIFEST_KEY, b"{}")) for m in (meta_a, meta_b)]
        if _manifest_result(manifests[0]) != _manifest_result(manifests[1]):
            found.append(f"{name}: the manifest in its metadata differs beyond the run's own fields")
    manifests = [json.loads((d / "manifest.json").read_text()) if (d / "manifest.json").exists() else {}
                 for d in (a, b)]
    if _manifest_result(manifests[0]) != _manifest_result(manifests[1]):
        found.append("manifest.json differs beyond the run's own fields")
    return found


def compare_roots(a_root: Path, b_root: Path) -> dict[str, list[str]]:
    """Per decode output (a directory with a manifest.json, in either root): its differences."""
    jobs = sorted({str(p.parent.relative_to(root)) for root in (Path(a_root), Path(b_root))
                   for p in root.rglob("manifest.json")})
    return {job: compare_dirs(Path(a_root) / job, Path(b_root) / job) for job in jobs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("decode").add_argument("out_root", type=Path)
    both = sub.add_parser("compare")
    both.add_argument("a_root", type=Path)
    both.add_argument("b_root", type=Path)
    args = parser.parse_args(argv)
    if args.what == "decode":
        for out in decode_all(args.out_root):
            print(out)
        return 0
    differing = 0
    for job, found in compare_roots(args.a_root, args.b_root).items():
        print(f"{job}: {'same tables' if not found else 'DIFFERENT'}")
        for line in found:
            print(f"  {line}")
        differing += bool(found)
    print(f"{differing} of the jobs differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
