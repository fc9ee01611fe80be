"""RoCE whose ICRC proves nothing: captures from tools that alter the frames they record, claimed on the
transport's own structure, marked `icrc_verified = false`, with a warning.

The traffic is real, recorded elsewhere (pcaps/realcaps/softroce-tutorial: NCCL 2.20.5 over Soft-RoCE, a perftest
ib_write_bw run; their README says what each run did), altered as such a tool leaves it
(tests/support/roce_sniffer.py: every ICRC rewritten; `editcap -s` cutting the large packets before their ICRC).
Truth: scapy's ICRC computation says no altered packet verifies; tshark's InfiniBand dissector reads the same BTH
headers in the altered capture as in the original; and decoding the original capture, whose every ICRC verifies,
gives the messages, streams and collectives the altered one must give (that decode is checked against NCCL's logs
and the program in test_realcaps_nccl.py).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest

from dlcsniff.decoders.job import decode_paths
from tests.conftest import PCAPS, require_tool
from tests.support.roce_sniffer import icrc_verdicts, plain, rewrite_icrcs

REAL = PCAPS / "realcaps" / "softroce-tutorial"
NCCL_RUNS = ("ring2", "tree2")
# the packets a capture tool may count differently once it cannot check an ICRC
ICRC_COUNTERS = ("bad_icrc", "icrc_unchecked", "icrc_verified")
COLLECTIVE_COLUMNS = ["capture", "seq", "kind", "algorithm", "tensor_bytes", "local_rank", "world_size",
                      "wire_bytes_sent", "wire_bytes_received", "peers", "complete"]
# the data writes of 8 KiB (1082-byte frames) are cut, the CTS (138 bytes), ACKs and empty writes stay whole
SNAP_BYTES = 160


def _tshark_headers(path: Path) -> list[tuple[str, ...]]:
    out = subprocess.run([require_tool("tshark"), "-r", str(path), "-Y", "infiniband", "-T", "fields",
                          "-e", "ip.src", "-e", "ip.dst", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp",
                          "-e", "infiniband.bth.psn", "-e", "infiniband.bth.padcnt"],
                         capture_output=True, text=True, check=True).stdout
    return [tuple(line.split("\t")) for line in out.splitlines()]


def _altered(sources: list[Path], directory: Path, snap_bytes: int | None) -> list[Path]:
    """Each capture, under its own name in directory/altered, with every ICRC rewritten, then (snap_bytes) cut as
    `editcap -s` cuts; tshark reads the same transport headers in it as in the original."""
    (directory / "original").mkdir()
    (directory / "altered").mkdir()
    altered = []
    for source in sources:
        original = plain(source, directory / "original")
        dest = directory / "altered" / original.name
        rewritten = directory / f"{original.stem}.rewritten.pcap"
        rewrite_icrcs(original, rewritten)
        if snap_bytes is None:
            rewritten.replace(dest)
        else:
            subprocess.run([require_tool("editcap"), "-s", str(snap_bytes), str(rewritten), str(dest)], check=True,
                           capture_output=True)
        assert _tshark_headers(dest) == _tshark_headers(original)
        altered.append(dest)
    return altered


def _roce(tables) -> tuple[pd.DataFrame, pd.DataFrame]:
    messages = tables["messages"].to_pandas()
    streams = tables["streams"].to_pandas()
    return (messages[messages["protocol"] == "roce"].reset_index(drop=True),
            streams[streams["protocol"] == "roce"].reset_index(drop=True))


def _same_decode(original, altered) -> None:
    """The altered capture's RoCE messages, streams and NCCL collectives are the original's, but for how its
    packets' ICRCs were counted."""
    (messages, streams), (want_messages, want_streams) = _roce(altered.tables), _roce(original.tables)
    assert want_messages["icrc_verified"].all() and want_streams["icrc_verified"].all()
    assert not messages["icrc_verified"].any() and not streams["icrc_verified"].any()
    # event_id numbers the job's messages of every protocol: the snaplen that cut the RoCE packets also cut
    # some of the job's TCP messages, so the RoCE messages' numbers move while the messages do not
    pd.testing.assert_frame_equal(messages.drop(columns=["icrc_verified", "event_id"]),
                                  want_messages.drop(columns=["icrc_verified", "event_id"]))
    pd.testing.assert_frame_equal(streams.drop(columns=list(ICRC_COUNTERS)),
                                  want_streams.drop(columns=list(ICRC_COUNTERS)))
    collectives = altered.tables["collectives"].to_pandas().sort_values(["capture", "seq"], ignore_index=True)
    want = original.tables["collectives"].to_pandas().sort_values(["capture", "seq"], ignore_index=True)
    assert collectives[COLLECTIVE_COLUMNS].astype(str).equals(want[COLLECTIVE_COLUMNS].astype(str))
    assert altered.summary["unclaimed"]["udp_datagrams"] == 0


