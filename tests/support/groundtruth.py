"""Readers of the ground truth recorded beside the captures, independent of decoders/.

- `parse_pslite_log(path)`: every message ps-lite (MXNet 1.9.1's copy, PS_VERBOSE=2) logged as sent or
  received, one row per logged message.
- `load_job(dir)`: a recorded job: job.json, per-node logs (parsed lazily), per-node workload records,
  and for the zmq job its message record.
- `mxnet_jobs(lossy=...)`: the bundled MXNet jobs, whole or recorded by captures that lost packets.

PS_VERBOSE=2 line format (dmlc::LogMessage prefix, then ps::Message::DebugString):

    [HH:MM:SS] ../3rdparty/ps-lite/src/van.cc:LINE: SENDER => RECVER. Meta: request=0|1[, timestamp=T]
        ( , control={ cmd=NAME[, node={ role=R[, id=N], ip=IP, port=P, is_recovery=0|1 ... }][, barrier_group=G] }
        | , app_id=A, customer_id=C, simple_app=0|1, push=0|1 )
        [, head=H][, body=TEXT][, data_type={ T1 T2 ... } Body: data_size=N1 data_size=N2 ...]

SENDER is "?" on every send (ps-lite fills it from the connection on receipt) and on receipts from a
node that has no id yet; RECVER is 2147483647 (kEmpty) on receipts before the node knows its own id.
The body (a SimpleApp string, e.g. MXNet's pickled optimizer) is printed raw and may span lines.
Sends and receipts are logged at two places in van.cc; which is which is read from the log itself:
receipts are the place where a sender id ever appears. This ps-lite prints neither keys nor the
`pull` flag; `pull` is derived (a data message that is not a push). Threads interleave the pieces of
their lines; see `_log_entries`. Text that cannot be placed is listed (by line number) in the frame's
attrs["unparsed_lines"].
"""

from __future__ import annotations

import bisect
import collections
import gzip
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dlcsniff.decoders.protocols import pslite

PCAPS = Path(__file__).resolve().parents[2] / "pcaps"

KEMPTY = 2147483647
BODY_MARK = ", body="
META_MARK = ". Meta: "
# The pieces of one log entry after its "[", in writing order (dmlc::LogMessage, then the message).
PIECES = [
    ("open", re.compile(r"\[")),
    ("time", re.compile(r"\d\d:\d\d:\d\d")),
    ("close", re.compile(r"\] ")),
    ("file", re.compile(r"[^\s:\[\]]+")),
    ("colon", re.compile(r":")),
    ("line", re.compile(r"\d+")),
    ("separator", re.compile(r": ")),
    # Runs to the newline; a "[" inside ("W[9] is connected") is text unless another entry starts there. No
    # message starts with "[": one there opens another thread's entry, whose time comes after this message
    # (seen: "...van.cc:419: [8 => 11. Meta: ...\n10:18:53] ../van.cc:394: ? => 8. ...").
    ("message", re.compile(r"(?!\[)(?:[^\n]*?, body=.*?(?=\n\[|\n?\Z)|(?:[^\n\[]|\[(?!\[|\d\d:\d\d:\d\d\] ))*)",
                           re.S)),
    ("newline", re.compile(r"\n")),
]
META_RE = re.compile(r"^(\?|\d+) => (\d+)\. Meta: request=([01])(?:, timestamp=(\d+))?(.*)$", re.S)
CONTROL_RE = re.compile(r"^, control=\{ cmd=(\w+)(?:, node=\{(.*?) \})?(?:, barrier_group=(-?\d+))?"
                        r"(?:, msg_sig=(\d+))? \}", re.S)
APP_RE = re.compile(r"^, app_id=(-?\d+), customer_id=(-?\d+), simple_app=([01]), push=([01])")
HEAD_RE = re.compile(r"^, head=(-?\d+)")
DATA_RE = re.compile(r", data_type=\{((?: \w+)*) \} Body:((?: data_size=\d+)*)$")
NODE_RE = re.compile(r"role=(\w+)(?:, id=(\d+))?, ip=([^,\s]+), port=(\d+), is_recovery=([01])")
OWN_ID_RE = re.compile(r"^[HSW]\[(\d+)\] is connected to others|^Bind to role=\w+, id=(\d+)")
REBIND_RE = re.compile(r"^Bind to role=")

