"""Several hosts on one machine: network namespaces on a private bridge, one capture per host.

Layout of a `Cluster` tagged T with hosts h0, h1, ...:

    netns dlcs-T-bridge:  br0 ── veth0 ── (veth pair) ── eth0 in netns dlcs-T-h0  198.18.k.1/24
                              └─ veth1 ── (veth pair) ── eth0 in netns dlcs-T-h1  198.18.k.2/24 ...

Nothing is created in the root namespace, and the host namespaces have no route but their own /24:
whatever runs inside can only reach the other hosts of the same cluster. Each cluster holds a lock on
its own /24 of 198.18.0.0/15 (a file lock, released by the kernel even if the process dies), so
clusters built at the same time never share addresses.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

TEST_NETWORK = ipaddress.ip_network("198.18.0.0/15")
SUBNET_PREFIX_LEN = 24
SUBNET_LOCK_DIR = Path("/run/dlcsniff/subnets")
BRIDGE_NETNS_SUFFIX = "bridge"
DEFAULT_MTU = 1500
ETHERNET_HEADER_BYTES = 14
LINK_QUEUE_MS = 20             # a rate-limited link's queue (limit_rate), in time at its rate
# A rate-limited link's bucket (limit_rate): one millisecond at its rate, but never under LINK_BUCKET_MIN_BYTES.
# Measured (the Gloo all-reduce job, 4 ranks, 10 MiB a step): with a bucket of 65 kB or less (1 ms at up to
# 520 Mbit/s), the shaper released the senders' queued segments a timer at a time — 7.5-17 k local timer
# interrupts a second, against 0.8-2.2 k with 80 kB or more, and 2-8x the network softirqs — and that took the
# cores the job needed: at 400 Mbit/s a step took 0.61-0.69 s with 50-65 kB, 0.33-0.36 s with 80-200 kB
# (at 800 Mbit/s, 0.43 s with 50 kB, 0.21 s with 100 kB). A NIC has no such cost; 96 KiB is 8 ms at 100 Mbit/s.
LINK_BUCKET_MIN_BYTES = 96 * 1024
# Offloads off so that captures show wire-sized segments (no TSO/GSO super-packets, no GRO merging)
# and valid checksums (tx checksum offload leaves them unfilled in a capture taken on the sender).
ANY_LINK_HEADER_ROOM = 64      # a Linux cooked header (16 or 20 bytes) and room to spare
OFFLOADS_OFF = ("tso", "off", "gso", "off", "gro", "off", "tx", "off")
# Kernel ring per capture: with libpcap's default (2 MiB) a few nodes moving ~100 MB/s on 2 cores drop packets.
DEFAULT_CAPTURE_BUFFER_KIB = 65536
# tc tbf (Cluster.limit_send_rate): room for a burst of segments, and how long a packet may wait before it is
# dropped.
TBF_BURST = "256kb"
TBF_LATENCY = "200ms"
HOST_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,30}")
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,40}")
TCPDUMP_READY = b"listening on"
TCPDUMP_STATS_RE = {
    "packets_captured": re.compile(rb"(\d+) packets? captured"),
    "packets_received_by_filter": re.compile(rb"(\d+) packets? received by filter"),
    "packets_dropped_by_kernel": re.compile(rb"(\d+) packets? dropped by kernel"),
}


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    """Wait until the killed processes are dead (gone, or zombies left to their parents): a SIGKILL takes effect
    when the process next runs, which on busy cores can be a while after the kill."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    if stat.read().split(") ", 1)[1][0] in "ZX":
                        break
            except (FileNotFoundError, ProcessLookupError):
                break
            time.sleep(0.01)


class NetnsError(RuntimeError):
    """A namespace, link or capture could not be set up or used."""


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    netns: str
    ip: str
    interface: str = "eth0"
    bridge_port: str = ""          # the host's veth end on the bridge (in the bridge namespace)


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """tcpdump's own closing counts."""

    packets_captured: int
    packets_received_by_filter: int
    packets_dropped_by_kernel: int


