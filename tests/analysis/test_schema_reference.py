"""The one reference of every table (analysis.schema_reference): what decode and stats write on every bundled
job is exactly it (names, order, types), its names follow one scheme, SCHEMA.md is its generated text and the
README links to it, and `dlcsniff schema` prints it."""
from __future__ import annotations

import collections
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.analysis import load_job_model, write_statistics
from dlcsniff.analysis.schema_reference import REFERENCE, reference_markdown
from dlcsniff.cli import app
from dlcsniff.decoders.decode_run import decode_to_dir
from dlcsniff.decoders.schema import UNIT_SUFFIXES, unit_of
from tests.conftest import PCAPS, REPO

JOBS = sorted(path.name for path in PCAPS.iterdir() if path.is_dir() and path.name != "realcaps")
NCCL = PCAPS / "realcaps" / "softroce-tutorial" / "nccl"
NCCL_JOBS = ("ring2", "tree2")
# decoded, but nothing for `stats` to analyse (ZeroMQ without ps-lite; plain TCP: lab/workloads/slow_reader.py)
NO_STATS = {"zmq", "tcp_zero_window"}
# words that say a column is a time, a duration or a size: such a column must carry its unit
QUANTITY_WORDS = {"ts", "time", "first", "last", "start", "end", "duration", "delay", "latency", "rtt", "wall",
                  "gap", "overhead", "size", "sizes", "length", "offset", "roffset", "mtu", "bytes", "skew", "lag"}
# counts whose names hold a quantity word; ps-lite's own field, a counter and not a time
COUNTS = {"world_size", "local_world_size", "ps_timestamp"}
# named by the issues' contracts (2, 5) with the unit inside the name, and their kin: the unit is stated instead
STATED_UNIT = {"frame_sizes", "data_sizes", "wire_bytes_sent", "wire_bytes_received", "payload_bytes_sent",
               "payload_bytes_received", "push_bytes_per_iteration", "pull_bytes_per_iteration"}

runner = CliRunner()


def _schema(path):
    return pq.read_schema(path).remove_metadata()


@pytest.fixture(scope="module")
def written(decoded_job, tmp_path_factory) -> dict[str, list]:
    """Every Parquet file decode and stats write on every bundled job (and the real NCCL captures), by table."""
    decoded = {job: decoded_job(job) for job in JOBS}
    for job in NCCL_JOBS:
        decoded[job] = tmp_path_factory.mktemp(f"schema-{job}")
        decode_to_dir(sorted(NCCL.glob(f"{job}_node*.pcap.gz")), decoded[job])
    outputs = list(decoded.values())
    for job, decode_dir in decoded.items():
        if job not in NO_STATS:
            outputs.append(tmp_path_factory.mktemp(f"schema-stats-{job}"))
            write_statistics(load_job_model(decode_dir), outputs[-1], force=True)
    files = collections.defaultdict(list)
    for out in outputs:
        for path in out.glob("*.parquet"):
            files[path.stem].append(path)
    return files


def test_every_table_written_is_exactly_its_reference(written):
    assert set(written) == set(REFERENCE), "a table written and not in the reference, or never written"
    for name, paths in written.items():
        for path in paths:
            schema = _schema(path)
            assert schema.names == list(REFERENCE[name].names), path
            assert schema.equals(REFERENCE[name].schema), (path, [
                (field.name, str(field.type), str(want.type)) for field, want in zip(schema, REFERENCE[name].schema)
                if field.type != want.type])


def test_stats_of_both_kinds_of_job_were_written(written):
    """The check above saw the SketchDLC, merged-view and collective tables (not just some)."""
    assert all(len(written[name]) >= 2 for name in REFERENCE)
    assert len(written["iterations"]) >= 10 and len(written["collective_stats"]) >= 3