PSLITE_COLUMNS = [
    "node", "line_no", "log_time", "location", "direction", "own_id", "sender_id", "recver_id",
    "request", "timestamp", "control_cmd", "barrier_group", "nodes", "app_id", "customer_id",
    "simple_app", "push", "pull", "head", "body", "data_types", "data_sizes", "keys", "raw",
]
INT_COLUMNS = ["own_id", "sender_id", "recver_id", "timestamp", "barrier_group", "app_id", "customer_id", "head"]
BOOL_COLUMNS = ["request", "simple_app", "push", "pull"]


def _log_entries(path: Path, unparsed: list[int]) -> Iterator[tuple[int, str, str, str]]:
    """(line number, time, source location, message) per log entry, in the order the messages were written.

    The threads of one process share stderr, and dmlc's logger writes an entry in pieces: "[", time, "] ",
    file, ":", line, ": ", message, newline. Another thread's pieces can land between any two of them
    (seen: "[[08:22:23] ...whole entry...\n08:22:23] ../van.cc:394: ..."). Each piece is given to the
    latest unfinished entry that expects a piece of its kind, a new entry starting at each "[": the
    thread that cut in finishes its short burst before the other resumes. A message is atomic and runs to
    the next newline, except that one with a body (printed raw) runs on until a line starts with "[".
    Line numbers of ps-lite message text that fits nowhere are appended to `unparsed`; other text that
    fits nowhere (warnings spanning lines, Python output) is skipped."""
    text = path.read_text(encoding="utf-8", errors="replace")
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    open_entries: list[dict] = []
    position = 0

    def line_no(offset: int) -> int:
        return bisect.bisect_right(line_starts, offset)

    while position < len(text):
        expecting = [entry for entry in open_entries if entry["expect"] < len(PIECES)]
        for entry in reversed(expecting):
            kind, pattern = PIECES[entry["expect"]]
            found = pattern.match(text, position)
            if found:
                entry[kind] = found.group(0)
                entry["expect"] += 1
                if kind == "message":
                    entry["line_no"] = line_no(position)
                position = found.end()
                if entry["expect"] == len(PIECES):
                    open_entries.remove(entry)
                    yield entry["line_no"], entry["time"], f"{entry['file']}:{entry['line']}", entry["message"]
                break
        else:
            if text.startswith("[", position):
                open_entries.append({"expect": 1})
                position += 1
                continue
            end = text.find("\n", position)
            end = len(text) if end < 0 else end + 1
            if META_MARK in text[position:end]:
                unparsed.append(line_no(position))  # a ps-lite message lost (other programs' text is not)
            position = end
    unparsed.extend(line_no(len(text) - 1) for entry in open_entries if META_MARK in entry.get("message", ""))


def _parse_meta(text: str) -> dict | None:
    found = META_RE.match(text)
    if found is None:
        return None
    sender, recver, request, timestamp, rest = found.groups()
    row = {"sender_id": None if sender == "?" else int(sender), "recver_id": int(recver),
           "request": request == "1", "timestamp": None if timestamp is None else int(timestamp),
           "control_cmd": None, "barrier_group": None, "nodes": None, "app_id": None, "customer_id": None,
           "simple_app": None, "push": None, "head": None, "body": None, "data_types": [], "data_sizes": []}
    control = CONTROL_RE.match(rest)
    if control:
        cmd, nodes, barrier_group, _ = control.groups()
        row["control_cmd"] = cmd
        row["barrier_group"] = None if barrier_group is None else int(barrier_group)
        if nodes is not None:
            row["nodes"] = [{"role": role, "id": int(node_id) if node_id else None, "ip": ip,
                             "port": int(port), "is_recovery": is_recovery == "1"}
                            for role, node_id, ip, port, is_recovery in NODE_RE.findall(nodes)]
        rest = rest[control.end():]
    else:
        app = APP_RE.match(rest)
        if app is None:
            raise ValueError(f"unrecognised ps-lite meta: {text[:200]!r}")
        row["app_id"], row["customer_id"] = int(app.group(1)), int(app.group(2))
        row["simple_app"], row["push"] = app.group(3) == "1", app.group(4) == "1"
        rest = rest[app.end():]
    head = HEAD_RE.match(rest)
    if head:
        row["head"] = int(head.group(1))
        rest = rest[head.end():]
    data = DATA_RE.search(rest)
    if data:
        row["data_types"] = data.group(1).split()
        row["data_sizes"] = [int(size) for size in re.findall(r"\d+", data.group(2))]
        rest = rest[:data.start()]
    if rest.startswith(BODY_MARK):
        row["body"] = rest[len(BODY_MARK):]
    elif rest:
        raise ValueError(f"unrecognised tail of ps-lite meta: {rest[:200]!r}")
    return row


