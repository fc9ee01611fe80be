"""Ground truth of when a capture began: a program that sends numbered, timestamped records over TCP on lo, every
MARK_PERIOD_S, until killed; the records a capture holds say from when (and without a gap until when) it
captured. For the daemon's start tests and its bench."""
from __future__ import annotations

import struct
import subprocess
from pathlib import Path

from dlcsniff.decoders.inputs.capture_file import open_capture
from lab.netns import Cluster
from tests.support.daemon import TOOL_PYTHON

MARK_PORT = 7150
MARK_PERIOD_S = 0.005
MARK = b"DLCSMARK"
MARK_RECORD = struct.Struct("<8sQQ")       # MARK, sequence number, send time (CLOCK_REALTIME ns)
# Sends a record to itself over lo every argv[2] seconds until killed; prints "connected" once connected.
MARKER = r"""
import socket, struct, sys, threading, time
port, period_s = int(sys.argv[1]), float(sys.argv[2])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen()
client = socket.create_connection(("127.0.0.1", port))
client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
peer, _ = server.accept()
threading.Thread(target=lambda: [None for _ in iter(lambda: peer.recv(65536), b"")], daemon=True).start()
print("connected", flush=True)
sequence = 0
while True:
    client.sendall(struct.pack("<8sQQ", b"DLCSMARK", sequence, time.time_ns()))
    sequence += 1
    time.sleep(period_s)
"""


def start_marker(cluster: Cluster | None = None, host: str | None = None) -> subprocess.Popen:
    """The marker program in a cluster's host (or here), once its connection is up."""
    argv = [str(TOOL_PYTHON), "-c", MARKER, str(MARK_PORT), str(MARK_PERIOD_S)]
    marker = (cluster.popen(host, argv, stdout=subprocess.PIPE) if cluster is not None
              else subprocess.Popen(argv, stdout=subprocess.PIPE))
    assert marker.stdout.readline().strip() == b"connected"
    return marker


def stop_marker(marker: subprocess.Popen) -> None:
    marker.kill()
    marker.wait()


def captured_marks(pcaps: list[Path]) -> dict[int, int]:
    """Sequence number -> send time of every record in these packet files."""
    marks = {}
    for pcap in pcaps:
        with open_capture(pcap) as reader:
            for packet in reader:
                data = bytes(packet.data)
                at = data.find(MARK)
                while at >= 0 and at + MARK_RECORD.size <= len(data):
                    _, sequence, sent_ns = MARK_RECORD.unpack_from(data, at)
                    marks[sequence] = sent_ns
                    at = data.find(MARK, at + MARK_RECORD.size)
    return marks
