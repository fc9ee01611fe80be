"""A pyzmq workload between two hosts: every pattern, multipart messages, edge-size frames, and CURVE.

    zmq_job.py server --server-ip IP --base-port P --record PATH    (binds every socket)
    zmq_job.py client --server-ip IP --base-port P --record PATH    (connects, drives the phases)

Sockets (server side first), one TCP port each, from P upwards:
    P+0 REP    <- REQ      control channel and request/reply traffic
    P+1 ROUTER <- DEALER   multipart both ways
    P+2 PULL   <- PUSH     frames of 0, 1, 255, 256, 65535, 65536 and 70000 bytes
    P+3 PUB    -> SUB      subscribe, publish, unsubscribe (ZMTP 3.1 SUBSCRIBE / CANCEL commands)
    P+4 ROUTER <- DEALER   CURVE-encrypted (the server's public key travels over the REQ/REP channel)

Each side records every message it sends and receives: socket, socket type, endpoint (the server's
ip:port of that connection), direction, and per frame its size and sha256, with wall-clock ns times.
What the application hands to libzmq is recorded, not what libzmq adds: REQ/REP add an empty delimiter
frame on the wire, and a ROUTER's first frame (the routing id) selects the peer and is not sent.
A PUB drops messages that no subscription matches, so a PUB send is on the wire iff the SUB received it
(the recorder marks each send's `on_wire` accordingly).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

import zmq

EDGE_FRAME_SIZES = (0, 1, 255, 256, 65535, 65536, 70000)
PROBE_INTERVAL_S = 0.02
RECEIVE_TIMEOUT_MS = 20000
SOCKETS = (  # name, server type, client type, port offset, mechanism
    ("reqrep", zmq.REP, zmq.REQ, 0, "NULL"),
    ("dealer_router", zmq.ROUTER, zmq.DEALER, 1, "NULL"),
    ("pushpull", zmq.PULL, zmq.PUSH, 2, "NULL"),
    ("pubsub", zmq.PUB, zmq.SUB, 3, "NULL"),
    ("curve", zmq.ROUTER, zmq.DEALER, 4, "CURVE"),
)


def payload(seed: str, size: int) -> bytes:
    """Deterministic frame contents, so that the record's hashes can be regenerated: a random 64-byte
    block repeated (distinct per seed and size, and the bundled captures gzip well)."""
    block = random.Random(f"{seed}:{size}").randbytes(64)
    return (block * (size // 64 + 1))[:size]


class RecordedSockets:
    """The side's sockets; every send and receive goes through here and is logged."""

    def __init__(self, side: str, server_ip: str, base_port: int) -> None:
        self.side = side
        self.context = zmq.Context()
        self.sockets: dict[str, zmq.Socket] = {}
        self.endpoints: dict[str, str] = {}
        self.descriptions: list[dict] = []
        self.messages: list[dict] = []
        self.curve_counts = {"sent": 0, "received": 0}
        self.server_ip = server_ip
        self.base_port = base_port

    def open(self, name: str, socket_type: int, port_offset: int, mechanism: str, **options: object) -> zmq.Socket:
        socket = self.context.socket(socket_type)
        socket.linger = 2000
        socket.rcvtimeo = RECEIVE_TIMEOUT_MS
        for option, value in options.items():
            setattr(socket, option, value)
        endpoint = f"{self.server_ip}:{self.base_port + port_offset}"
        if self.side == "server":
            socket.bind(f"tcp://{endpoint}")
        else:
            socket.connect(f"tcp://{endpoint}")
        self.sockets[name] = socket
        self.endpoints[name] = endpoint
        self.descriptions.append({"side": self.side, "socket": name, "type": socket_type_name(socket_type),
                                  "endpoint": endpoint, "bind": self.side == "server", "mechanism": mechanism})
        return socket

    def _log(self, name: str, direction: str, frames: list[bytes], ts_ns: int) -> None:
        socket = self.sockets[name]
        entry = {
            "side": self.side,
            "socket": name,
            "type": socket_type_name(socket.type),
            "endpoint": self.endpoints[name],
            "direction": direction,
            "send_ns" if direction == "send" else "recv_ns": ts_ns,
            "frames": [{"size": len(frame), "sha256": hashlib.sha256(frame).hexdigest()} for frame in frames],
        }
        if socket.type == zmq.ROUTER:
            # The routing id is local to the ROUTER (it names the peer) and never crosses the wire.
            entry["routing_id"] = frames[0].hex()
            entry["frames"] = entry["frames"][1:]
        self.messages.append(entry)
        if name == "curve":
            self.curve_counts["sent" if direction == "send" else "received"] += 1

    def send(self, name: str, frames: list[bytes]) -> None:
        ts_ns = time.time_ns()
        self.sockets[name].send_multipart(frames, copy=True)
        self._log(name, "send", frames, ts_ns)

    def recv(self, name: str) -> list[bytes]:
        frames = self.sockets[name].recv_multipart()
        self._log(name, "recv", frames, time.time_ns())
        return frames

    def close(self) -> None:
        for socket in self.sockets.values():
            socket.close()
        self.context.term()

    def record(self) -> dict:
        return {"side": self.side, "pid": os.getpid(), "versions": {"libzmq": zmq.zmq_version(), "pyzmq": zmq.__version__},
                "sockets": self.descriptions, "curve": {self.side: self.curve_counts}, "messages": self.messages}


def socket_type_name(socket_type: int) -> str:
    return zmq.SocketType(socket_type).name