def parse_pslite_log(path: str | Path, node: str | None = None) -> pd.DataFrame:
    """One row per message the log says was sent or received (columns: PSLITE_COLUMNS)."""
    path = Path(path)
    node = node or path.stem
    rows = []
    own_id = None
    unparsed: list[int] = []
    for line_no, log_time, location, message in _log_entries(path, unparsed):
        own = OWN_ID_RE.match(message)
        if own:
            own_id = int(own.group(1) or own.group(2))
            continue
        if REBIND_RE.match(message):
            own_id = None  # a new ps-lite start in this process: no id until the scheduler assigns one
            continue
        meta = _parse_meta(message)
        if meta is None:
            continue
        first_line = message.split("\n", 1)[0]
        rows.append({"node": node, "line_no": line_no, "log_time": log_time, "location": location,
                     "own_id": own_id, "keys": None, "raw": f"[{log_time}] {location}: {first_line}", **meta})
    frame = pd.DataFrame(rows, columns=[c for c in PSLITE_COLUMNS if c not in ("direction", "pull")])
    receipt_locations = set(frame.loc[frame["sender_id"].notna(), "location"])
    locations = set(frame["location"])
    if len(receipt_locations) != 1 or len(locations) > 2:
        raise ValueError(f"{path}: cannot tell sends from receipts (locations {sorted(locations)})")
    frame["direction"] = frame["location"].map(lambda loc: "recv" if loc in receipt_locations else "send")
    is_data = frame["control_cmd"].isna() & ~frame["simple_app"].fillna(False).astype(bool)
    frame["pull"] = is_data & ~frame["push"].fillna(False).astype(bool)
    for column in INT_COLUMNS:
        frame[column] = frame[column].astype("Int64")
    for column in BOOL_COLUMNS:
        frame[column] = frame[column].astype("boolean")
    for column in ("node", "direction", "control_cmd", "location"):
        frame[column] = frame[column].astype("category")
    frame = frame[PSLITE_COLUMNS]
    frame.attrs["unparsed_lines"] = unparsed
    return frame


@dataclass
class Job:
    """A recorded job directory."""

    path: Path
    meta: dict
    records: dict[str, dict] = field(default_factory=dict)
    zmq_record: dict | None = None
    _logs: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.meta["job"]

    @property
    def nodes(self) -> list[dict]:
        return self.meta["nodes"]

    def node(self, name: str) -> dict:
        return next(node for node in self.nodes if node["name"] == name)

    def capture_path(self, node: str) -> Path:
        return self.path / self.node(node)["capture"]

    def open_capture(self, node: str):
        return gzip.open(self.capture_path(node), "rb")

    def log(self, node: str) -> pd.DataFrame:
        if node not in self._logs:
            self._logs[node] = parse_pslite_log(self.path / self.node(node)["log"], node)
        return self._logs[node]

    @property
    def pslite_messages(self) -> pd.DataFrame:
        """Every node's parsed log, concatenated (MXNet jobs)."""
        return pd.concat([self.log(node["name"]) for node in self.nodes], ignore_index=True)

    @property
    def node_by_pslite_id(self) -> dict[int, str]:
        return {node["pslite_id"]: node["name"] for node in self.nodes if node.get("pslite_id") is not None}


def load_job(path: str | Path) -> Job:
    path = Path(path)
    meta = json.loads((path / "job.json").read_text())
    job = Job(path=path, meta=meta)
    for node in meta["nodes"]:
        record = node.get("record")
        if record and (path / record).exists():
            job.records[node["name"]] = json.loads((path / record).read_text())
    if meta.get("record"):
        job.zmq_record = json.loads((path / meta["record"]).read_text())
    return job


