"""One view of a NCCL job's collectives: `stats` (its tables and summary), the report's rank matrix,
collective_traffic.parquet and `simulate` read the same operations, with the same bytes per rank pair.

Real captures made elsewhere: pcaps/realcaps/softroce-tutorial/nccl (PyTorch 2.4.1 + NCCL 2.20.5, 3 ranks over
Soft-RoCE; its README says what each run did). Truth, none of it from the decoders:
- the program (`dist.barrier()`, an all_reduce of 1 byte, then `dist.all_reduce` of 6144 float32) and NCCL's
  algorithms: a ring all_reduce of S bytes over n ranks puts 2(n-1)/n * S on each ring link (the ring each
  rank's NCCL log prints), a tree all_reduce S on each tree edge each way (the log's `Trees` line);
- tshark's InfiniBand dissector: the payload of every RDMA data write (opcodes WRITE FIRST/MIDDLE/LAST and
  WRITE ONLY with immediate; the CTS are plain WRITE ONLY) from the sending rank's own capture, by address
  pair, the addresses' ranks from the logs.
"""
from __future__ import annotations

import collections
import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.analysis import collective_statistics_of, load_job_model
from dlcsniff.analysis.report_data import collective_matrices
from dlcsniff.analysis.simulate_collectives import collective_model
from dlcsniff.cli import app
from dlcsniff.decoders.decode_run import decode_to_dir
from tests.conftest import PCAPS, require_tool
from tests.support.nccl_log import parse_nccl_log

RUNS = PCAPS / "realcaps" / "softroce-tutorial" / "nccl"
NODES = ("node0", "node1", "node2")
TENSOR_BYTES = 6144 * 4              # the all_reduce after the barrier
DATA_OPCODES = (6, 7, 8, 9, 11)      # RC RDMA WRITE FIRST, MIDDLE, LAST, LAST with immediate, ONLY with immediate
CTS_OPCODES = (10,)                  # RC RDMA WRITE ONLY: NCCL's clear-to-send FIFO entries
# extension headers after the BTH per opcode (RETH 16, ImmDt 4)
EXTENSION_BYTES = {6: 16, 7: 0, 8: 0, 9: 4, 10: 16, 11: 20}
BTH_BYTES, ICRC_BYTES, UDP_BYTES = 12, 4, 8

runner = CliRunner()


