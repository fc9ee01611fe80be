"""lab.netns on the real kernel: namespaces on a bridge, TCP between them seen by tcpdump in each,
and nothing left behind afterwards (needs root, as on every machine of this project)."""

from __future__ import annotations

import os
import subprocess
import sys

import dpkt
import pytest

from lab.netns import TEST_NETWORK, Cluster, NetnsError, netns_names

pytestmark = pytest.mark.root

# Receives one connection and prints how many bytes came before EOF.
TCP_SINK = """
import socket, sys
listener = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
connection, _ = listener.accept()
total = 0
while chunk := connection.recv(1 << 16):
    total += len(chunk)
print(total, flush=True)
"""
TCP_SOURCE = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2]))) as connection:
    connection.sendall(bytes(range(256)) * (int(sys.argv[3]) // 256))
"""
# Starts a grandchild that outlives its parent's SIGTERM, and prints its pid.
ORPHAN_MAKER = """
import subprocess, time
child = subprocess.Popen(["sleep", "600"])
print(child.pid, flush=True)
time.sleep(600)
"""
SENT_BYTES = 256 * 1024
MSS_BYTES = 1500 - 20 - 32  # MTU - IPv4 header - TCP header with timestamps


def _tag(name: str) -> str:
    return f"{name}{os.getpid()}"


def _leftovers(tag: str) -> set[str]:
    return {ns for ns in netns_names() if ns.startswith(f"dlcs-{tag}-")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


def _tcp_payload_bytes(path, src: str, dst: str) -> tuple[int, int, int]:
    """(unique payload bytes src->dst, largest segment payload, packets) in a pcap.

    Unique: a retransmission (a loaded machine retransmits) carries bytes already counted."""
    covered: set[int] = set()
    largest = packets = 0
    with open(path, "rb") as capture:
        for _, frame in dpkt.pcap.Reader(capture):
            packets += 1
            ip = dpkt.ethernet.Ethernet(frame).data
            if isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.tcp.TCP):
                if (dpkt.utils.inet_to_str(ip.src), dpkt.utils.inet_to_str(ip.dst)) == (src, dst):
                    covered.update((ip.data.seq + i) & 0xFFFFFFFF for i in range(len(ip.data.data)))
                    largest = max(largest, len(ip.data.data))
    return len(covered), largest, packets


def test_hosts_exchange_tcp_seen_by_a_capture_in_each_namespace(tmp_path):
    tag = _tag("tcp")
    with Cluster(tag, ["alpha", "beta"]) as cluster:
        alpha, beta = cluster.host("alpha"), cluster.host("beta")
        assert alpha.ip != beta.ip and {alpha.ip, beta.ip} <= {str(a) for a in cluster.subnet.hosts()}
        assert cluster.subnet.subnet_of(TEST_NETWORK)
        assert _leftovers(tag) == {alpha.netns, beta.netns, cluster.bridge_netns}
        # Only the cluster's own /24 is reachable: no default route.
        routes = cluster.run("alpha", ["ip", "route"]).stdout.decode().splitlines()
        assert [route.split() for route in routes] == [
            [str(cluster.subnet), "dev", "eth0", "proto", "kernel", "scope", "link", "src", alpha.ip]]
        link = cluster.run("alpha", ["ip", "link", "show", "eth0"]).stdout.decode()
        assert "mtu 1500" in link
        features = cluster.run("alpha", ["ethtool", "-k", "eth0"]).stdout.decode()
        for feature in ("tcp-segmentation-offload", "generic-segmentation-offload", "generic-receive-offload"):
            assert f"{feature}: off" in features

        captures = {name: cluster.capture(name, tmp_path / f"{name}.pcap") for name in ("alpha", "beta")}
        sink = cluster.popen("beta", [sys.executable, "-c", TCP_SINK, beta.ip, "7000"], stdout=subprocess.PIPE)
        assert sink.stdout.readline() == b"listening\n"
        cluster.run("alpha", [sys.executable, "-c", TCP_SOURCE, beta.ip, "7000", str(SENT_BYTES)])
        assert int(sink.stdout.readline()) == SENT_BYTES
        assert sink.wait(timeout=10) == 0
        stats = {name: capture.stop() for name, capture in captures.items()}

    assert _leftovers(tag) == set()
    for name in ("alpha", "beta"):
        payload, largest, packets = _tcp_payload_bytes(tmp_path / f"{name}.pcap", alpha.ip, beta.ip)
        assert payload == SENT_BYTES, name
        assert 0 < largest <= MSS_BYTES, name  # offloads off: wire-sized segments, even on the sender
        assert packets == stats[name].packets_captured and stats[name].packets_dropped_by_kernel == 0


def test_teardown_on_exception_kills_every_process_in_the_namespaces():
    tag = _tag("boom")
    with pytest.raises(RuntimeError, match="boom"), Cluster(tag, ["solo"]) as cluster:
        parent = cluster.popen("solo", [sys.executable, "-c", ORPHAN_MAKER], stdout=subprocess.PIPE)
        grandchild = int(parent.stdout.readline())
        assert _alive(grandchild)
        raise RuntimeError("boom")
    assert parent.poll() is not None
    assert not _alive(grandchild)
    assert _leftovers(tag) == set()


def test_concurrent_clusters_get_distinct_subnets():
    with Cluster(_tag("one"), ["a"]) as one, Cluster(_tag("two"), ["a"]) as two:
        assert not one.subnet.overlaps(two.subnet)
        assert one.host("a").ip != two.host("a").ip


def test_capture_that_cannot_start_raises_and_cleans_up(tmp_path):
    tag = _tag("cap")
    with pytest.raises(NetnsError, match="tcpdump"), Cluster(tag, ["solo"]) as cluster:
        cluster.capture("solo", tmp_path / "x.pcap", filter="tcp and and port")
    assert _leftovers(tag) == set()


@pytest.mark.parametrize("hosts", [["Upper"], ["bridge"], ["a", "a"], [], ["has space"]])
def test_bad_host_names_are_refused_before_anything_is_created(hosts):
    tag = _tag("bad")
    with pytest.raises(NetnsError):
        Cluster(tag, hosts)
    assert _leftovers(tag) == set()
