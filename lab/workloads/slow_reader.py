"""A TCP receiver that stops reading, and a sender that keeps sending: real zero-window advertisements.

    slow_reader.py --role reader --port P --receive-buffer B --pauses K --pause-s S --record PATH
    slow_reader.py --role sender --host IP --port P --bytes N --record PATH

The reader accepts one connection on a listening socket whose receive buffer is B bytes (SO_RCVBUF, set before
listen: the accepted socket inherits it), reads a little, then K times stops reading for S seconds (its kernel
buffers what arrives until the buffer is full, then advertises a zero window) and reads again, and finally reads
to the end of the stream. The sender sends N bytes as fast as the connection takes them and closes it.
Each writes its record (JSON): the reader, every pause (wall-clock ns before and after the sleep) and the bytes
it read; the sender, the bytes it sent; both `finished` (lab/record.py reads it).
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from pathlib import Path

CHUNK_BYTES = 65536
# What the sender sends, repeated: text (2 MB of zero bytes read as NCCL socket framing, a million empty messages)
PATTERN = b"dlcsniff slow reader: the receiver stopped reading\n"
READ_BEFORE_PAUSE_BYTES = 262_144     # read between pauses: the sender's window opens and fills again
CONNECT_TIMEOUT_S = 10.0


def write_record(path: Path, record: dict) -> None:
    path.write_text(json.dumps(record, indent=1) + "\n")


def read_bytes(conn: socket.socket, limit: int | None) -> int:
    """Read up to `limit` bytes (None: to the end of the stream); how many were read."""
    read = 0
    while limit is None or read < limit:
        data = conn.recv(CHUNK_BYTES if limit is None else min(CHUNK_BYTES, limit - read))
        if not data:
            break
        read += len(data)
    return read


def reader(args: argparse.Namespace, record: dict) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, args.receive_buffer)
    listener.bind(("0.0.0.0", args.port))
    listener.listen(1)
    conn, peer = listener.accept()
    record.update(peer=f"{peer[0]}:{peer[1]}", receive_buffer=conn.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
                  pauses=[])
    read = 0
    for _ in range(args.pauses):
        read += read_bytes(conn, READ_BEFORE_PAUSE_BYTES)
        start_ns = time.time_ns()
        time.sleep(args.pause_s)
        record["pauses"].append({"start_ns": start_ns, "end_ns": time.time_ns()})
    record["bytes_read"] = read + read_bytes(conn, None)
    conn.close()
    listener.close()


def sender(args: argparse.Namespace, record: dict) -> None:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            conn = socket.create_connection((args.host, args.port), timeout=CONNECT_TIMEOUT_S)
            break
        except (ConnectionRefusedError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    conn.settimeout(None)
    payload = (PATTERN * (CHUNK_BYTES // len(PATTERN) + 1))[:CHUNK_BYTES]
    sent = 0
    while sent < args.bytes:
        sent += conn.send(payload[:min(CHUNK_BYTES, args.bytes - sent)])
    conn.shutdown(socket.SHUT_WR)
    read_bytes(conn, None)                  # the reader's close
    conn.close()
    record["bytes_sent"] = sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["reader", "sender"], required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--receive-buffer", type=int, default=32768, help="reader: SO_RCVBUF, bytes")
    parser.add_argument("--pauses", type=int, default=3, help="reader: times it stops reading")
    parser.add_argument("--pause-s", type=float, default=0.5, help="reader: seconds of each stop")
    parser.add_argument("--bytes", type=int, default=2_000_000, help="sender: bytes to send")
    parser.add_argument("--record", type=Path, required=True)
    args = parser.parse_args()
    record = {"role": args.role, "start_ns": time.time_ns()}
    (reader if args.role == "reader" else sender)(args, record)
    record.update(end_ns=time.time_ns(), finished=True)
    write_record(args.record, record)


if __name__ == "__main__":
    main()