def _none(value):
    return None if value is None or value is pd.NA or (isinstance(value, float) and value != value) else value


def logged_message_keys(job, node: str) -> collections.Counter:
    """(direction, peer id, fields…) of every message the node's ps-lite logged."""
    own = job.node(node)["pslite_id"]
    log = job.log(node)
    found = collections.Counter()
    for row in log.itertuples():
        if row.direction == "send":
            sender, recver = own, row.recver_id
        else:
            sender = _none(row.sender_id)
            recver = own if row.recver_id == KEMPTY else row.recver_id
        cmd = _none(row.control_cmd)
        cmd = None if cmd in (None, "EMPTY") else pslite.CONTROL_CMD_NAMES.index(cmd)
        found[(
            row.direction, _none(sender), int(recver), bool(row.request), _none(row.timestamp), cmd,
            _none(row.push), _none(row.simple_app), _none(row.head), _none(row.app_id), _none(row.customer_id),
            tuple(int(s) for s in row.data_sizes),
        )] += 1
    return found


def _decoded_fields(row) -> tuple:
    """The fields of a decoded message that ps-lite logs, from the receiver on (as in logged_message_keys)."""
    is_data = _none(row.control_cmd) is None
    return (
        int(row.recver_id), bool(row.request), _none(row.ps_timestamp),
        None if is_data else int(row.control_cmd),
        bool(row.push) if is_data else None, bool(row.simple_app) if is_data else None,
        _none(row.head), _none(row.app_id) if is_data else None, _none(row.customer_id) if is_data else None,
        tuple(None if s is None or s != s else int(s) for s in row.data_sizes),
    )


def logged_sends(job) -> collections.Counter:
    """(sender, fields...) of every message of the job: what each node's log lists as sent."""
    sent = collections.Counter()
    for node in job.nodes:
        for key, count in logged_message_keys(job, node["name"]).items():
            if key[0] == "send":
                sent[key[1:]] += count
    return sent


def event_message_keys(events: pd.DataFrame, messages: pd.DataFrame) -> collections.Counter:
    """(sender, fields...) of every event of a decode output (events.parquet), from the observation each event
    takes its fields from (messages.parquet row `message_row`)."""
    rows = messages.iloc[events["message_row"].to_numpy()]
    return collections.Counter((_none(row.sender_id), *_decoded_fields(row)) for row in rows.itertuples())


def decoded_message_keys(messages: pd.DataFrame, job, node: str) -> collections.Counter:
    """The same keys as `logged_message_keys`, of the messages decoded from the node's own capture."""
    own = job.node(node)["pslite_id"]
    mine = messages[messages["capture"] == node]
    found = collections.Counter()
    for row in mine.itertuples():
        fields = _decoded_fields(row)
        # A message to itself (over lo) is one message on the wire and a send plus a receipt in the log.
        # ps-lite's Van::Stop sends TERMINATE to itself past the logging Send(); only its receipt is logged.
        self_terminate = row.sender_id == row.recver_id and row.control_cmd == pslite.TERMINATE
        if row.sender_id == own and not self_terminate:
            found[("send", own, *fields)] += 1
        if row.recver_id == own:
            sender = _none(row.sender_id)
            if row.control_cmd == pslite.ADD_NODE and sender != pslite.SCHEDULER_ID:
                sender = None     # ps-lite logs a node without an id yet as "?"
            found[("recv", sender, *fields)] += 1
    return found


def mxnet_jobs(*, lossy: bool = False) -> list[str]:
    """The bundled MXNet jobs (pcaps/<job>/job.json) alone on their network: those whose captures kept every
    packet, or (lossy) those recorded with a small capture buffer, whose captures lost packets."""
    found = []
    for job in sorted(PCAPS.glob("*/job.json")):
        meta = json.loads(job.read_text())
        if (meta.get("framework") == "mxnet" and not meta.get("noise_s")
                and bool(meta.get("capture_buffer_kib")) == lossy):
            found.append(job.parent.name)
    return found
