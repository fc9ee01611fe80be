"""Damaged real captures decode as far as the data allows, say what was lost, and never crash.

The damage is done to a real capture (worker0 of the large MXNet job: multi-segment tensors) with dpkt,
independently of dlcsniff's readers; the undamaged decode of the same file is the reference.
"""
from __future__ import annotations

import collections
import gzip
import random

import dpkt
import dpkt.sll2
import pandas as pd
import pytest

from dlcsniff.decoders.job import decode_paths
from tests.conftest import PCAPS

SOURCE = PCAPS / "mxnet_sync_large" / "worker0.pcap.gz"
KEY = ["ps_timestamp", "customer_id", "sender_id", "recver_id", "request", "push", "pull", "control_cmd", "size_bytes"]


def _records():
    with gzip.open(SOURCE, "rb") as f:
        reader = dpkt.pcap.Reader(f)
        return reader.datalink(), [(ts, bytes(buf)) for ts, buf in reader]


def _write(path, linktype, records):
    with open(path, "wb") as f:
        writer = dpkt.pcap.Writer(f, linktype=linktype, nano=False)
        for ts, buf in records:
            writer.writepkt(buf, ts=ts)
    return path


def _tcp(buf: bytes):
    ip = dpkt.sll2.SLL2(buf).data
    return (ip, ip.data) if isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.tcp.TCP) else (None, None)


def _tcp_payload(buf: bytes) -> int:
    _, tcp = _tcp(buf)
    return len(tcp.data) if tcp is not None else 0


def _segment_id(buf: bytes):
    ip, tcp = _tcp(buf)
    return (ip.src, tcp.sport, ip.dst, tcp.dport, tcp.seq)


def _decode(path):
    ds = decode_paths([path])
    return ds.tables["messages"].to_pandas(), ds.summary


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    linktype, records = _records()
    path = _write(tmp_path_factory.mktemp("ref") / "worker0.pcap", linktype, records)
    messages, summary = _decode(path)
    assert summary["missing_bytes"] == 0 and len(messages) > 50
    return linktype, records, messages, summary


def _as_multiset(messages: pd.DataFrame) -> pd.Series:
    return messages[KEY].astype("string").fillna("<NA>").agg("|".join, axis=1).value_counts().sort_index()


def test_reordered_segments_change_nothing(reference, tmp_path):
    linktype, records, ref, _ = reference
    rng = random.Random(7)
    shuffled = list(records)
    for start in range(0, len(shuffled) - 6, 6):     # shuffle within windows of 6 packets
        window = shuffled[start:start + 6]
        rng.shuffle(window)
        shuffled[start:start + 6] = window
    messages, summary = _decode(_write(tmp_path / "worker0.pcap", linktype, shuffled))
    assert summary["missing_bytes"] == 0 and summary["incomplete_messages"] == 0
    pd.testing.assert_series_equal(_as_multiset(messages), _as_multiset(ref))


def test_duplicated_segments_are_counted_once(reference, tmp_path):
    linktype, records, ref, ref_summary = reference
    rng = random.Random(11)
    duplicated, dup_bytes = [], 0
    for ts, buf in records:
        duplicated.append((ts, buf))
        if rng.random() < 0.05:
            duplicated.append((ts, buf))
            dup_bytes += _tcp_payload(buf)
    messages, summary = _decode(_write(tmp_path / "worker0.pcap", linktype, duplicated))
    assert dup_bytes > 0
    # The real capture already holds the job's own retransmissions (a loaded veth): counted on top.
    assert summary["retransmitted_bytes"] == ref_summary["retransmitted_bytes"] + dup_bytes
    pd.testing.assert_series_equal(_as_multiset(messages), _as_multiset(ref))


def test_dropped_segments_become_holes_and_touched_messages_incomplete(reference, tmp_path):
    linktype, records, ref, _ = reference
    rng = random.Random(3)
    # Only segments whose bytes travelled once: dropping one copy of a retransmitted segment loses nothing.
    sent = collections.Counter(_segment_id(buf) for _, buf in records if _tcp_payload(buf))
    big = [i for i, (_, buf) in enumerate(records) if _tcp_payload(buf) >= 1000 and sent[_segment_id(buf)] == 1]
    # Keep the connection set-up; drop 2 % of the full-size segments after it.
    dropped = set(rng.sample(big[len(big) // 10:], max(3, len(big) // 50)))
    kept = [r for i, r in enumerate(records) if i not in dropped]
    messages, summary = _decode(_write(tmp_path / "worker0.pcap", linktype, kept))
    lost = sum(_tcp_payload(records[i][1]) for i in dropped)
    assert summary["missing_bytes"] == lost
    assert summary["streams_with_holes"] >= 1
    incomplete = messages[~messages["complete"]]
    assert 1 <= len(incomplete) <= len(dropped)
    # Every message no hole touched is decoded exactly as before.
    complete = _as_multiset(messages[messages["complete"]])
    reference_counts = _as_multiset(ref)
    assert (complete <= reference_counts.reindex(complete.index, fill_value=0)).all()
    assert complete.sum() >= len(ref) - len(dropped)


def test_capture_started_mid_connection_resynchronises(reference, tmp_path):
    linktype, records, ref, _ = reference
    cut = len(records) // 3
    dataset = decode_paths([_write(tmp_path / "worker0.pcap", linktype, records[cut:])])
    messages, summary = dataset.tables["messages"].to_pandas(), dataset.summary
    cut_ns = int(round(records[cut][0] * 1e9))
    assert summary["midstream_streams"] > 0
    streams = dataset.tables["streams"].to_pandas()
    midstream = streams[~streams["syn_seen"] & (streams["bytes"] > 0)]
    assert len(midstream) and (midstream["protocol"] == "pslite").all(), "caught mid-connection, still ps-lite"
    later = ref[ref["ts_first_ns"] > cut_ns + 5_000_000]        # messages that start well after the cut
    on_wire = ["ps_timestamp", "customer_id", "request", "push", "pull", "size_bytes", "ts_first_ns"]
    found = later[on_wire].merge(messages[on_wire], how="inner", on=on_wire)
    assert len(later) > 10
    assert len(found) >= 0.95 * len(later), f"only {len(found)} of {len(later)} later messages recovered"


def test_truncated_capture_decodes_up_to_the_cut_with_a_warning(reference, tmp_path):
    linktype, records, ref, _ = reference
    whole = _write(tmp_path / "whole.pcap", linktype, records)
    data = whole.read_bytes()
    cut = tmp_path / "worker0.pcap"
    cut.write_bytes(data[: len(data) * 2 // 3 + 7])      # mid-record, as a killed tcpdump leaves it
    messages, summary = _decode(cut)
    assert any("truncat" in w for w in summary["warnings"])
    assert 0.4 * len(ref) < len(messages) < len(ref)
