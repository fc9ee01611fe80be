"""The Wireshark dissector (decoders/wireshark/parts/*.lua, written as one dlcsniff.lua) run by tshark, held to
dlcsniff's own tables.

On every capture of the bundled jobs (every node of every MXNet and BytePS job, the zmq job, the Gloo job), the
messages `tshark -2 -X lua_script:dlcsniff.lua` shows are the rows of the decode's zmtp.parquet and
messages.parquet, message by message, per TCP direction (its `flow`) in stream order: ZMTP commands and messages
(name, frame sizes, each frame's flags, complete), ps-lite messages (sender, receiver, timestamp, push, pull,
request, control command, head, keys, lens, data frame sizes, size, tensor, part, request type, dtype,
complete) and Gloo messages (opcode, slot, sizes, offsets, bytes lost, complete), each at the capture time of
the packet that carried its last byte. The lossy jobs (captures with holes: messages cut short, framing lost
and found again) and the noise job (TLS, HTTP, DNS and a port scan around the job) included: nothing may
differ, because the script follows TCP with dlcsniff's own rules (decoders/tcp.py) rather than Wireshark's.
Left out of the comparison, as out of the script: the Gloo job's TCPStore queries (messages.parquet rows of
protocol "tcpstore"), and what dlcsniff adds from a job's other captures (none of the bundled jobs needs it).
The flags are checked against what libzmq writes (MORE on every frame but a message's last, LONG exactly above
255 bytes, COMMAND on commands; a ZMTP 1.0 flags byte holds MORE only).

tshark without Lua fails these tests (it would show nothing): Debian's tshark has it.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.cli import app
from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.job import decode_paths
from dlcsniff.decoders.output import write_decode_output
from dlcsniff.decoders.wireshark import SCRIPT_NAME, dissector_source, write_dissector
from tests.conftest import PCAPS, require_tool
from tests.support import zmtp_tap as z
from tests.support.nccl_gen import TcpCapture

# every folder of captures; the shared real captures of other protocols (NCCL over RoCE, perftest) on their own
FOREIGN = sorted({str(p.parent.relative_to(PCAPS))
                  for p in (PCAPS / "realcaps" / "softroce-tutorial").rglob("*.pcap*")})
# and the bundled plain TCP job (lab/workloads/slow_reader.py), whose bytes are no protocol's
FOREIGN += ["tcp_zero_window"]
JOBS = sorted({str(p.parent.relative_to(PCAPS)) for p in PCAPS.rglob("*.pcap*")} - set(FOREIGN))
KINDS = ("zmtp", "pslite", "gloo")
FLAG_MORE, FLAG_LONG, FLAG_COMMAND = 0x01, 0x02, 0x04
GLOO_OPCODES = {"SEND_BUFFER": 0, "SEND_UNBOUND_BUFFER": 1, "NOTIFY_SEND_READY": 2, "NOTIFY_RECV_READY": 3}

Rows = dict[str, dict[str, list[dict]]]     # kind -> flow -> rows in stream order


def _captures(job: str) -> list[Path]:
    return sorted(p for p in (PCAPS / job).iterdir() if p.name.endswith((".pcap", ".pcap.gz", ".pcapng")))


def _capture_name(path: Path) -> str:
    return path.name.split(".")[0]


def _tshark_env(home: Path) -> dict[str, str]:
    """Environment for tshark in a home of its own: no plugin or preference of the user's changes what it shows."""
    return {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}


@pytest.fixture(scope="module")
def tshark(tmp_path_factory) -> tuple[str, dict[str, str]]:
    """tshark, which must have Lua, and its environment."""
    path = require_tool("tshark")
    version = subprocess.run([path, "-v"], capture_output=True, text=True, check=True).stdout
    if "with Lua" not in version:
        pytest.fail("this tshark has no Lua: the dissector cannot run (Debian's tshark package has it)")
    return path, _tshark_env(tmp_path_factory.mktemp("home"))


def _flow(src: str, sport: int, dst: str, dport: int) -> str:
    return (f"[{src}]:{sport} → [{dst}]:{dport}" if ":" in src else f"{src}:{sport} → {dst}:{dport}")


def _list(value) -> list:
    return [] if value is None else value if isinstance(value, list) else [value]


def _int(value) -> int | None:
    return None if value is None or value != value else int(value)


# -- what tshark shows ---------------------------------------------------------------------------------

