"""The eBPF probes for real (root, CI here), each checked against what the traced program itself did:
flow -> process attribution across two network namespaces (connections made before and after the
daemon started), libzmq frame events of a pyzmq program (with --zmq-events calls and sends), and the
libnccl probes on a stand-in library. Every library here is loaded after the daemon gave up root: the
loader's hook finds it, and the daemon attaches its uprobes without a capability.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from dlcsniff.decoders.inputs.daemon_dir import load_capture_dir, zmq_messages
from dlcsniff.sniffer import bpf_objects, ebpf, procnet, snap_filter, uprobes
from dlcsniff.sniffer.elf_symbols import elf_symbols, section_variables
from lab.netns import Cluster
from tests.conftest import require_root, require_tool, require_workloads
from tests.support.daemon import TOOL_PYTHON, RunningDaemon

pytestmark = pytest.mark.root

PORT = 7200


# -- /proc: sockets already open ---------------------------------------------------------------------------

def test_parse_proc_net_tcp_lines():
    ipv4 = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
            "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0\n"
            "   1: 020012C6:C350 010012C6:1C1E 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0 20 4 30 10 -1\n")
    assert [(s.local_ip, s.local_port, s.remote_ip, s.remote_port, s.state, s.inode)
            for s in procnet.parse_proc_net_tcp(ipv4, socket.AF_INET)] == [
        ("127.0.0.1", 8080, "0.0.0.0", 0, 10, 4242), ("198.18.0.2", 50000, "198.18.0.1", 7198, 1, 4343)]
    ipv6 = ("  sl  local_address                         remote_address                        st ...\n"
            "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 "
            "00:00000000 00000000     0        0 77 1 0 100 0 0 10 0\n")
    assert [(s.local_ip, s.local_port, s.inode) for s in procnet.parse_proc_net_tcp(ipv6, socket.AF_INET6)] == [
        ("::1", 8080, 77)]


def test_socket_owners_finds_this_process_sockets():
    require_root()
    own_netns = os.stat("/proc/self/ns/net").st_ino
    with socket.socket() as listener, socket.socket(socket.AF_INET6) as listener6:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener6.bind(("::1", 0))
        listener6.listen()
        owners = {owner.socket.inode: owner for owner in procnet.socket_owners(own_netns)}
        for sock, ip in ((listener, "127.0.0.1"), (listener6, "::1")):
            found = owners[os.fstat(sock.fileno()).st_ino]
            assert (found.pid, found.socket.local_ip, found.socket.local_port, found.socket.state) == (
                os.getpid(), ip, sock.getsockname()[1], 10)
            assert found.comm == procnet.comm_of(os.getpid())


def test_parse_maps_keeps_each_executable_file_once():
    maps = ("55d0c6a00000-55d0c6a28000 r--p 00000000 fe:00 1312 /usr/bin/python3.11\n"
            "55d0c6a28000-55d0c6cd0000 r-xp 00028000 fe:00 1312 /usr/bin/python3.11\n"
            "7f1c2a000000-7f1c2a100000 r-xp 00000000 00:2e 77 /tmp/a dir/libzmq.so.5\n"
            "7f1c2a200000-7f1c2a300000 r-xp 00100000 00:2e 77 /tmp/a dir/libzmq.so.5\n"
            "7f1c2b000000-7f1c2b001000 r-xp 00000000 00:00 0 [vdso]\n"
            "7f1c2c000000-7f1c2c100000 rw-s 00000000 00:01 4242 /dev/zero (deleted)\n")
    assert procnet.parse_maps(maps) == [
        procnet.MappedFile("/usr/bin/python3.11", os.makedev(0xFE, 0), 1312, "55d0c6a28000-55d0c6cd0000"),
        procnet.MappedFile("/tmp/a dir/libzmq.so.5", os.makedev(0, 0x2E), 77, "7f1c2a000000-7f1c2a100000")]


def test_mapped_files_are_opened_by_the_paths_a_loader_names_them(tmp_path):
    """A loader names an object by the path it opened (a link, often): the helper finds the mapping by inode,
    and opens the mapping's own file once, named as /proc names it."""
    require_root()
    libc = next(item for item in procnet.executable_files(os.getpid()) if "/libc.so" in item.path)
    link = tmp_path / "libc-by-another-name.so.6"
    link.symlink_to(libc.path)
    opened = procnet.open_mapped_files(os.getpid(), [str(link), "/nonexistent/libzmq.so", libc.path,
                                                     str(tmp_path)])
    assert [mapped for mapped, _ in opened] == [libc]
    for _, fd in opened:
        assert os.fstat(fd).st_ino == libc.inode and os.pread(fd, 4, 0) == b"\x7fELF"
        os.close(fd)


