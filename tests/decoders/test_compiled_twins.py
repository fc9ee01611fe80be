"""The compiled parts of the decoders (decoders/compiled.py: the record walk, the batch header reader, the ZMTP
resynchronisation search) change nothing they decode: every bundled capture, and real captures damaged as busy
machines and editing tools damage them (segments dropped, the start missing, cut by a snaplen, the file cut off),
decode to the same tables with them and with their pure-Python twins (DLCSNIFF_PURE_PYTHON=1), as
`dlcsniff decode` writes them (tests.support.decode_compare: schemas, pandas metadata, rows, manifests)."""
from __future__ import annotations

import gzip
import os
import subprocess

import pytest

from tests.conftest import PCAPS
from tests.support.decode_compare import DLCSNIFF, bundled_jobs, compare_dirs, compare_roots, decode_all
from tests.support.gloo_matrix import drop_segments

PURE = {"DLCSNIFF_PURE_PYTHON": "1"}
SOURCE = PCAPS / "mxnet_sync_large" / "worker0.pcap.gz"     # multi-segment tensors, SLL2 (tcpdump -i any)
LOSSY = PCAPS / "mxnet_lossy_heavy" / "server0.pcap.gz"     # recorded with a small capture buffer: real loss


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_bundled_capture_decodes_the_same_without_the_compiled_parts(tmp_path):
    jobs = bundled_jobs()
    decode_all(tmp_path / "compiled", jobs)
    decode_all(tmp_path / "pure", jobs, env=PURE)
    differences = compare_roots(tmp_path / "compiled", tmp_path / "pure")
    assert len(differences) == len(jobs)
    assert {job: found for job, found in differences.items() if found} == {}


def _damaged(tmp_path, damage: str):
    path = tmp_path / f"{damage}.pcap"
    if damage == "dropped":
        drop_segments(SOURCE, path, 0.05, seed=22)
        return path
    data = gzip.decompress(SOURCE.read_bytes())
    if damage == "truncated":
        path.write_bytes(data[:len(data) * 3 // 5])
        return path
    # "midstream" and "snaplen": rewritten by editcap, an independent tool
    source = tmp_path / "source.pcap"
    source.write_bytes(data)
    if damage == "snaplen":
        subprocess.run(["editcap", "-s", "1200", str(source), str(path)], check=True, capture_output=True)
        return path
    # the capture started 40 % of the way into the job: every connection caught mid-stream
    count = int(subprocess.run(["capinfos", "-c", "-M", "-T", "-r", str(source)], capture_output=True, text=True,
                               check=True).stdout.split()[-1])
    subprocess.run(["editcap", "-r", str(source), str(path), f"{count * 2 // 5}-{count}"], check=True,
                   capture_output=True)
    return path


@pytest.mark.parametrize("damage", ["dropped", "midstream", "snaplen", "truncated", "lossy"])
def test_damaged_captures_decode_the_same_without_the_compiled_parts(tmp_path, damage):
    capture = LOSSY if damage == "lossy" else _damaged(tmp_path, damage)
    outs = {}
    for label, env in (("compiled", None), ("pure", PURE)):
        outs[label] = tmp_path / label
        subprocess.run([str(DLCSNIFF), "-q", "decode", str(capture), "--out", str(outs[label])], check=True,
                       env=None if env is None else {**os.environ, **env}, stdout=subprocess.DEVNULL)
    assert compare_dirs(outs["compiled"], outs["pure"]) == []