def shown_rows(tshark: tuple[str, dict], lua: Path, capture: Path) -> Rows:
    """The dissector's messages (`-T json`: one object per PDU), per kind and flow; times of the packets that
    carried their last bytes read from the capture itself."""
    path, env = tshark
    proc = subprocess.run([path, "-2", "-X", f"lua_script:{lua}", "-r", str(capture), "-Y", "zmtp or pslite or gloo",
                           "-T", "json", "--no-duplicate-keys", "-J", "zmtp pslite gloo"], env=env, capture_output=True,
                          check=True)
    errors = [line for line in proc.stderr.decode().splitlines() if "Running as user" not in line]
    assert not errors and b"Lua Error" not in proc.stdout, errors or "Lua Error in the output"
    with open_capture(capture) as reader:
        ts_ns = {number: packet.ts_ns for number, packet in enumerate(reader, 1)}
    rows: Rows = {kind: collections.defaultdict(list) for kind in KINDS}
    for packet in json.loads(proc.stdout or b"[]"):
        layers = packet["_source"]["layers"]
        for pdu in _list(layers.get("zmtp")):
            if pdu["zmtp.pdu"] not in ("command", "message"):
                continue
            frames = _list(pdu.get("zmtp.frame"))
            rows["zmtp"][pdu["zmtp.flow"]].append({
                "ts_last_ns": ts_ns[int(pdu["zmtp.last_byte_frame"])],
                "command": pdu["zmtp.command"] if pdu["zmtp.pdu"] == "command" else None,
                "frame_sizes": [int(f["zmtp.size"]) for f in frames],
                "flags": _known_flags([int(f["zmtp.flags"], 16) for f in frames], pdu["zmtp.complete"] == "1"),
                "complete": pdu["zmtp.complete"] == "1"})
        for msg in _list(layers.get("pslite")):
            keys = msg.get("pslite.num_keys_tree") or {}
            lens = msg.get("pslite.lens")
            sizes = [int(v) for v in _list(msg.get("pslite.data_sizes"))]
            for index in sorted(int(v) for v in _list(msg.get("pslite.data_size_unknown"))):
                sizes.insert(index, None)
            rows["pslite"][msg["pslite.flow"]].append({
                "ts_last_ns": ts_ns[int(msg["pslite.last_byte_frame"])],
                "sender_id": _int(msg.get("pslite.sender")), "recver_id": _int(msg.get("pslite.recver")),
                "ps_timestamp": _int(msg.get("pslite.timestamp")), "request": msg["pslite.request"] == "1",
                "push": msg["pslite.push"] == "1", "pull": msg["pslite.pull"] == "1",
                "control_cmd": _int(msg.get("pslite.control")), "head": _int(msg.get("pslite.head")),
                "keys": [int(k) for k in _list(keys.get("pslite.key"))],
                "lens": None if lens is None else [int(v) for v in _list(lens.get("pslite.len"))],
                "data_sizes": sizes, "size_bytes": int(msg["pslite.size"]),
                "tensor_key": _int(msg.get("pslite.tensor_key")), "part": _int(msg.get("pslite.part")),
                "req_type": msg.get("pslite.req_type"), "dtype": msg.get("pslite.dtype"),
                "complete": msg["pslite.complete"] == "1"})
        for msg in _list(layers.get("gloo")):
            if "gloo.opcode" not in msg:
                continue
            rows["gloo"][msg["gloo.flow"]].append({
                "ts_last_ns": ts_ns[int(msg["gloo.last_byte_frame"])], "opcode": int(msg["gloo.opcode"]),
                "slot": int(msg["gloo.slot"], 16), "size_bytes": int(msg["gloo.nbytes"]),
                "length": int(msg["gloo.length"]), "offset": int(msg["gloo.offset"]),
                "roffset": int(msg["gloo.roffset"]), "missing_bytes": int(msg["gloo.missing_bytes"]),
                "complete": msg["gloo.complete"] == "1"})
    return rows


# -- what the decode found -----------------------------------------------------------------------------

def _libzmq_flags(version: str | None, sizes: list[int], command: bool) -> list[int]:
    """libzmq's flags for a row of zmtp.parquet (a command: `command` True). CURVE's MESSAGE commands go out
    with the COMMAND flag clear (libzmq 4.3 writes the encrypted message as a data frame)."""
    if version == "1.0":
        return [FLAG_MORE if i < len(sizes) - 1 else 0 for i in range(len(sizes))]
    return [(FLAG_MORE if i < len(sizes) - 1 else 0) | (FLAG_LONG if size > 255 else 0)
            | (FLAG_COMMAND if command else 0) for i, size in enumerate(sizes)]


