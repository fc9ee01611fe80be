"""tcpdump around a real socket exchange: captures of real traffic in the formats tcpdump writes."""
from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from tests.conftest import require_root, require_tool


@dataclass(frozen=True)
class TcpdumpRun:
    path: Path
    packets_captured: int       # as tcpdump reported it


@dataclass(frozen=True)
class Transfer:
    request: bytes              # client -> server
    reply: bytes                # server -> client
    port: int                   # the server's
    captures: dict[str, TcpdumpRun]


def _start_tcpdump(path: Path, args: list[str], bpf_filter: str) -> subprocess.Popen:
    # -U + --immediate-mode: every packet reaches the file at once; -B: a large kernel buffer, so a burst
    # on lo is not dropped; -Z root: write where the test says, whatever its permissions.
    proc = subprocess.Popen(
        [require_tool("tcpdump"), "-n", "-U", "--immediate-mode", "-B", "65536", "-Z", "root", "-w", str(path),
         *args, bpf_filter],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:                 # tcpdump says "listening on ..." once the capture runs
        seen.append(line)
        if line.startswith("tcpdump: listening on"):
            return proc
    proc.wait()
    raise AssertionError(f"tcpdump {' '.join(args)} did not start: {''.join(seen)}")


def _stop_tcpdump(proc: subprocess.Popen, path: Path) -> int:
    # Wait until the file stops growing (everything written), then SIGINT: tcpdump prints its counts.
    size, stable_since, deadline = -1, time.monotonic(), time.monotonic() + 20
    while time.monotonic() < deadline:
        now = path.stat().st_size if path.exists() else 0
        if now != size:
            size, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since > 0.3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    proc.wait(timeout=30)
    captured = re.search(r"(\d+) packets? captured", err)
    dropped = re.search(r"(\d+) packets? dropped by kernel", err)
    assert captured and dropped, f"unexpected tcpdump output: {err}"
    if int(dropped.group(1)):
        raise _Dropped(f"tcpdump dropped packets, the capture is not complete: {err}")
    return int(captured.group(1))


class _Dropped(AssertionError):
    """tcpdump could not keep up (a busy machine): the capture is incomplete, the transfer is run again."""


TRANSFER_ATTEMPTS = 3


def capture_tcp_transfer(out_dir: Path, request: bytes, reply: bytes, captures: dict[str, list[str]],
                         *, mss: int | None = None) -> Transfer:
    """One real TCP connection on 127.0.0.1 (client sends `request`, then the server `reply`), captured by
    one tcpdump per `captures` entry (name -> tcpdump arguments such as ["-i", "lo"]) into out_dir/name; run
    again (up to TRANSFER_ATTEMPTS times) when a tcpdump dropped packets."""
    require_root()
    for attempt in range(TRANSFER_ATTEMPTS):
        try:
            return _capture_tcp_transfer(out_dir, request, reply, captures, mss)
        except _Dropped:
            if attempt == TRANSFER_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _capture_tcp_transfer(out_dir: Path, request: bytes, reply: bytes, captures: dict[str, list[str]],
                          mss: int | None) -> Transfer:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    procs = {name: (out_dir / name, _start_tcpdump(out_dir / name, args, f"tcp port {port}"))
             for name, args in captures.items()}
    received = bytearray()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(1 << 16):
                received.extend(chunk)
            conn.sendall(reply)

    thread = threading.Thread(target=serve)
    thread.start()
    client = socket.socket()
    if mss is not None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
    client.connect(("127.0.0.1", port))
    client.sendall(request)
    client.shutdown(socket.SHUT_WR)
    got = bytearray()
    while chunk := client.recv(1 << 16):
        got.extend(chunk)
    client.close()
    thread.join()
    server.close()
    assert bytes(received) == request and bytes(got) == reply
    runs = {name: TcpdumpRun(path, _stop_tcpdump(proc, path)) for name, (path, proc) in procs.items()}
    return Transfer(request, reply, port, runs)