# -- the objects: built once, their settings found where libbpf sets them -----------------------------------

def test_built_objects_have_their_settings_where_readelf_places_them():
    """The run's settings are written at the offsets section_variables finds in each object's .rodata: binutils'
    readelf, reading the same objects, places every one of them there, with its size."""
    for source, names in ((bpf_objects.PROBES, ebpf.probe_settings(netns=1, loader=uprobes.find_loader())),
                          (bpf_objects.SNAP, snap_filter.snap_settings(link_header_bytes=14, port_ranges=[(1, 2)]))):
        elf, built_now = bpf_objects.object_bytes(source)
        assert built_now is None, "make setup builds the objects"
        path = bpf_objects.BUILD_DIR / source.file_name
        listing = subprocess.run([require_tool("readelf"), "-sW", str(path)], capture_output=True, text=True,
                                 check=True).stdout
        sections = subprocess.run([require_tool("readelf"), "-SW", str(path)], capture_output=True, text=True,
                                  check=True).stdout
        rodata_index = next(line.split("]")[0].strip(" [") for line in sections.splitlines()
                            if line.split("]")[-1].split()[:1] == [".rodata"])
        readelf = {fields[7]: (int(fields[1], 16), int(fields[2])) for fields in map(str.split, listing.splitlines())
                   if len(fields) == 8 and fields[3] == "OBJECT" and fields[6] == rodata_index}
        found = section_variables(elf, ".rodata")
        assert found == readelf and set(names) <= set(found), source.name
        assert all(found[name][1] == len(value) for name, value in names.items())
    assert section_variables(b"not an ELF file", ".rodata") == {}


# -- which libraries get uprobes ------------------------------------------------------------------------------

def _nm_functions(path: Path) -> dict[str, int]:
    listing = subprocess.run([require_tool("nm"), "-D", "--defined-only", str(path)], capture_output=True, text=True,
                             check=True).stdout
    return {fields[2]: int(fields[0], 16) for fields in map(str.split, listing.splitlines())
            if len(fields) == 3 and fields[1] in "TtWi" and fields[2].startswith(("zmq_", "nccl"))}


def _objdump_bytes(path: Path, address: int, count: int = 8) -> bytes:
    listing = subprocess.run([require_tool("objdump"), "-s", f"--start-address={address}",
                              f"--stop-address={address + count}", str(path)], capture_output=True, text=True,
                             check=True).stdout
    line = next(line.strip() for line in listing.splitlines() if line.strip().startswith(f"{address:x} "))
    hex_columns = line[len(f"{address:x}"):].strip().split("  ")[0]      # two spaces before the ASCII column
    return bytes.fromhex(hex_columns.replace(" ", ""))[:count]


def _file_bytes(path: Path, offset: int, count: int = 8) -> bytes:
    with open(path, "rb") as file:
        file.seek(offset)
        return file.read(count)