def _known_flags(flags: list[int], complete: bool) -> list[int]:
    """A message a hole cut short: whether its last frame seen had MORE set, the decode tables do not say."""
    return flags if complete or not flags else [*flags[:-1], flags[-1] & ~FLAG_MORE]


def decoded_rows(out: Path, capture: str) -> Rows:
    """The decode's rows of one capture, per kind and flow, in table (stream) order."""
    streams = [s for s in pq.read_table(out / "streams.parquet").to_pylist() if s["capture"] == capture]
    flows = {s["flow_id"]: _flow(s["src_ip"], s["src_port"], s["dst_ip"], s["dst_port"]) for s in streams}
    versions = {s["flow_id"]: s["zmtp_version"] for s in streams}
    rows: Rows = {kind: collections.defaultdict(list) for kind in KINDS}
    for row in pq.read_table(out / "zmtp.parquet").to_pylist():
        if row["capture"] == capture:
            sizes = list(row["frame_sizes"])
            rows["zmtp"][flows[row["flow_id"]]].append({
                "ts_last_ns": row["ts_last_ns"], "command": row["command"], "frame_sizes": sizes,
                "flags": _known_flags(_libzmq_flags(versions[row["flow_id"]], sizes,
                                                    row["command"] not in (None, "MESSAGE")), row["complete"]),
                "complete": row["complete"]})
    for row in pq.read_table(out / "messages.parquet").to_pylist():
        if row["capture"] != capture:
            continue
        flow = flows[row["flow_id"]]
        if row["protocol"] == "pslite":
            rows["pslite"][flow].append({
                "ts_last_ns": row["ts_last_ns"], "sender_id": _int(row["sender_id"]),
                "recver_id": _int(row["recver_id"]), "ps_timestamp": _int(row["ps_timestamp"]),
                "request": row["request"], "push": row["push"], "pull": row["pull"],
                "control_cmd": _int(row["control_cmd"]), "head": _int(row["head"]), "keys": list(row["keys"] or []),
                "lens": row["lens"], "data_sizes": [_int(v) for v in row["data_sizes"]],
                "size_bytes": row["size_bytes"], "tensor_key": _int(row["tensor_key"]), "part": _int(row["part"]),
                "req_type": row["req_type"], "dtype": row["dtype"], "complete": row["complete"]})
        elif row["protocol"] == "gloo":
            rows["gloo"][flow].append({
                "ts_last_ns": row["ts_last_ns"], "opcode": GLOO_OPCODES[row["opcode"]], "slot": int(row["slot"]),
                "size_bytes": row["size_bytes"], "length": int(row["length_bytes"]), "offset": int(row["offset_bytes"]),
                "roffset": int(row["roffset_bytes"]), "missing_bytes": int(row["missing_bytes"]),
                "complete": row["complete"]})
    return rows


def assert_same_messages(shown: Rows, decoded: Rows, capture: str) -> None:
    differences = []
    for kind in KINDS:
        for flow in sorted(set(shown[kind]) | set(decoded[kind])):
            ours, theirs = decoded[kind].get(flow, []), shown[kind].get(flow, [])
            for i in range(max(len(ours), len(theirs))):
                if i >= len(theirs):
                    differences.append(f"{kind} {flow} #{i}: not shown by tshark: {ours[i]}")
                elif i >= len(ours):
                    differences.append(f"{kind} {flow} #{i}: shown by tshark only: {theirs[i]}")
                elif ours[i] != theirs[i]:
                    differences.append(f"{kind} {flow} #{i}: " + ", ".join(
                        f"{k} decode {v!r} tshark {theirs[i].get(k)!r}" for k, v in ours[i].items()
                        if v != theirs[i].get(k)))
    assert not differences, f"{capture}: {len(differences)} differences:\n" + "\n".join(differences[:8])


# -- the bundled jobs ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lua_script(tmp_path_factory) -> Path:
    return write_dissector(tmp_path_factory.mktemp("wireshark"))


@pytest.fixture(scope="module")
def shown_by_tshark(tshark, lua_script):
    """Every bundled capture through tshark, two at a time, all started at once (the decodes run meanwhile):
    capture path -> future of its rows."""
    with ThreadPoolExecutor(2) as pool:
        futures = {capture: pool.submit(shown_rows, tshark, lua_script, capture)
                   for job in JOBS + FOREIGN for capture in _captures(job)}
        yield futures
        for future in futures.values():
            future.cancel()


