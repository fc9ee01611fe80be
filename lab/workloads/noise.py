"""What else travels on a cloud VM's network beside a training job: TLS to an API, HTTP to the instance metadata
service, DNS queries, and a port scanner. Real programs and real protocol stacks (Python's ssl over OpenSSL,
http.server, nmap), between namespaces of the job's own cluster.

    noise.py serve  --cert PEM --key PEM --duration S --record PATH   (a service host: HTTPS 443, HTTP 80, DNS 53/udp)
    noise.py client --server IP --duration S --record PATH            (on a job node: a request of each kind in turn)
    noise.py scan   --targets IP... --wait-for IP:PORT --record PATH  (nmap: a TCP connect scan of the nodes)

Each side records what it did (requests made and answered, by kind; nmap's own report of open ports).
"""
from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import socket
import socketserver
import ssl
import struct
import sys
import threading
import time
import urllib.request

HTTPS_PORT, HTTP_PORT, DNS_PORT = 443, 80, 53
METADATA = {"instance-id": "i-0123456789abcdef0", "instance-type": "gpu.large", "local-ipv4": "unset"}
CLIENT_PAUSE_S = 0.15


class _Metadata(http.server.BaseHTTPRequestHandler):
    """An instance metadata service (the 169.254.169.254 kind): JSON under /latest/meta-data/."""

    def do_GET(self) -> None:
        body = json.dumps({"path": self.path, **METADATA}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _write_record(path: str, record: dict) -> None:
    """Whole or not at all: the recorder polls the file while the program runs."""
    with open(path + ".partial", "w") as out:
        json.dump(record, out)
    os.replace(path + ".partial", path)


def _dns_answer(query: bytes) -> bytes:
    """An A record answer to a DNS query (RFC 1035 framing): header, the question echoed, one answer."""
    ident, _, qdcount = struct.unpack_from(">HHH", query)
    end = 12
    while query[end]:
        end += query[end] + 1
    question = query[12:end + 5]
    answer = struct.pack(">HHHLH4s", 0xC00C, 1, 1, 60, 4, socket.inet_aton("198.18.255.1"))
    return struct.pack(">HHHHHH", ident, 0x8180, qdcount, 1, 0, 0) + question + answer


def _dns_query(name: str) -> bytes:
    labels = b"".join(bytes([len(part)]) + part.encode() for part in name.split("."))
    return struct.pack(">HHHHHH", random.randrange(1 << 16), 0x0100, 1, 0, 0, 0) + labels + b"\x00" + \
        struct.pack(">HH", 1, 1)


def serve(args) -> None:
    record = {"role": "serve", "pid": os.getpid(), "dns_answers": 0}
    plain = _Server(("0.0.0.0", HTTP_PORT), _Metadata)
    secure = _Server(("0.0.0.0", HTTPS_PORT), _Metadata)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    for server in (plain, secure):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind(("0.0.0.0", DNS_PORT))
    dns.settimeout(0.5)
    print("serving", flush=True)
    deadline = time.monotonic() + args.duration
    while time.monotonic() < deadline:
        try:
            query, peer = dns.recvfrom(512)
        except socket.timeout:
            continue
        dns.sendto(_dns_answer(query), peer)
        record["dns_answers"] += 1
    _write_record(args.record, {**record, "finished": True})


def client(args) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE             # a self-signed certificate: the bytes are what matter
    tried = {"https": 0, "http": 0, "dns": 0}     # a TCP connection (or a datagram) each, answered or not
    done = dict(tried)
    resolver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    resolver.settimeout(1.0)

    def https() -> None:
        urllib.request.urlopen(f"https://{args.server}:{HTTPS_PORT}/v1/models", context=context, timeout=2).read()

    def http() -> None:
        urllib.request.urlopen(f"http://{args.server}:{HTTP_PORT}/latest/meta-data/instance-id", timeout=2).read()

    def dns() -> None:
        resolver.sendto(_dns_query("storage.example.internal"), (args.server, DNS_PORT))
        resolver.recvfrom(512)

    deadline = time.monotonic() + args.duration
    while time.monotonic() < deadline:
        for kind, request in (("https", https), ("http", http), ("dns", dns)):
            tried[kind] += 1
            try:
                request()
                done[kind] += 1
            except OSError as exc:                  # the service host may not be up yet
                print(f"noise client: {kind}: {exc}", file=sys.stderr, flush=True)
        time.sleep(CLIENT_PAUSE_S)
    _write_record(args.record, {"role": "client", "pid": os.getpid(), "tried": tried, "done": done,
                                "finished": True})


def scan(args) -> None:
    """A TCP connect scan (nmap -sT: full handshakes on open ports, then a reset) of the well-known ports and the
    range a parameter server listens in."""
    import subprocess
    host, port = args.wait_for.rsplit(":", 1)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:               # scan while the job runs: once its scheduler listens
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    report = subprocess.run(["nmap", "-sT", "-Pn", "-n", "-T4", "-p", "22,53,80,443,9000-9300", "-oG", "-",
                             *args.targets], capture_output=True, text=True, check=True).stdout
    open_ports = {line.split("Host: ")[1].split()[0]: line.split("Ports: ")[1].strip()
                  for line in report.splitlines() if "Ports: " in line}
    _write_record(args.record, {"role": "scanner", "pid": os.getpid(), "open_ports": open_ports, "finished": True})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--cert", required=True)
    s.add_argument("--key", required=True)
    s.add_argument("--duration", type=float, required=True)
    s.add_argument("--record", required=True)
    c = sub.add_parser("client")
    c.add_argument("--server", required=True)
    c.add_argument("--duration", type=float, required=True)
    c.add_argument("--record", required=True)
    n = sub.add_parser("scan")
    n.add_argument("--targets", nargs="+", required=True)
    n.add_argument("--wait-for", required=True, help="IP:PORT that must accept a connection before the scan")
    n.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it")
    n.add_argument("--record", required=True)
    args = parser.parse_args()
    {"serve": serve, "client": client, "scan": scan}[args.command](args)


if __name__ == "__main__":
    main()
