"""The collective-library decoders inside the real decode pipeline (`decode_paths` and the CLI).

Their own tests drive each decoder through a small test driver; here the same captures go through the
pipeline — protocol detection on every TCP direction, non-TCP packets offered to the RoCE decoder, the
batched fast path and the per-packet path — and must give the rows the decoders give on their own, with
every table written. The NCCL and RoCE captures are generated from the protocol description (NCCL and
RDMA cannot run here); the Gloo capture is a real PyTorch job (pcaps/gloo).
"""
from __future__ import annotations

import collections

import pandas as pd
import pytest

from dlcsniff.decoders.protocols.gloo.decoder import GlooCaptureDecoder
from dlcsniff.decoders.protocols.nccl_socket.decoder import NcclSocketCaptureDecoder
from dlcsniff.decoders.capture_decoder import decode_capture
from dlcsniff.decoders.job import build_dataset, decode_paths
from dlcsniff.decoders.protocols.roce.decoder import RoceCaptureDecoder
from tests.conftest import PCAPS
from tests.support.protocol_driver import gloo_collectives, run_decoder
from tests.support.nccl_gen import ERA_INLINE, net_socket_capture
from tests.support.roce_gen import roce_capture

MESSAGE_FIELDS = {
    "roce": ["rdma_op", "dest_qp", "size_bytes", "imm", "va", "rkey", "nccl_role", "complete"],
    "nccl_socket": ["size_bytes", "nccl_seq", "nccl_inline", "nccl_tasks", "complete"],
    "nccl_bootstrap": ["peer_rank", "tag", "size_bytes"],
    "gloo": ["opcode", "slot", "collective", "seq", "tag", "length_bytes", "size_bytes", "complete"],
}


def _multiset(rows, protocol: str) -> collections.Counter:
    fields = MESSAGE_FIELDS[protocol]
    return collections.Counter(tuple(None if pd.isna(r.get(f)) else r.get(f) for f in fields)
                               for r in rows if r.get("protocol") == protocol)


def _rows(messages: pd.DataFrame) -> list[dict]:
    return messages.astype(object).where(messages.notna(), None).to_dict("records")


def _assert_same(tables, path, decoder, protocols):
    """The pipeline's message rows (`tables`, decoded from `path`) are the decoder's own on that capture."""
    alone, _ = run_decoder(path, decoder)
    alone_rows = [{"protocol": decoder.name, **row} for row in alone.messages]
    piped = _rows(tables["messages"].to_pandas())
    for protocol in protocols:
        expected = _multiset(alone_rows, protocol)
        assert sum(expected.values()) > 0, protocol
        assert _multiset(piped, protocol) == expected, protocol


def _assert_batched_is_per_packet(path):
    batched = build_dataset([decode_capture(path, batched=True)]).tables
    per_packet = build_dataset([decode_capture(path, batched=False)]).tables
    for name, table in batched.items():
        assert table.equals(per_packet[name]), name


def test_roce_through_the_pipeline(tmp_path):
    truth = roce_capture(tmp_path / "roce.pcap")
    tables = decode_paths([truth.path]).tables
    _assert_same(tables, truth.path, RoceCaptureDecoder(), ["roce"])
    streams = tables["streams"].to_pandas()
    roce = streams[streams["protocol"] == "roce"]
    assert len(roce) > 0 and roce["dest_qp"].notna().all() and roce["flow_id"].is_unique
    assert roce[["bad_icrc", "cnp", "retransmitted_packets", "naks"]].sum().gt(0).all()
    assert (streams["protocol"] == "nccl_ib_setup").sum() == 2
    _assert_batched_is_per_packet(truth.path)


def test_nccl_socket_through_the_pipeline(tmp_path):
    capture = net_socket_capture(tmp_path / "nccl.pcap", era=ERA_INLINE, nsocks=2)
    tables = decode_paths([capture.path]).tables
    _assert_same(tables, capture.path, NcclSocketCaptureDecoder(), ["nccl_socket", "nccl_bootstrap"])
    messages = tables["messages"].to_pandas()
    control = messages[messages["protocol"] == "nccl_socket"]
    streams = tables["streams"].to_pandas()
    assert set(control["flow_id"]) <= set(streams["flow_id"])
    _assert_batched_is_per_packet(capture.path)


@pytest.fixture(scope="module")
def gloo_rank0():
    return PCAPS / "gloo" / "rank0.pcap.gz"


def test_gloo_through_the_pipeline(gloo_rank0):
    tables = decode_paths([gloo_rank0]).tables
    _assert_same(tables, gloo_rank0, GlooCaptureDecoder(), ["gloo"])
    collectives = tables["collectives"].to_pandas()
    alone, _ = run_decoder(gloo_rank0, GlooCaptureDecoder())
    assert len(collectives) == len(gloo_collectives(alone)) > 0
    assert set(tables["streams"].to_pandas()["protocol"]) >= {"gloo", "tcpstore"}


def test_gloo_job_decodes_with_the_cli(tmp_path):
    from typer.testing import CliRunner

    from dlcsniff.cli import app
    result = CliRunner().invoke(app, ["decode", str(PCAPS / "gloo"), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "collectives:" in result.output and "gloo/all_reduce" in result.output
    collectives = pd.read_parquet(tmp_path / "collectives.parquet")
    assert set(collectives["capture"]) == {"rank0", "rank1", "rank2", "rank3"}