def test_elf_symbols_agree_with_nm_on_the_libraries_jobs_load(tmp_path):
    workloads = require_workloads().parent.parent / "lib" / "python3.11" / "site-packages"
    libmxnet = workloads / "mxnet" / "libmxnet.so"
    pyzmq_libzmq = next((workloads / "pyzmq.libs").glob("libzmq*.so*"))
    fake_nccl = tmp_path / "libnccl.so.2"
    (tmp_path / "nccl.c").write_text(FAKE_NCCL)
    subprocess.run([require_tool("gcc"), "-shared", "-fPIC", "-o", str(fake_nccl), str(tmp_path / "nccl.c")],
                   check=True)
    for path in (libmxnet, pyzmq_libzmq, fake_nccl, Path("/lib/x86_64-linux-gnu/libc.so.6")):
        symbols = elf_symbols(str(path))
        assert set(symbols) == set(_nm_functions(path)), path
        # a uprobe's place: the file offset nm's address lies at (objdump shows the same bytes there)
        assert {name: symbol.address for name, symbol in symbols.items()} == _nm_functions(path), path
        for name in sorted(symbols)[:3]:
            assert _objdump_bytes(path, symbols[name].address) == _file_bytes(path, symbols[name].file_offset)
    assert uprobes.classify_library(elf_symbols(str(libmxnet)))[0] == "libzmq"   # libzmq 4.2.2 inside
    assert uprobes.classify_library(elf_symbols(str(pyzmq_libzmq)))[0] == "libzmq"
    assert uprobes.classify_library(elf_symbols(str(libmxnet)), "none") == ("libzmq", {})
    library, probes = uprobes.classify_library(elf_symbols(str(fake_nccl)))
    assert library == "libnccl" and set(probes) == set(uprobes.NCCL_PROBES) - {"ncclCommInitRankConfig"}
    # not ELF, or not a file: nothing to probe, no error
    assert elf_symbols(__file__) == {} == elf_symbols(str(tmp_path))


def test_every_zmq_events_choice_has_its_probes():
    from dlcsniff.sniffer.options import ZMQ_EVENTS
    assert tuple(uprobes.ZMQ_PROBES) == ZMQ_EVENTS
    text = "".join(part.read_text() for part in bpf_objects.PROBES.parts)
    for choice in ZMQ_EVENTS:
        for program in uprobes.uprobe_programs(choice, loader=True):
            assert f'SEC("uprobe")\nint {program}(struct pt_regs *ctx)' in text


# -- flows across namespaces -----------------------------------------------------------------------------------

SERVER = r"""
import socket, sys, threading
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", int(sys.argv[1])))
listener.listen()
print("listening", flush=True)
held = []
def read_all(conn):
    while conn.recv(65536):
        pass
for index in range(3):
    conn, _ = listener.accept()
    if index == 2:
        held.append(conn)        # accepted, never read nor written
    else:
        threading.Thread(target=read_all, args=(conn,)).start()
sys.stdin.readline()
"""
CLIENT = r"""
import json, socket, sys
server, port = sys.argv[1], int(sys.argv[2])
first = socket.create_connection((server, port))
print(json.dumps({"early": first.getsockname()[1]}), flush=True)
sys.stdin.readline()
second = socket.create_connection((server, port))
second.sendall(b"y" * 100000)
third = socket.create_connection((server, port))
print(json.dumps({"late": [second.getsockname()[1], third.getsockname()[1]]}), flush=True)
second.close()
sys.stdin.readline()
"""


@contextlib.contextmanager
def daemons_on_both(cluster: Cluster, tmp_path: Path):
    """A daemon on the eth0 of the server and of the client (--ports PORT, into tmp_path/NAME), ready (probes on)
    when the block begins, stopped when it ends."""
    daemons = {name: RunningDaemon(["--iface", "eth0", "--out", str(tmp_path / name), "--ports", str(PORT)],
                                   netns=cluster.host(name).netns)
               for name in ("server", "client")}
    try:
        for daemon in daemons.values():
            daemon.wait_ready()
        yield
        for daemon in daemons.values():
            assert daemon.stop() == 0, daemon.stderr
    finally:
        for daemon in daemons.values():
            daemon.kill()