@pytest.mark.parametrize("job", JOBS)
def test_tshark_shows_the_messages_decode_found(job, shown_by_tshark, decoded_job):
    out = decoded_job(job)
    messages = 0
    for capture in _captures(job):
        shown = shown_by_tshark[capture].result()
        assert_same_messages(shown, decoded_rows(out, _capture_name(capture)), f"{job}/{capture.name}")
        messages += sum(len(rows) for kind in KINDS for rows in shown[kind].values())
    assert messages > 0


@pytest.mark.parametrize("job", FOREIGN)
def test_nothing_is_claimed_in_real_traffic_of_other_protocols(job, shown_by_tshark):
    """Real NCCL-over-RoCE and perftest captures made elsewhere (pcaps/realcaps), and plain TCP: no zmtp, pslite
    or gloo."""
    for capture in _captures(job):
        shown = shown_by_tshark[capture].result()
        assert not any(shown[kind] for kind in KINDS), f"{job}/{capture.name}: {shown}"


def test_every_kind_of_message_is_shown(shown_by_tshark):
    """The comparison above is not vacuous: ps-lite of both flavors, routed answers, holes, Gloo."""
    shown = {c: f.result() for c, f in shown_by_tshark.items()}
    pslite = [m for rows in shown.values() for msgs in rows["pslite"].values() for m in msgs]
    assert len(pslite) > 6000
    assert {m["req_type"] for m in pslite} >= {"default", "row_sparse"}
    assert any(not m["complete"] for m in pslite)
    assert any(m["tensor_key"] is not None and m["part"] is not None for m in pslite)
    gloo = [m for rows in shown.values() for msgs in rows["gloo"].values() for m in msgs]
    assert len(gloo) > 3000 and {m["opcode"] for m in gloo} == {1, 2, 3}


# -- captures no bundled job is: caught mid-connection, old ZMTP peers and commands -----------------------

def _compare_on_its_own(tshark, capture: Path, lua: Path, tmp_path: Path) -> Rows:
    out = tmp_path / "decoded"
    write_decode_output(decode_paths([capture]), out)
    shown = shown_rows(tshark, lua, capture)
    assert_same_messages(shown, decoded_rows(out, _capture_name(capture)), capture.name)
    return shown


def test_a_capture_started_mid_connection(tshark, lua_script, tmp_path):
    """No greetings, no READY: ZMTP found by scanning for frames, node ids from the scheduler's reply."""
    capture = tmp_path / "worker0.pcap"
    subprocess.run([require_tool("editcap"), "-r", str(PCAPS / "mxnet_sync" / "worker0.pcap.gz"), str(capture),
                    "300-1000000"], check=True)
    shown = _compare_on_its_own(tshark, capture, lua_script, tmp_path)
    assert sum(map(len, shown["pslite"].values())) > 50