def _run(argv: Sequence[str], *, timeout_s: float = 30.0) -> subprocess.CompletedProcess[bytes]:
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"{' '.join(argv)}: no answer within {timeout_s} s") from exc
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()
        raise NetnsError(f"{' '.join(argv)}: exit {done.returncode}: {detail}")
    return done


def netns_names() -> set[str]:
    listing = _run(["ip", "netns", "list"]).stdout.decode()
    return {line.split()[0] for line in listing.splitlines() if line.strip()}


def _lock_free_subnet() -> tuple[ipaddress.IPv4Network, IO[bytes]]:
    SUBNET_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    for subnet in TEST_NETWORK.subnets(new_prefix=SUBNET_PREFIX_LEN):
        lock_file = open(SUBNET_LOCK_DIR / str(subnet.network_address), "ab")  # noqa: SIM115 - held for the cluster's life
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.close()
            continue
        return subnet, lock_file
    raise NetnsError(f"every /{SUBNET_PREFIX_LEN} of {TEST_NETWORK} is held by another cluster")


def _stop_process(process: subprocess.Popen, grace_s: float) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Capture:
    """A tcpdump running inside one namespace, writing a pcap file."""

    def __init__(self, process: subprocess.Popen, path: Path, startup_timeout_s: float) -> None:
        self.process = process
        self.path = path
        self._stderr = bytearray()
        self._wait_until_listening(startup_timeout_s)

    def _wait_until_listening(self, timeout_s: float) -> None:
        assert self.process.stderr is not None
        fd = self.process.stderr.fileno()
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while TCPDUMP_READY not in self._stderr:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0 or not selector.select(remaining_s):
                    self.process.kill()
                    self.process.wait()
                    raise NetnsError(f"tcpdump for {self.path} not listening after {timeout_s} s")
                chunk = os.read(fd, 4096)
                if not chunk:
                    self.process.wait()
                    raise NetnsError(f"tcpdump for {self.path} exited: {self._stderr.decode(errors='replace')}")
                self._stderr += chunk

    def _wait_until_idle(self, idle_s: float, timeout_s: float) -> None:
        """Wait until the file has stopped growing for idle_s: tcpdump has written what the kernel queued
        (with -U every packet is flushed as it is written)."""
        deadline = time.monotonic() + timeout_s
        size, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline and self.process.poll() is None:
            current = self.path.stat().st_size if self.path.exists() else 0
            now = time.monotonic()
            if current != size:
                size, quiet_since = current, now
            elif now - quiet_since >= idle_s:
                return
            time.sleep(idle_s / 4)

    def stop(self, timeout_s: float = 10.0, idle_s: float = 0.3) -> CaptureStats:
        """Wait for the capture to go quiet, SIGINT (tcpdump flushes and prints its counts), wait for it to
        exit, and return the counts."""
        self._wait_until_idle(idle_s, timeout_s)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            _, rest = self.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise NetnsError(f"tcpdump for {self.path} ignored SIGINT for {timeout_s} s") from None
        self._stderr += rest or b""
        counts = {}
        for field, pattern in TCPDUMP_STATS_RE.items():
            found = pattern.search(self._stderr)
            if found is None:
                raise NetnsError(f"tcpdump for {self.path} printed no '{field}': {self._stderr.decode(errors='replace')}")
            counts[field] = int(found.group(1))
        return CaptureStats(**counts)