def test_every_flow_is_attributed_to_the_process_that_owned_it(tmp_path):
    require_root()
    with Cluster(f"prb{os.getpid() % 100000}", ["server", "client"]) as cluster:
        server_ip = cluster.host("server").ip
        server = cluster.popen("server", [str(TOOL_PYTHON), "-c", SERVER, str(PORT)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE)
        assert server.stdout.readline().strip() == b"listening"
        client = cluster.popen("client", [str(TOOL_PYTHON), "-c", CLIENT, server_ip, str(PORT)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        early_port = json.loads(client.stdout.readline())["early"]
        with daemons_on_both(cluster, tmp_path):
            client.stdin.write(b"go\n")
            client.stdin.flush()
            late_ports = json.loads(client.stdout.readline())["late"]
            for process in (client, server):
                process.stdin.write(b"done\n")
                process.stdin.flush()
                assert process.wait(timeout=30) == 0
    server_flows = load_capture_dir(tmp_path / "server").flows
    client_flows = load_capture_dir(tmp_path / "client").flows

    def owners(flows, **where) -> list[tuple]:
        selected = flows
        for column, value in where.items():
            selected = selected[selected[column] == value]
        return sorted(zip(selected["pid"], selected["comm"], selected["source"]))

    # made before the daemons started: found in /proc
    assert owners(server_flows, local_port=PORT, remote_port=early_port) == [(server.pid, "python", "proc")]
    assert owners(client_flows, local_port=early_port, remote_port=PORT) == [(client.pid, "python", "proc")]
    assert owners(server_flows, local_port=PORT, remote_port=0) == [(server.pid, "python", "proc")]
    # made while they ran, from the probes: accepted connections belong to the listener's owner (no syscall
    # tracepoint watches accept(): it would slow every system call of every process)
    for port in late_ports:
        assert owners(server_flows, local_port=PORT, remote_port=port) == [(server.pid, "python", "listen")]
    for port in late_ports:
        assert owners(client_flows, local_port=port, remote_port=PORT) == [(client.pid, "python", "connect")]
    # each daemon saw its own namespace only
    assert set(server_flows["pid"].dropna()) == {server.pid}
    assert set(client_flows["pid"].dropna()) == {client.pid}
    assert set(server_flows.loc[server_flows["source"] != "proc", "local_ip"]) == {server_ip}



CHURN_SERVER = r"""
import selectors, socket, sys
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", int(sys.argv[1])))
listener.listen(128)
print("listening", flush=True)
selector = selectors.DefaultSelector()
selector.register(listener, selectors.EVENT_READ)
selector.register(sys.stdin, selectors.EVENT_READ)
while True:
    for key, _ in selector.select():
        if key.fileobj is sys.stdin:
            sys.exit(0)
        if key.fileobj is listener:
            conn, _ = listener.accept()
            selector.register(conn, selectors.EVENT_READ)
        elif not key.fileobj.recv(65536):
            selector.unregister(key.fileobj)
            key.fileobj.close()
"""
# A new connection every 2 ms, each held for the next eight (the client closes first: its end waits in
# TIME_WAIT), until a line on stdin; then the local port of every connection it made.
CHURN_CLIENT = r"""
import json, socket, sys, threading, time
server, port = sys.argv[1], int(sys.argv[2])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
held, ports = [], []
while not stop.is_set():
    conn = socket.create_connection((server, port))
    conn.sendall(b"x")
    ports.append(conn.getsockname()[1])
    held.append(conn)
    if len(held) > 8:
        held.pop(0).close()
    if len(ports) == 1:
        print("connected", flush=True)
    time.sleep(0.002)
for conn in held:
    conn.close()
print(json.dumps(ports), flush=True)
"""


def test_connections_seen_by_the_tracepoint_and_in_proc_have_one_row_each(tmp_path):
    """Issue 21: connections opened and closed all through the daemons' start, so that some are already closed
    when the tracepoint attaches, some open at that moment and some made while /proc is listed, after it attached
    (both saw those). Every connection the client made (its own list) is one row at each end, no more, owned by
    the client at its end and by the server at the other; only a connection already over before the probes
    attached (closed by the client then: no process holds it) may have no owner."""
    require_root()
    with Cluster(f"chn{os.getpid() % 100000}", ["server", "client"]) as cluster:
        server = cluster.popen("server", [str(TOOL_PYTHON), "-c", CHURN_SERVER, str(PORT)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE)
        assert server.stdout.readline().strip() == b"listening"
        client = cluster.popen("client", [str(TOOL_PYTHON), "-c", CHURN_CLIENT, cluster.host("server").ip,
                                          str(PORT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert client.stdout.readline().strip() == b"connected"
        with daemons_on_both(cluster, tmp_path):
            time.sleep(0.5)
            for process in (client, server):
                process.stdin.write(b"stop\n")
                process.stdin.flush()
                if process is client:
                    ports = json.loads(client.stdout.readline())
                assert process.wait(timeout=30) == 0
    assert len(set(ports)) == len(ports)          # (no local port used twice: one connection, one port)
    ends = {"client": ("local_port", "remote_port", client.pid), "server": ("remote_port", "local_port", server.pid)}
    for name, (client_port, server_port, owner) in ends.items():
        flows = load_capture_dir(tmp_path / name).flows
        flows = flows[(flows[server_port] == PORT) & (flows[client_port] != 0)]
        rows = flows.groupby(client_port).size()
        assert set(rows.index) <= set(ports), name
        assert (rows == 1).all(), flows[flows[client_port].isin(rows.index[rows > 1])].to_dict("records")
        owned = flows[flows["pid"].notna()]
        assert set(owned["pid"]) == {owner}, name
        # those without an owner were closed by it before the probes attached, before every one that has one
        unowned = flows[flows["pid"].isna()]
        assert (unowned["source"] == "proc").all(), unowned.to_dict("records")
        first_owned = ports.index(min(owned[client_port], key=ports.index))
        assert all(ports.index(port) < first_owned for port in unowned[client_port]), name
        assert set(owned[client_port]) == set(ports[first_owned:]), name
    server_flows = load_capture_dir(tmp_path / "server").flows
    listener = server_flows[(server_flows["local_port"] == PORT) & (server_flows["remote_port"] == 0)]
    assert list(listener["pid"]) == [server.pid]


# -- libzmq ---------------------------------------------------------------------------------------------------

ZMQ_PROGRAM = r"""
import json, sys
import zmq
print("imported", flush=True)
sys.stdin.readline()
context = zmq.Context()
push = context.socket(zmq.PUSH)
push.bind("tcp://127.0.0.1:7300")
pull = context.socket(zmq.PULL)
pull.connect("tcp://127.0.0.1:7300")
messages = [[b"meta", b"x" * 5000], [b"solo"], [b"a" * 70000, b"", b"c" * 300]]
done = []
for frames in messages:
    push.send_multipart(frames)
    got = pull.recv_multipart()
    assert got == frames
    done.append([len(frame) for frame in frames])
print(json.dumps(done), flush=True)
"""


def run_probed(tag: str, tmp_path, argv: list[str], ready: bytes, probing: str, *daemon_args: str):
    """In a namespace of its own with a daemon (out: tmp_path/node), run a program that prints `ready` once
    it has loaded its library, waits for "go" on stdin (sent once the daemon's log says `probing`), then
    prints one JSON line of what it did. Returns (the program's Popen, that JSON)."""
    with Cluster(tag, ["node"]) as cluster:
        daemon = RunningDaemon(["--iface", "lo", "--out", str(tmp_path / "node"), *daemon_args],
                               netns=cluster.host("node").netns)
        try:
            daemon.wait_ready()
            program = cluster.popen("node", argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert program.stdout.readline().strip() == ready
            daemon.wait_for(probing, 30)
            program.stdin.write(b"go\n")
            program.stdin.flush()
            result = json.loads(program.stdout.readline())
            assert program.wait(timeout=30) == 0
            assert daemon.stop() == 0, daemon.stderr
        finally:
            daemon.kill()
    return program, result


def test_libzmq_frames_match_what_the_program_sent_and_received(tmp_path):
    python = require_workloads()
    program, sizes = run_probed(f"zmq{os.getpid() % 100000}", tmp_path, [str(python), "-c", ZMQ_PROGRAM],
                                b"imported", r"probing libzmq in \S*libzmq", "--zmq-events", "calls")
    loaded = load_capture_dir(tmp_path / "node")
    zmq_events = loaded.zmq_events[loaded.zmq_events["pid"] == program.pid]
    assert set(zmq_events["comm"]) == {"python"}
    for direction, function in (("send", "zmq_msg_send"), ("recv", "zmq_msg_recv")):
        frames = zmq_events[zmq_events["direction"] == direction].sort_values("ts_ns")
        assert set(frames["function"]) == {function}
        expected = [(size, index < len(message) - 1) for message in sizes for index, size in enumerate(message)]
        assert list(zip(frames["size_bytes"], frames["more"])) == expected
        assert frames["socket"].nunique() == 1 and (frames["ts_ns"] <= frames["return_ts_ns"]).all()
    assert list(loaded.libraries["library"]) == ["libzmq"]
    assert list(loaded.libraries["pid"]) == [program.pid]
    messages = zmq_messages(loaded.zmq_events)
    for direction in ("send", "recv"):
        assert list(messages.loc[messages["direction"] == direction, "frame_sizes"]) == sizes
    assert messages["complete"].all()


def test_libzmq_sends_read_each_frame_size_at_the_call(tmp_path):
    """--zmq-events sends: only the entry of the send calls, the frame's size read from the zmq_msg_t there
    (the program sends small frames, kept in the message, and large ones, kept apart)."""
    python = require_workloads()
    program, sizes = run_probed(f"zms{os.getpid() % 100000}", tmp_path, [str(python), "-c", ZMQ_PROGRAM],
                                b"imported", r"probing libzmq in \S*libzmq", "--zmq-events", "sends")
    loaded = load_capture_dir(tmp_path / "node")
    zmq_events = loaded.zmq_events[loaded.zmq_events["pid"] == program.pid].sort_values("ts_ns")
    assert set(zmq_events["direction"]) == {"send"} and set(zmq_events["function"]) == {"zmq_msg_send"}
    expected = [(size, index < len(message) - 1) for message in sizes for index, size in enumerate(message)]
    assert list(zip(zmq_events["size_bytes"], zmq_events["more"])) == expected
    assert (zmq_events["ts_ns"] == zmq_events["return_ts_ns"]).all()
    assert list(loaded.libraries["functions"]) == [["zmq_msg_send", "zmq_send"]]
    messages = zmq_messages(loaded.zmq_events)
    assert list(messages["frame_sizes"]) == sizes and messages["complete"].all()


# -- libnccl (stand-in) ---------------------------------------------------------------------------------------

# NCCL cannot run here (no GPU, no CUDA). This library exports the same symbols with NCCL's signatures
# (nccl.h: ncclComm_t and cudaStream_t are pointers, ncclDataType_t / ncclRedOp_t are int enums,
# ncclUniqueId a 128-byte struct passed by value), so the uprobes attach and read arguments exactly as
# they would on libnccl.so.2: registers for the first six, the stack for the 7th and 8th.
FAKE_NCCL = r"""
#include <stddef.h>
typedef struct ncclComm *ncclComm_t;
typedef void *cudaStream_t;
typedef enum { ncclSuccess = 0 } ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    *comm = (ncclComm_t)(size_t)(0xC0000 + 16 * rank + nranks);
    return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) { return ncclSuccess; }
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t st) { return ncclSuccess; }
ncclResult_t ncclBcast(void *b, size_t count, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) {
    return ncclSuccess; }
ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t c, cudaStream_t st) { return ncclSuccess; }
ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t st) { return ncclSuccess; }
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t st) { return ncclSuccess; }
ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    return ncclSuccess; }
ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    return ncclSuccess; }
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
"""
NCCL_CALLER = r"""
import ctypes, json, sys
from ctypes import POINTER, byref, c_int, c_size_t, c_void_p
lib = ctypes.CDLL(sys.argv[1])
print("loaded", flush=True)
sys.stdin.readline()
class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
P, I, Z = c_void_p, c_int, c_size_t
signatures = {"ncclCommInitRank": [POINTER(c_void_p), I, UniqueId, I], "ncclAllReduce": [P, P, Z, I, I, P, P],
              "ncclBroadcast": [P, P, Z, I, I, P, P], "ncclBcast": [P, Z, I, I, P, P], "ncclReduce": [P, P, Z, I, I, I, P, P],
              "ncclAllGather": [P, P, Z, I, P, P], "ncclReduceScatter": [P, P, Z, I, I, P, P],
              "ncclSend": [P, Z, I, I, P, P], "ncclRecv": [P, Z, I, I, P, P], "ncclGroupStart": [], "ncclGroupEnd": []}
for name, argtypes in signatures.items():
    getattr(lib, name).argtypes = argtypes
comm = c_void_p()
assert lib.ncclCommInitRank(byref(comm), 4, UniqueId(), 2) == 0
c, stream = comm.value, 0x5EA0
calls = [
    ("ncclGroupStart",),
    ("ncclAllReduce", 0x1000, 0x2000, 1 << 20, 7, 0, c, stream),
    ("ncclBroadcast", 0x1100, 0x2100, 4096, 9, 3, c, stream),
    ("ncclBcast", 0x1200, 512, 2, 1, c, stream),
    ("ncclReduce", 0x1300, 0x2300, 777, 8, 2, 3, c, stream),
    ("ncclAllGather", 0x1400, 0x2400, 1000, 6, c, stream),
    ("ncclReduceScatter", 0x1500, 0x2500, 250000, 7, 4, c, stream),
    ("ncclSend", 0x1600, 33, 4, 1, c, stream),
    ("ncclRecv", 0x2700, 33, 4, 3, c, stream),
    ("ncclGroupEnd",),
]
for name, *args in calls:
    assert getattr(lib, name)(*args) == 0
print(json.dumps({"comm": c, "calls": calls}), flush=True)
"""


def test_nccl_probes_read_every_argument_of_a_stand_in_libnccl(tmp_path):
    require_root()
    library = tmp_path / "libnccl.so.2"
    source = tmp_path / "fake_nccl.c"
    source.write_text(FAKE_NCCL)
    subprocess.run([require_tool("gcc"), "-shared", "-fPIC", "-O2", "-o", str(library), str(source)], check=True)
    caller, record = run_probed(f"ncl{os.getpid() % 100000}", tmp_path,
                                [str(TOOL_PYTHON), "-c", NCCL_CALLER, str(library)],
                                b"loaded", r"probing libnccl in \S*libnccl\.so\.2")
    nccl = load_capture_dir(tmp_path / "node").nccl_events.sort_values("ts_ns")
    assert (nccl["pid"] == caller.pid).all()
    got = [tuple(None if pd.isna(value) else value for value in row) for row in nccl[["function", "sendbuff", "recvbuff", "count", "datatype", "op", "peer",
                                       "comm_handle", "stream"]].itertuples(index=False)]
    comm, stream, sum_op = record["comm"], 0x5EA0, "sum"
    assert got == [
        ("ncclGroupStart", 0, 0, 0, -1, None, -1, 0, 0),
        ("ncclAllReduce", 0x1000, 0x2000, 1 << 20, 7, sum_op, -1, comm, stream),
        ("ncclBroadcast", 0x1100, 0x2100, 4096, 9, None, 3, comm, stream),
        ("ncclBcast", 0x1200, 0x1200, 512, 2, None, 1, comm, stream),
        ("ncclReduce", 0x1300, 0x2300, 777, 8, "max", 3, comm, stream),
        ("ncclAllGather", 0x1400, 0x2400, 1000, 6, None, -1, comm, stream),
        ("ncclReduceScatter", 0x1500, 0x2500, 250000, 7, "avg", -1, comm, stream),
        ("ncclSend", 0x1600, 0, 33, 4, None, 1, comm, stream),
        ("ncclRecv", 0, 0x2700, 33, 4, None, 3, comm, stream),
        ("ncclGroupEnd", 0, 0, 0, -1, None, -1, 0, 0),
    ]
    # the communicator's rank and size come from ncclCommInitRank; sizes from NCCL's data types
    collectives = nccl[nccl["comm_handle"] == comm]
    assert set(collectives["rank"]) == {2} and set(collectives["nranks"]) == {4}
    assert list(collectives["size_bytes"]) == [4 << 20, 4096 * 2, 512 * 4, 777 * 8, 1000 * 2, 250000 * 4, 33 * 8,
                                               33 * 8]
    assert list(collectives["dtype"]) == ["float32", "bfloat16", "int32", "float64", "float16", "float32", "int64",
                                          "int64"]


# A process mapping some thirty files executable, as a node's processes do.
SLEEPER = r"""
import bz2, ctypes, decimal, hashlib, json, lzma, sqlite3, ssl, time
print("up", flush=True)
time.sleep(600)
"""


def test_a_namespace_of_many_processes_still_has_its_libraries_probed(tmp_path):
    """A node's namespace holds hundreds of processes: the list of the files they map outgrows one message of the
    root helper's socket (its send buffer), which once made the helper exit at the first look into the processes
    there, and no library loaded after was probed. Here sixty processes beside the job's."""
    python = require_workloads()
    from dataclasses import asdict

    with Cluster(f"many{os.getpid() % 100000}", ["node"]) as cluster:
        sleepers = [cluster.popen("node", [str(TOOL_PYTHON), "-c", SLEEPER], stdout=subprocess.PIPE)
                    for _ in range(60)]
        daemon = None
        try:
            assert all(sleeper.stdout.readline().strip() == b"up" for sleeper in sleepers)
            listed = json.dumps({sleeper.pid: [asdict(item) for item in procnet.executable_files(sleeper.pid)]
                                 for sleeper in sleepers})
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            send_buffer = ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            ours.close()
            theirs.close()
            assert len(listed) > send_buffer
            daemon = RunningDaemon(["--iface", "lo", "--out", str(tmp_path / "node"), "--zmq-events", "calls"],
                                   netns=cluster.host("node").netns)
            daemon.wait_ready()
            program = cluster.popen("node", [str(python), "-c", ZMQ_PROGRAM], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE)
            assert program.stdout.readline().strip() == b"imported"
            daemon.wait_for(r"probing libzmq in \S*libzmq", 30)
            program.stdin.write(b"go\n")
            program.stdin.flush()
            assert json.loads(program.stdout.readline())
            assert program.wait(timeout=30) == 0
            assert daemon.stop() == 0, daemon.stderr
        finally:
            if daemon is not None:
                daemon.kill()
            for sleeper in sleepers:
                sleeper.kill()
                sleeper.wait()
    assert "not probed" not in daemon.stderr, daemon.stderr
    loaded = load_capture_dir(tmp_path / "node")
    assert list(loaded.libraries["pid"]) == [program.pid]
