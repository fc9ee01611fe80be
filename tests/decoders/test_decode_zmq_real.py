"""The decode of a real pyzmq workload (libzmq 4.3.5, ZMTP 3.1) against the workload's own record.

pcaps/zmq was recorded by lab/record.py: a server and a client in two network namespaces, every
socket pattern, frames of 0 to 70,000 bytes, and a CURVE pair. zmq_record.json lists every message each
side handed to libzmq; for every TCP direction the ZMTP messages decoded from each side's capture must be
exactly the recorded sends on that socket, in order, frame by frame.
"""
from __future__ import annotations

import pytest

from dlcsniff.decoders.job import decode_paths
from tests.conftest import PCAPS
from tests.support.groundtruth import load_job

# What libzmq puts on the wire besides the application's frames: REQ and REP prefix an empty delimiter.
DELIMITER_FRAME = {"REQ": [0], "REP": [0]}


@pytest.fixture(scope="module")
def decoded():
    job = load_job(PCAPS / "zmq")
    tables = {n: t.to_pandas() for n, t in decode_paths([PCAPS / "zmq"]).tables.items()}
    return job, tables


def _expected_sends(record) -> dict[tuple[str, str], list[list[int]]]:
    """(socket, sending side) → frame sizes of each message it put on the wire, in order."""
    sends: dict[tuple[str, str], list[list[int]]] = {}
    for msg in record["messages"]:
        if msg["direction"] == "send" and msg["on_wire"]:
            frames = DELIMITER_FRAME.get(msg["type"], []) + [f["size"] for f in msg["frames"]]
            sends.setdefault((msg["socket"], msg["side"]), []).append(frames)
    return sends


def test_every_recorded_message_is_decoded_in_order(decoded):
    job, tables = decoded
    record = job.zmq_record
    sockets = {(s["socket"], s["side"]): s for s in record["sockets"]}
    streams, zmtp = tables["streams"], tables["zmtp"]
    checked = 0
    for (socket, side), expected in _expected_sends(record).items():
        spec = sockets[(socket, side)]
        if spec["mechanism"] == "CURVE":
            continue
        ip, port = spec["endpoint"].rsplit(":", 1)
        # The binding side sends from the endpoint's port, the connecting side to it.
        on_port = streams["src_port"] if spec["bind"] else streams["dst_port"]
        for capture in ("client", "server"):
            flows = streams[(streams["capture"] == capture) & (on_port == int(port))]
            assert len(flows) == 1, (socket, side, capture)
            flow = flows.iloc[0]
            assert flow["socket_type"] == spec["type"] and flow["zmtp_version"] == "3.1"
            assert flow["mechanism"] == "NULL" and not flow["encrypted"]
            got = zmtp[(zmtp["flow_id"] == flow["flow_id"]) & zmtp["command"].isna()]
            assert [list(s) for s in got["frame_sizes"]] == expected, (socket, side, capture)
            assert got["complete"].all()
            assert (got["ts_first_ns"] <= got["ts_last_ns"]).all()
            checked += len(expected)
    assert checked == 2 * sum(len(v) for k, v in _expected_sends(record).items()
                              if sockets[k]["mechanism"] != "CURVE")


def test_subscriptions_are_zmtp31_commands(decoded):
    job, tables = decoded
    streams, zmtp = tables["streams"], tables["zmtp"]
    sub = streams[(streams["socket_type"] == "SUB") & (streams["capture"] == "server")].iloc[0]
    commands = zmtp[zmtp["flow_id"] == sub["flow_id"]]["command"].dropna().tolist()
    assert commands[0] == "READY"
    assert "SUBSCRIBE" in commands and "CANCEL" in commands


def test_curve_streams_are_marked_encrypted_and_counted(decoded):
    job, tables = decoded
    record = job.zmq_record
    streams, zmtp = tables["streams"], tables["zmtp"]
    curve_port = int(next(s for s in record["sockets"] if s["mechanism"] == "CURVE")["endpoint"].rsplit(":", 1)[1])
    for capture in ("client", "server"):
        flows = streams[(streams["capture"] == capture)
                        & ((streams["dst_port"] == curve_port) | (streams["src_port"] == curve_port))]
        assert len(flows) == 2 and flows["encrypted"].all() and (flows["mechanism"] == "CURVE").all()
        rows = zmtp[zmtp["flow_id"].isin(flows["flow_id"])]
        assert rows["command"].notna().all(), "no cleartext message may come out of a CURVE stream"
        # CURVE seals every frame in a MESSAGE command of its own.
        frames_sent = sum(len(m["frames"]) for m in record["messages"]
                          if m["socket"] == "curve" and m["direction"] == "send")
        assert (rows["command"] == "MESSAGE").sum() == frames_sent
        assert {"HELLO", "WELCOME", "INITIATE", "READY"} <= set(rows["command"])