def test_one_string_type_integers_stay_integers_and_no_null_columns():
    for table in REFERENCE.values():
        for column in table.columns:
            assert not pa.types.is_null(column.type) and not pa.types.is_dictionary(column.type)
            assert not pa.types.is_large_string(column.type) and not pa.types.is_large_list(column.type)
            if pa.types.is_floating(column.type):
                # doubles hold measured or derived quantities (seconds, µs, ratios, means), never counts or ids
                assert column.unit in ("s", "µs", "bytes", "GB/s", "ppm") or re.search(
                    r"(ratio|fraction|factor|mean|per_push|per_iteration)", column.name), (table.name, column.name)


def test_a_name_has_one_type_everywhere():
    types = collections.defaultdict(set)
    for table in REFERENCE.values():
        for column in table.columns:
            types[column.name].add(str(column.type))
    assert {name: found for name, found in types.items() if len(found) > 1} == {}


def test_times_durations_and_sizes_say_their_unit():
    for table in REFERENCE.values():
        for column in table.columns:
            words = set(column.name.split("_"))
            assert column.description, (table.name, column.name)
            if column.name in STATED_UNIT:
                assert column.unit == "bytes" and not unit_of(column.name), (table.name, column.name)
            elif column.name not in COUNTS:
                assert column.unit == unit_of(column.name), (table.name, column.name)
                if words & QUANTITY_WORDS:
                    assert column.unit, f"{table.name}.{column.name}: a quantity without its unit"
            if "ts" in words:
                assert column.name.endswith("_ns") and column.type == pa.int64(), (table.name, column.name)


def test_the_first_and_last_of_anything_are_ts_first_ns_and_ts_last_ns():
    for table in REFERENCE.values():
        names = set(table.names)
        assert not names & {"first_ts_ns", "last_ts_ns", "start_ns", "end_ns", "first_ns", "last_ns"}, table.name
        assert "ts_last_ns" not in names or "ts_first_ns" in names, table.name


def test_unit_suffixes():
    assert [unit_of(name) for name in ("ts_first_ns", "clock_fix_us", "iteration_s", "busbw_gb_per_s", "bytes",
                                       "wire_bytes", "drift_ppm", "messages", "keys", "overlap_ratio")] == \
        ["ns", "µs", "s", "GB/s", "bytes", "bytes", "ppm", "", "", ""]
    assert {unit for _, unit in UNIT_SUFFIXES} == {"ns", "µs", "s", "bytes", "GB/s", "ppm"}


def test_schema_md_is_the_generated_reference_and_the_readme_links_it():
    assert (REPO / "SCHEMA.md").read_text() == reference_markdown(), "run `make schema`"
    assert "(SCHEMA.md)" in (REPO / "README.md").read_text()
    for name, table in REFERENCE.items():
        assert f"### {name}\n" in reference_markdown()
        assert all(f"| `{column}` |" in reference_markdown() for column in table.names)


def test_the_command_prints_the_reference():
    markdown = runner.invoke(app, ["schema", "--markdown"])
    assert markdown.exit_code == 0 and markdown.stdout == reference_markdown()
    every = json.loads(runner.invoke(app, ["schema", "--json"]).stdout)
    assert [table["table"] for table in every] == list(REFERENCE)
    one = runner.invoke(app, ["schema", "key_updates", "--json"])
    assert one.exit_code == 0
    (table,) = json.loads(one.stdout)
    assert [(c["column"], c["type"]) for c in table["columns"]] == [
        ("tensor_key", "int64"), ("ps_key", "uint64"), ("req_type", "string"), ("updates", "int64")]
    shown = runner.invoke(app, ["schema", "requests"])
    assert shown.exit_code == 0 and "requests.parquet" in shown.stdout and "clock_fix_us" in shown.stdout
    assert "µs" in shown.stdout


def test_an_unknown_table_is_one_line_and_an_error():
    result = runner.invoke(app, ["schema", "packets"])
    assert result.exit_code == 1 and "no table 'packets'" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert runner.invoke(app, ["schema", "events", "--markdown"]).exit_code == 1