def _warnings(summary: dict) -> dict[str, str]:
    return {w.split(":")[0]: w for w in summary["warnings"] if "without a verified ICRC" in w}


@pytest.mark.parametrize("run", NCCL_RUNS)
def test_real_nccl_whose_every_icrc_was_rewritten(tmp_path, run):
    """No packet's ICRC verifies (scapy agrees): every queue pair is claimed on its headers, and the job's
    collectives come out as from the original capture."""
    sources = sorted((REAL / "nccl").glob(f"{run}_node*.pcap.gz"))
    altered = _altered(sources, tmp_path, None)
    for path in altered:
        assert set(icrc_verdicts(path)) == {False}
    original = decode_paths(sources, workers=0)
    decoded = decode_paths(altered, workers=0)
    _same_decode(original, decoded)
    assert decoded.tables["collectives"].column("kind").to_pylist() == ["all_reduce"] * 6     # 2 per rank
    _, streams = _roce(decoded.tables)
    warnings = _warnings(decoded.summary)
    assert set(warnings) == {path.stem for path in altered}
    for capture, group in streams.groupby("capture"):
        assert (group["bad_icrc"] == group["packets"]).all()
        assert f"{len(group)} RoCE queue-pair streams" in warnings[capture]
        assert f"({int(group['packets'].sum()):,} packets whose ICRC failed, 0 cut" in warnings[capture]


@pytest.mark.parametrize("run", NCCL_RUNS)
def test_real_nccl_cut_short_and_rewritten_keeps_the_whole_conversation(tmp_path, run):
    """The large packets cut before their ICRC, the small ones whole with a rewritten one: no stream loses its
    whole packets to the ICRC check, and the collectives are the original's."""
    sources = sorted((REAL / "nccl").glob(f"{run}_node*.pcap.gz"))
    altered = _altered(sources, tmp_path, SNAP_BYTES)
    for path in altered:
        verdicts = icrc_verdicts(path)
        assert set(verdicts) == {None, False} and verdicts[False] >= 10, verdicts
    decoded = decode_paths(altered, workers=0)
    _same_decode(decode_paths(sources, workers=0), decoded)
    assert decoded.tables["collectives"].column("kind").to_pylist() == ["all_reduce"] * 6
    _, streams = _roce(decoded.tables)
    assert set(_warnings(decoded.summary)) == {path.stem for path in altered}
    for capture, warning in _warnings(decoded.summary).items():
        mine = streams[streams["capture"] == capture]
        assert (f"({int(mine['bad_icrc'].sum()):,} packets whose ICRC failed, "
                f"{int(mine['icrc_unchecked'].sum()):,} cut before it") in warning


def test_verbs_traffic_cut_short_and_rewritten(tmp_path):
    """perftest's ib_write_bw (5 WRITEs of 3000 bytes): the WRITE packets cut, the ACKs whole with a rewritten
    ICRC; both directions claimed, every message as in the original."""
    source = REAL / "perftest" / "rdma_write_bw.pcap.gz"
    altered = _altered([source], tmp_path, SNAP_BYTES)
    assert icrc_verdicts(altered[0]) == {None: 15, False: 5}
    decoded = decode_paths(altered, workers=0)
    _same_decode(decode_paths([source], workers=0), decoded)
    messages, streams = _roce(decoded.tables)
    assert sorted(messages["rdma_op"]) == ["WRITE"] * 5 and streams["acks"].sum() == 5