@pytest.fixture(scope="module", params=["ring2", "tree2"])
def run(request, tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(request.param) / "decoded"
    decode_to_dir(sorted(RUNS.glob(f"{request.param}_node*.pcap.gz")), out)
    return request.param, out


def _logs(run: str) -> dict:
    return {node: parse_nccl_log(RUNS / f"{run}_{node}.log") for node in NODES}


def _tshark_payload_per_pair(run: str, tmp_path: Path, opcodes=DATA_OPCODES) -> dict[tuple[int, int], int]:
    """Payload bytes of the RDMA writes of these opcodes (default: the data) per (source rank, destination
    rank), each counted in its sender's own capture (tshark)."""
    logs = _logs(run)
    rank_of = {log.host: log.rank for log in logs.values()}
    found: collections.Counter = collections.Counter()
    for node, log in logs.items():
        plain = tmp_path / f"{run}_{node}.pcap"
        plain.write_bytes(gzip.decompress((RUNS / f"{run}_{node}.pcap.gz").read_bytes()))
        fields = subprocess.run(
            [require_tool("tshark"), "-r", str(plain), "-Y", " || ".join(f"infiniband.bth.opcode == {op}"
                                                                        for op in opcodes),
             "-T", "fields", "-e", "ip.src", "-e", "ip.dst", "-e", "udp.length", "-e", "infiniband.bth.opcode",
             "-e", "infiniband.bth.padcnt"], capture_output=True, text=True, check=True).stdout
        for line in fields.splitlines():
            src, dst, udp_length, opcode, pad = line.split("\t")
            if src != log.host:
                continue
            opcode = int(opcode)
            payload = int(udp_length) - UDP_BYTES - BTH_BYTES - EXTENSION_BYTES[opcode] - int(pad) - ICRC_BYTES
            found[(rank_of[src], rank_of[dst])] += payload
    return dict(found)


def _expected_all_reduce(run: str) -> dict[tuple[int, int], int]:
    """The all_reduce's payload per rank pair from the program and NCCL's algorithm, on the logs' ring / tree."""
    logs = _logs(run)
    n = logs["node0"].nranks
    if run == "ring2":
        return {(log.rank, log.ring[2]): 2 * (n - 1) * TENSOR_BYTES // n for log in logs.values()}
    edges = {(log.rank, log.tree_parent) for log in logs.values() if log.tree_parent >= 0}
    return {pair: TENSOR_BYTES for edge in edges for pair in (edge, edge[::-1])}


def test_collective_traffic_holds_every_pairs_bytes(run, tmp_path):
    """collective_traffic: the all_reduce's bytes on exactly the pairs NCCL's algorithm uses, and over both
    operations exactly what tshark reads on the wire per pair."""
    name, decoded = run
    stats = collective_statistics_of(load_job_model(decoded))
    traffic = stats.traffic
    assert set(zip(traffic["kind"], traffic["seq"])) == {("all_reduce", 0), ("all_reduce", 1)}
    assert (traffic["protocol"] == "roce").all() and (traffic["seen_at"] == "both").all()
    big = traffic[(traffic["seq"] == 1) & (traffic["payload_bytes"] > 0)]
    assert dict(zip(zip(big["src_rank"], big["dst_rank"]), big["payload_bytes"])) == _expected_all_reduce(name)
    # the CTS writes flow the other way, with no payload
    assert (traffic["wire_bytes"] >= traffic["payload_bytes"]).all()
    total = traffic.groupby(["src_rank", "dst_rank"])["payload_bytes"].sum()
    assert {pair: int(v) for pair, v in total.items() if v} == _tshark_payload_per_pair(name, tmp_path)


def test_stats_reads_the_same_operations(run, tmp_path):
    """`stats`: the operations, the per-rank rows and the volume summary agree with the traffic table."""
    name, decoded = run
    done = runner.invoke(app, ["stats", str(decoded), "-o", str(tmp_path / "stats"), "--json"])
    assert done.exit_code == 0, done.output
    written = json.loads((tmp_path / "stats" / "summary.json").read_text())
    summary = written["collectives"]
    wire = _tshark_payload_per_pair(name, tmp_path)
    assert summary["operations"] == 2 and summary["by_kind"]["all_reduce"]["operations"] == 2
    assert summary["volume"]["all_reduce_bytes"] == sum(wire.values())
    assert written["losses"]["collective_messages_without_ranks"] == 0
    traffic = pq.read_table(tmp_path / "stats" / "collective_traffic.parquet").to_pandas()
    operations = pq.read_table(tmp_path / "stats" / "collective_stats.parquet").to_pandas()
    assert set(zip(operations["kind"], operations["seq"])) == set(zip(traffic["kind"], traffic["seq"]))
    assert int(traffic["payload_bytes"].sum()) == sum(wire.values())


def test_the_reports_matrix_shows_the_pairs(run, tmp_path):
    """The report's rank matrix: every pair's bytes, in the figure's data and in the page's interactive chart."""
    name, decoded = run
    names, views = collective_matrices(collective_statistics_of(load_job_model(decoded)))
    assert names == ["rank 0", "rank 1", "rank 2"] and list(views) == ["every collective"]
    payload, _ = views["every collective"]
    wire = _tshark_payload_per_pair(name, tmp_path)
    assert {(i, j): int(payload[i, j]) for i in range(3) for j in range(3) if payload[i, j]} == wire
    page = tmp_path / "report.html"
    done = runner.invoke(app, ["report", str(decoded), "-o", str(page)])
    assert done.exit_code == 0, done.output
    spec = json.loads(re.search(r"<script type='application/json' id='collective_matrix-0-data'>(.*?)</script>",
                                page.read_text()).group(1))
    cells = {(spec["rows"].index(r), spec["cols"].index(c)): v for r, c, v in _cells(spec) if v}
    assert cells == wire


def _cells(spec: dict):
    for i, row in enumerate(spec["values"]):
        for j, value in enumerate(row):
            yield spec["rows"][i], spec["cols"][j], None if value is None else int(value)


def test_simulate_replays_the_captured_operations(run, tmp_path):
    """`simulate`: its model is the operations' messages seen at both ends (the data writes, and the CTS writes
    the sends wait for), the same operations and bytes."""
    name, decoded = run
    model = collective_model(load_job_model(decoded))
    assert set(zip(model.messages["kind"], model.messages["seq"])) == {("all_reduce", 0), ("all_reduce", 1)}
    assert model.unmatched == 0
    pairs = model.messages.groupby(["src", "dst"])["size_bytes"].sum()
    wire = collections.Counter(_tshark_payload_per_pair(name, tmp_path))
    wire.update(_tshark_payload_per_pair(name, tmp_path, CTS_OPCODES))
    assert {pair: int(v) for pair, v in pairs.items()} == dict(wire)
    out = tmp_path / "sim"
    done = runner.invoke(app, ["simulate", str(decoded), "-o", str(out), "--json"])
    assert done.exit_code == 0, done.output
    assert (out / "summary.json").exists()
    shutil.rmtree(out)