def test_zmtp_1_0_2_0_and_3_1_commands(tshark, lua_script, tmp_path):
    """Peers speaking ZMTP 2.0 (socket type in the greeting, identity frame) and unversioned 1.0 (identity
    frame first), and a 3.1 PLAIN connection: HELLO (the user name shown, never the password), WELCOME,
    INITIATE and READY with properties, PING, PONG, SUBSCRIBE, ERROR; frames long enough for LONG sizes."""
    cap = TcpCapture(mss=1448)
    v2 = cap.connect(("10.0.0.1", 50000), ("10.0.0.2", 6000))
    cap.send(v2, z.greeting_v2(5) + z.frame(b"client-id"))
    cap.send(v2, z.greeting_v2(6) + z.frame(b""), from_client=False)
    cap.send(v2, z.message(b"hello", b"x" * 300) + z.message(b"a" * 3000, b"end"))
    cap.send(v2, z.message(b"world"), from_client=False)
    v1 = cap.connect(("10.0.0.1", 50001), ("10.0.0.2", 6001))
    cap.send(v1, z.v1_message(b"") + z.v1_message(b"part1", b"part2"))
    cap.send(v1, z.v1_message(b"srv") + z.v1_message(b"y" * 400), from_client=False)
    plain = cap.connect(("10.0.0.1", 50002), ("10.0.0.2", 6002))
    cap.send(plain, z.greeting_v3(b"PLAIN"))
    cap.send(plain, z.greeting_v3(b"PLAIN", as_server=True), from_client=False)
    cap.send(plain, z.command(b"HELLO", b"\x05alice\x06secret"))
    cap.send(plain, z.command(b"WELCOME"), from_client=False)
    cap.send(plain, z.command(b"INITIATE", z.metadata({b"Socket-Type": b"SUB", b"Identity": b"ps9"})))
    cap.send(plain, z.command(b"READY", z.metadata({b"Socket-Type": b"PUB"})), from_client=False)
    cap.send(plain, z.command(b"PING", b"\x00\x0aping") + z.command(b"SUBSCRIBE", b"topic"))
    cap.send(plain, z.command(b"PONG", b"ping") + z.message(b"topic", b"z" * 1000), from_client=False)
    cap.send(plain, z.command(b"ERROR", b"\x04gone"), from_client=False)
    for conn in (v2, v1, plain):
        cap.close(conn)
    capture = cap.write(tmp_path / "zmtp.pcap")
    shown = _compare_on_its_own(tshark, capture, lua_script, tmp_path)
    commands = [row["command"] for rows in shown["zmtp"].values() for row in rows if row["command"]]
    assert sorted(commands) == ["ERROR", "HELLO", "INITIATE", "PING", "PONG", "READY", "SUBSCRIBE", "WELCOME"]
    path, env = tshark
    fields = subprocess.run([path, "-2", "-X", f"lua_script:{lua_script}", "-r", str(capture), "-Y", "zmtp",
                             "-T", "fields", "-e", "zmtp.version", "-e", "zmtp.plain.username", "-e", "zmtp.identity",
                             "-e", "zmtp.error.reason"], env=env, capture_output=True, text=True, check=True).stdout
    assert {"2.0", "1.0", "3.1", "alice", "ps9", "gone"} <= set(fields.replace(",", "\t").split())
    assert "secret" not in fields


# -- the command -----------------------------------------------------------------------------------------

runner = CliRunner()


def test_the_command_writes_the_dissector(tmp_path):
    result = runner.invoke(app, ["wireshark", "--out", str(tmp_path / "plugins"), "--json"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "plugins" / SCRIPT_NAME
    assert path.read_text() == dissector_source()
    assert json.loads(result.output) == {"written": [{"path": str(path), "bytes": path.stat().st_size,
                                                      "installed": False}]}


def test_install_puts_it_where_wireshark_loads_it(tshark, lua_script, tmp_path):
    home = tmp_path / "home"
    result = runner.invoke(app, ["wireshark", "--install"], env={"HOME": str(home)})
    assert result.exit_code == 0, result.output
    plugin = home / ".local" / "lib" / "wireshark" / "plugins" / SCRIPT_NAME
    assert f"installed {plugin}" in result.output and plugin.read_text() == dissector_source()
    path, env = tshark[0], _tshark_env(home)
    plugins = subprocess.run([path, "-G", "plugins"], env=env, capture_output=True, text=True, check=True).stdout
    assert str(plugin) in plugins
    # given with -X lua_script too, the second copy says the installed one serves
    twice = subprocess.run([path, "-X", f"lua_script:{lua_script}", "-r", str(PCAPS / "zmq" / "client.pcap.gz"),
                            "-c", "1"], env=env, capture_output=True, text=True, check=True)
    assert f"dlcsniff.lua is loaded already, from {plugin}" in twice.stderr
    senders = subprocess.run([path, "-2", "-r", str(PCAPS / "mxnet_1s1w" / "worker0.pcap.gz"), "-Y", "pslite",
                              "-T", "fields", "-e", "pslite.sender"], env=env, capture_output=True, text=True,
                             check=True).stdout.replace(",", "\n").split()
    assert set(senders) == {"1", "8", "9"}


@pytest.mark.parametrize("args, says", [
    (["--out", "{blocker}/plugins"], "cannot write {blocker}/plugins/dlcsniff.lua: Not a directory"),
    (["--install"], "cannot write {blocker}/.local/lib/wireshark/plugins/dlcsniff.lua: Not a directory"),
    ([], "--out DIR, --install, or both"),
])
def test_the_command_says_in_one_line_what_it_cannot_do(tmp_path, args, says):
    blocker = tmp_path / "a-file"          # a file where a folder should be (root may write anywhere else)
    blocker.write_text("")
    result = runner.invoke(app, ["wireshark", *(a.format(blocker=blocker) for a in args)], env={"HOME": str(blocker)})
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert says.format(blocker=blocker) in result.output