class Cluster:
    """Context manager: hosts in their own namespaces on one bridge; torn down on exit, whatever happens."""

    def __init__(self, tag: str, host_names: Sequence[str], *, mtu: int = DEFAULT_MTU) -> None:
        if not TAG_RE.fullmatch(tag):
            raise NetnsError(f"bad cluster tag {tag!r}: letters, digits, '_', '.', '-'")
        for name in host_names:
            if not HOST_NAME_RE.fullmatch(name) or name == BRIDGE_NETNS_SUFFIX:
                raise NetnsError(f"bad host name {name!r}: lower-case letters, digits and '_'")
        if len(set(host_names)) != len(host_names) or not host_names:
            raise NetnsError(f"host names must be unique and non-empty: {list(host_names)}")
        self.tag = tag
        self.mtu = mtu
        self._host_names = list(host_names)
        self.bridge_netns = f"dlcs-{tag}-{BRIDGE_NETNS_SUFFIX}"
        self.hosts: dict[str, Host] = {}
        self.subnet: ipaddress.IPv4Network | None = None
        self._subnet_lock: IO[bytes] | None = None
        self._created_netns: list[str] = []
        self._processes: list[subprocess.Popen] = []
        self._captures: list[Capture] = []

    def __enter__(self) -> Cluster:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _add_netns(self, name: str) -> None:
        if name in netns_names():
            raise NetnsError(f"network namespace {name} already exists (left by another run? `ip netns del {name}`)")
        _run(["ip", "netns", "add", name])
        self._created_netns.append(name)
        # No IPv6: its autoconfiguration chatter (DAD, MLD, router solicitations) would only add noise to captures.
        _run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
              "net.ipv6.conf.default.disable_ipv6=1"])
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _build(self) -> None:
        self.subnet, self._subnet_lock = _lock_free_subnet()
        addresses = self.subnet.hosts()
        self._add_netns(self.bridge_netns)
        _run(["ip", "-n", self.bridge_netns, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.bridge_netns, "link", "set", "br0", "up"])
        for index, name in enumerate(self._host_names):
            port = f"veth{index}"
            host = Host(name=name, netns=f"dlcs-{self.tag}-{name}", ip=str(next(addresses)), bridge_port=port)
            self._add_netns(host.netns)
            _run(["ip", "-n", self.bridge_netns, "link", "add", port, "mtu", str(self.mtu), "type", "veth",
                  "peer", "name", host.interface, "netns", host.netns, "mtu", str(self.mtu)])
            _run(["ip", "netns", "exec", self.bridge_netns, "ethtool", "-K", port, *OFFLOADS_OFF])
            _run(["ip", "-n", self.bridge_netns, "link", "set", port, "master", "br0", "up"])
            _run(["ip", "netns", "exec", host.netns, "ethtool", "-K", host.interface, *OFFLOADS_OFF])
            # What a node sends to itself travels on lo: give it the same MTU and segmentation as the wire,
            # so an "any" capture sees wire-sized segments there too (and libpcap can size its ring for them).
            _run(["ip", "-n", host.netns, "link", "set", "lo", "mtu", str(self.mtu)])
            _run(["ip", "netns", "exec", host.netns, "ethtool", "-K", "lo", *OFFLOADS_OFF])
            _run(["ip", "-n", host.netns, "addr", "add", f"{host.ip}/{self.subnet.prefixlen}", "dev", host.interface])
            _run(["ip", "-n", host.netns, "link", "set", host.interface, "up"])
            self.hosts[name] = host

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise NetnsError(f"no host {name!r} in cluster {self.tag} (hosts: {sorted(self.hosts)})") from None

    def limit_rate(self, name: str, rate_bit_s: float, burst_bytes: int | None = None) -> None:
        """Give host `name` a full-duplex link of rate_bit_s each way, as a NIC on a switch port: a token
        bucket (tc tbf) on its eth0 (what it sends) and on its bridge port (what it receives). The bucket holds
        one millisecond at the rate, at least LINK_BUCKET_MIN_BYTES (a smaller one costs the cores a timer per
        packet), or `burst_bytes` (a shaper that lets bursts through at the veth's speed, as a cloud's burst
        allowance does); the queue, LINK_QUEUE_MS of it, as a switch port's buffer: beyond, packets are dropped
        and TCP backs off."""
        host = self.host(name)
        bytes_per_s = rate_bit_s / 8
        burst = burst_bytes or max(int(bytes_per_s / 1000), LINK_BUCKET_MIN_BYTES,
                                   2 * (self.mtu + ETHERNET_HEADER_BYTES))
        shape = ["tbf", "rate", f"{int(rate_bit_s)}bit", "burst", str(burst), "latency", f"{LINK_QUEUE_MS}ms"]
        _run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "replace", "dev", host.interface, "root", *shape])
        _run(["ip", "netns", "exec", self.bridge_netns, "tc", "qdisc", "replace", "dev", host.bridge_port, "root",
              *shape])

    def _in_netns(self, name: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.host(name).netns, *argv]

    def popen(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: int | IO | None = subprocess.DEVNULL,
        stdout: int | IO | None = None,
        stderr: int | IO | None = None,
        cwd: str | os.PathLike | None = None,
    ) -> subprocess.Popen:
        """Start argv inside host `name`. `ip netns exec` execs the command: the pid is the program's own."""
        process = subprocess.Popen(self._in_netns(name, argv), env=None if env is None else dict(env),
                                   stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd)
        self._processes.append(process)
        return process

    def run(self, name: str, argv: Sequence[str], *, timeout_s: float = 30.0) -> subprocess.CompletedProcess[bytes]:
        """Run argv inside host `name` to completion; raise NetnsError on failure or timeout."""
        return _run(self._in_netns(name, argv), timeout_s=timeout_s)

    def limit_send_rate(self, name: str, mbit: int) -> None:
        """Cap what host `name` sends on its interface at `mbit` Mbit/s (tc tbf, a deep queue: nothing dropped):
        with several busy hosts on 2 cores, the captures keep up only with so much. (limit_rate is a switch
        port's link instead: both ways, a shallow queue.)"""
        host = self.host(name)
        self.run(name, ["tc", "qdisc", "add", "dev", host.interface, "root", "tbf", "rate", f"{mbit}mbit",
                        "burst", TBF_BURST, "latency", TBF_LATENCY])

    def capture(self, name: str, path: str | os.PathLike, snaplen: int = 0, filter: str | None = None,
                *, interface: str | None = None, buffer_kib: int = DEFAULT_CAPTURE_BUFFER_KIB,
                startup_timeout_s: float = 10.0) -> Capture:
        """Start tcpdump on the host's eth0 (or `interface`, e.g. "any" to include what a node sends to
        itself over lo) writing `path` (pcap), and return once it is listening."""
        host = self.host(name)
        path = Path(path)
        if snaplen == 0 and interface == "any":
            # With --immediate-mode libpcap uses fixed-size ring slots sized by the snaplen, and "any" has no
            # MTU to bound it by: the default 256 KiB slots leave a few hundred slots and the kernel drops.
            snaplen = self.mtu + ANY_LINK_HEADER_ROOM
        argv = ["tcpdump", "-i", interface or host.interface, "-w", str(path), "-U", "-n", "-s", str(snaplen),
                "-B", str(buffer_kib),
                # Without it libpcap hands packets over a block at a time (TPACKET_V3, up to 1 s late), and
                # the packets of the last block are lost when tcpdump is stopped.
                "--immediate-mode",
                # Debian's tcpdump would drop to user `tcpdump`, which may not write to `path`.
                "-Z", "root"]
        if filter:
            argv.append(filter)
        process = self.popen(name, argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        capture = Capture(process, path, startup_timeout_s)
        self._captures.append(capture)
        return capture

    def close(self, grace_s: float = 3.0) -> None:
        """Stop every process started here, delete the namespaces (and with them the links), free the subnet."""
        for capture in self._captures:
            if capture.process.poll() is None:
                capture.process.send_signal(signal.SIGINT)
        for process in self._processes:
            _stop_process(process, grace_s)
        self._processes.clear()
        self._captures.clear()
        failures = []
        existing = netns_names() if self._created_netns else set()
        for netns in self._created_netns:
            if netns not in existing:
                continue
            # Anything still inside was started (directly or not) by this cluster.
            pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _wait_gone([int(pid) for pid in pids], grace_s)
            try:
                _run(["ip", "netns", "del", netns])
            except NetnsError as exc:
                failures.append(str(exc))
        self._created_netns.clear()
        self.hosts.clear()
        if self._subnet_lock is not None:
            self._subnet_lock.close()
            self._subnet_lock = None
        if failures:
            raise NetnsError("teardown incomplete: " + "; ".join(failures))