def run_server(sockets: RecordedSockets) -> None:
    public_key, secret_key = zmq.curve_keypair()
    for name, server_type, _, offset, mechanism in SOCKETS:
        options = {"curve_server": True, "curve_secretkey": secret_key} if mechanism == "CURVE" else {}
        sockets.open(name, server_type, offset, mechanism, **options)
    poller = zmq.Poller()
    for name in ("reqrep", "dealer_router", "pushpull", "curve"):
        poller.register(sockets.sockets[name], zmq.POLLIN)
    probe_topic: bytes | None = None
    probes_sent = 0
    while True:
        ready = dict(poller.poll(PROBE_INTERVAL_S * 1000 if probe_topic else RECEIVE_TIMEOUT_MS))
        if not ready and probe_topic is None:
            raise SystemExit("server: no message from the client")
        if probe_topic is not None:
            sockets.send("pubsub", [probe_topic, b"probe %d" % probes_sent])
            probes_sent += 1
        if sockets.sockets["reqrep"] in ready:
            request = sockets.recv("reqrep")
            command = request[0]
            if command == b"curve-key":
                sockets.send("reqrep", [public_key])
            elif command == b"probe":
                probe_topic, probes_sent = request[1], 0
                sockets.send("reqrep", [b"probing"])
            elif command == b"stop-probe":
                probe_topic = None
                sockets.send("reqrep", [b"stopped", b"%d" % probes_sent])
            elif command == b"publish":
                for topic in (b"weather", b"sports", b"weather", b"news"):
                    sockets.send("pubsub", [topic, payload(topic.decode(), 300)])
                sockets.send("reqrep", [b"published"])
            elif command == b"done":
                sockets.send("reqrep", [b"bye"])
                return
            else:
                # A request: the reply mirrors its frame sizes (reversed) with fresh contents.
                sockets.send("reqrep", [payload("rep", len(frame)) for frame in reversed(request)])
        for name in ("dealer_router", "curve"):
            if sockets.sockets[name] in ready:
                routing_id, *frames = sockets.recv(name)
                sockets.send(name, [routing_id, b"ack", *(payload(f"{name}-reply", len(f)) for f in frames)])
        if sockets.sockets["pushpull"] in ready:
            sockets.recv("pushpull")


def run_client(sockets: RecordedSockets) -> None:
    for name, _, client_type, offset, mechanism in SOCKETS:
        if mechanism == "CURVE":
            continue
        sockets.open(name, client_type, offset, mechanism)

    def request(*frames: bytes) -> list[bytes]:
        sockets.send("reqrep", list(frames))
        return sockets.recv("reqrep")

    # Request/reply: single frames of every edge size, then one multipart request holding all of them.
    for size in EDGE_FRAME_SIZES:
        request(payload("req", size))
    request(*(payload("req-multi", size) for size in EDGE_FRAME_SIZES))

    # DEALER -> ROUTER: multipart both ways (the ROUTER answers each message).
    for parts in ((0,), (5, 0, 7), (255, 256), (70000, 1, 65536)):
        sockets.send("dealer_router", [payload("dealer", size) for size in parts])
        sockets.recv("dealer_router")

    # PUSH -> PULL: every edge size, then a multipart message; a request afterwards makes sure they arrived.
    for size in EDGE_FRAME_SIZES:
        sockets.send("pushpull", [payload("push", size)])
    sockets.send("pushpull", [payload("push-multi", size) for size in (3, 0, 70000)])
    request(b"ping")

    # PUB -> SUB: subscriptions travel client -> server; probes show when the publisher has applied them.
    sub = sockets.sockets["pubsub"]

    def wait_for_probe(topic: bytes) -> None:
        """Ask for probes on `topic` until one arrives, then stop them and take the rest in flight: the
        publisher drops those sent before it applied the subscription, and delivers every later one."""
        request(b"probe", topic)
        topic_received, sequence = sockets.recv("pubsub")
        assert topic_received == topic, topic_received
        probes_sent = int(request(b"stop-probe")[1])
        while int(sequence.split()[1]) < probes_sent - 1:
            topic_received, sequence = sockets.recv("pubsub")

    for topic in (b"weather", b"sports", b"sync1"):
        sub.subscribe(topic)
    wait_for_probe(b"sync1")
    request(b"publish")  # weather, sports, weather, news: the client gets weather, sports, weather
    for _ in range(3):
        sockets.recv("pubsub")
    sub.unsubscribe(b"sports")
    sub.unsubscribe(b"sync1")
    sub.subscribe(b"sync2")
    wait_for_probe(b"sync2")
    request(b"publish")  # now only weather, weather
    for _ in range(2):
        sockets.recv("pubsub")

    # CURVE: DEALER -> ROUTER with the server's public key fetched in clear over REQ/REP.
    server_key = request(b"curve-key")[0]
    client_public, client_secret = zmq.curve_keypair()
    sockets.open("curve", zmq.DEALER, 4, "CURVE", curve_serverkey=server_key, curve_publickey=client_public,
                 curve_secretkey=client_secret)
    for parts in ((16,), (0, 300), (70000,)):
        sockets.send("curve", [payload("curve", size) for size in parts])
        sockets.recv("curve")
    request(b"done")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("side", choices=["server", "client"])
    parser.add_argument("--server-ip", required=True)
    parser.add_argument("--base-port", type=int, default=5555)
    parser.add_argument("--record", type=Path, required=True)
    args = parser.parse_args()
    sockets = RecordedSockets(args.side, args.server_ip, args.base_port)
    start_ns = time.time_ns()
    try:
        (run_server if args.side == "server" else run_client)(sockets)
    finally:
        sockets.close()
    record = {**sockets.record(), "start_ns": start_ns, "end_ns": time.time_ns(), "finished": True}
    partial = args.record.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=1))
    partial.replace(args.record)
    sys.stderr.flush()


if __name__ == "__main__":
    main()
