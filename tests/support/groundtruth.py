"""Readers of the ground truth recorded beside the captures, independent of decoders/.

- `parse_pslite_log(path)`: every message ps-lite logged as sent or received (PS_VERBOSE=2), one row per
  logged message: MXNet 1.9.1's dmlc/ps-lite and BytePS 0.2.5.post15's bytedance/ps-lite.
- `load_job(dir)`: a recorded job: job.json, per-node logs (parsed lazily), per-node workload records,
  and for the zmq job its message record.
- `logged_message_keys` / `decoded_message_keys`: what a node's log lists, and what was decoded from its
  host's capture, in one form (`unmatched_messages`: what one has and the other has not); `logged_sends` /
  `event_message_keys`: the same job-wide, for the job's timeline; `kv_app_messages`: the KV messages the
  BytePS jobs' workers recorded.
- `mxnet_jobs(lossy=...)`: the bundled MXNet jobs, whole or recorded by captures that lost packets.

PS_VERBOSE=2 line format (dmlc::LogMessage prefix, then ps::Message::DebugString):

    dmlc       [HH:MM:SS] ../3rdparty/ps-lite/src/van.cc:LINE: SENDER => RECVER. Meta: ...
    bytedance  [HH:MM:SS] src/van.cc:LINE: zeromq<TAB>(sent|received): SENDER => RECVER. Meta: ...

    Meta: request=0|1[, timestamp=T]
        ( , control={ cmd=NAME[, node={ NODE ... }][, barrier_group=G][, msg_sig=S] }
        | , app_id=A, customer_id=C, simple_app=0|1, push=0|1 )
        [, head=H][, key=K][, body=TEXT][, data_type={ T1 T2 ... } Body: data_size=N1 data_size=N2 ...]
        [. THIS IS NOT DATA MSG!]
    NODE: dmlc "role=R[, id=N], ip=IP, port=P, is_recovery=0|1",
          bytedance "[role=R[, id=N], ip=IP, port=P, is_recovery=0|1, aux_id=A]"

SENDER is "?" on every send (ps-lite fills it from the connection on receipt) and on receipts from a
node that has no id yet; RECVER is 2147483647 (kEmpty) on receipts before the node knows its own id.
The body (a SimpleApp string, e.g. MXNet's pickled optimizer) is printed raw and may span lines.
bytedance/ps-lite says which way a message went (after its van's name), prints a data message's meta.key
(its own field, uninitialised in a worker's requests, echoed in the server's answers; not the keys frame)
and ends control and SimpleApp messages with ". THIS IS NOT DATA MSG!"; its TERMINATE has no timestamp.
dmlc/ps-lite logs sends and receipts at two places in van.cc; which is which is read from the log itself:
receipts are the place where a sender id ever appears. Neither prints the keys frame or a `pull` flag;
`pull` is derived (a data message that is not a push). Threads interleave the pieces of their lines; see
`_log_entries`. Text that cannot be placed is listed (by line number) in the frame's attrs["unparsed_lines"].
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
from typing import NamedTuple

import pandas as pd

from dlcsniff.decoders.protocols.pslite import decoder as pslite

PCAPS = Path(__file__).resolve().parents[2] / "pcaps"
KEMPTY = 2147483647
BODY_MARK = ", body="
META_MARK = ". Meta: "
# Where a ps-lite message's entry goes on after "] FILE:": its line, ": ", bytedance's van and direction, the
# message's "SENDER => RECVER. Meta: ".
MESSAGE_TAIL = r"(\d+): (?:\w+\t(?:sent|received): )?(?:\?|\d+) => \d+\. Meta: "
MESSAGE_LOCATION_RE = re.compile(r"\] [^\s:\[\]]+:" + MESSAGE_TAIL)


def _pieces(message_lines: set[str]) -> list[tuple[str, re.Pattern]]:
    """The pieces of one log entry after its "[", in writing order (dmlc::LogMessage, then the message:
    bytedance/ps-lite writes its van's name and the direction before it). A message stops where another
    entry's ps-lite message goes on, at one of the log's `message_lines` (seen: "...data_size=8" of one
    thread, then "530: zeromq\tsent: ? => 11. Meta: ..." of another whose "[time] src/van.cc:" came before)."""
    other_tail = (r"(?!(?:" + "|".join(sorted(message_lines)) + ")" + MESSAGE_TAIL.removeprefix(r"(\d+)") + ")"
                  if message_lines else "")
    return [
        ("open", re.compile(r"\[")),
        ("time", re.compile(r"\d\d:\d\d:\d\d")),
        ("close", re.compile(r"\] ")),
        # a source file ("src/van.cc"), never the digits of another entry's time ("[[00:38:07] 00:38:07] ../van.cc"
        # is two entries' "[" and time, the first of which goes on after later entries: its thread stalled)
        ("file", re.compile(r"(?=[^\s:\[\]]*[./])[^\s:\[\]]+")),
        ("colon", re.compile(r":")),
        # followed by its separator, or by another entry's piece ("src/van.cc:555[15:57:50] ..."): never the
        # sender id another entry's message starts with ("9 => 8. Meta: ...", above) or another's time
        ("line", re.compile(r"\d+(?=: |\[|\n)")),
        ("separator", re.compile(r": ")),
        ("prefix", re.compile(r"(?:\w+\t(?:sent|received): )?")),
        # Runs to the newline; a "[" inside ("W[9] is connected") is text unless another entry starts there. No
        # message starts with "[": one there opens another thread's entry, whose time comes after this message
        # (seen: "...van.cc:419: [8 => 11. Meta: ...\n10:18:53] ../van.cc:394: ? => 8. ...").
        ("message", re.compile(r"(?!\[)(?:[^\n]*?, body=.*?(?=\n\[|\n?\Z)|(?:" + other_tail
                               + r"(?:[^\n\[]|\[(?!\[|\d\d:\d\d:\d\d\] )))*)", re.S)),
        ("newline", re.compile(r"\n")),
    ]


META_RE = re.compile(r"^(?:\w+\t(sent|received): )?(\?|\d+) => (\d+)\. Meta: request=([01])(?:, timestamp=(\d+))?(.*)$",
                     re.S)
CONTROL_RE = re.compile(r"^, control=\{ cmd=(\w+)(?:, node=\{(.*?) \})?(?:, barrier_group=(-?\d+))?"
                        r"(?:, msg_sig=(\d+))? \}", re.S)
APP_RE = re.compile(r"^, app_id=(-?\d+), customer_id=(-?\d+), simple_app=([01]), push=([01])")
HEAD_RE = re.compile(r"^, head=(-?\d+)")
KEY_RE = re.compile(r"^, key=(\d+)")
NOT_DATA = ". THIS IS NOT DATA MSG!"
DATA_RE = re.compile(r", data_type=\{((?: \w+)*) \} Body:((?: data_size=\d+)*)$")
NODE_RE = re.compile(r"role=(\w+)(?:, id=(\d+))?, ip=([^,\s]+), port=(\d+), is_recovery=([01])")
OWN_ID_RE = re.compile(r"^[HSW]\[(\d+)\] is connected to others|^Bind to \[?role=\w+, id=(\d+)")
REBIND_RE = re.compile(r"^Bind to \[?role=")

PSLITE_COLUMNS = [
    "node", "line_no", "log_time", "location", "direction", "own_id", "sender_id", "recver_id",
    "request", "timestamp", "control_cmd", "barrier_group", "nodes", "app_id", "customer_id",
    "simple_app", "push", "pull", "head", "meta_key", "body", "data_types", "data_sizes", "keys", "raw",
]
INT_COLUMNS = ["own_id", "sender_id", "recver_id", "timestamp", "barrier_group", "app_id", "customer_id", "head",
               "meta_key"]
BOOL_COLUMNS = ["request", "simple_app", "push", "pull"]


def _log_entries(path: Path, unparsed: list[int]) -> Iterator[tuple[int, str, str, str]]:
    """(line number, time, source location, message) per log entry, in the order the messages were written.

    The threads of one process share stderr, and dmlc's logger writes an entry in pieces: "[", time, "] ",
    file, ":", line, ": ", (bytedance: van and direction), message, newline. Another thread's pieces can land
    between any two of them (seen: "[[08:22:23] ...whole entry...\n08:22:23] ../van.cc:394: ..."). Each
    piece is given to the latest unfinished entry that expects a piece of its kind, a new entry starting at
    each "[": the thread that cut in finishes its short burst before the other resumes. A message is
    atomic and runs to the next newline (or to where another's goes on, see `_pieces`), except that one
    with a body (printed raw) runs on until a line starts with "[".
    Line numbers of ps-lite message text that fits nowhere are appended to `unparsed`; other text that
    fits nowhere (warnings spanning lines, Python output) is skipped."""
    text = path.read_text(encoding="utf-8", errors="replace")
    pieces = _pieces({found.group(1) for found in MESSAGE_LOCATION_RE.finditer(text)})
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    open_entries: list[dict] = []
    position = 0

    def line_no(offset: int) -> int:
        return bisect.bisect_right(line_starts, offset)

    while position < len(text):
        expecting = [entry for entry in open_entries if entry["expect"] < len(pieces)]
        for entry in reversed(expecting):
            kind, pattern = pieces[entry["expect"]]
            found = pattern.match(text, position)
            if found:
                entry[kind] = found.group(0)
                entry["expect"] += 1
                if kind == "message":
                    entry["line_no"] = line_no(position)
                position = found.end()
                if entry["expect"] == len(pieces):
                    open_entries.remove(entry)
                    yield (entry["line_no"], entry["time"], f"{entry['file']}:{entry['line']}",
                           entry["prefix"] + entry["message"])
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
    direction, sender, recver, request, timestamp, rest = found.groups()
    row = {"direction": {"sent": "send", "received": "recv", None: None}[direction],
           "sender_id": None if sender == "?" else int(sender), "recver_id": int(recver),
           "request": request == "1", "timestamp": None if timestamp is None else int(timestamp),
           "control_cmd": None, "barrier_group": None, "nodes": None, "app_id": None, "customer_id": None,
           "simple_app": None, "push": None, "head": None, "meta_key": None, "body": None, "data_types": [],
           "data_sizes": []}
    rest = rest.removesuffix(NOT_DATA)
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
    key = KEY_RE.match(rest)
    if key:
        row["meta_key"] = int(key.group(1))
        rest = rest[key.end():]
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
    frame = pd.DataFrame(rows, columns=[c for c in PSLITE_COLUMNS if c != "pull"])
    if frame["direction"].isna().any():         # dmlc: by where the line was logged
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

    def capture_name(self, node: str) -> str:
        """The name the decode tables give the node's capture (its host's: colocated nodes share one)."""
        return self.node(node)["capture"].removesuffix(".gz").removesuffix(".pcap")

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
            text = (path / record).read_text()
            # kv_app (the BytePS jobs) writes JSON lines: the record is their list
            job.records[node["name"]] = ([json.loads(line) for line in text.splitlines()] if record.endswith(".jsonl")
                                         else json.loads(text))
    if meta.get("record"):
        job.zmq_record = json.loads((path / meta["record"]).read_text())
    return job


def _none(value):
    return None if value is None or value is pd.NA or (isinstance(value, float) and value != value) else value


def logged_message_keys(job, node: str) -> collections.Counter:
    """(direction, sender, recver, fields…) of every message the node's ps-lite logged."""
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
            _none(row.push), _none(row.simple_app), _none(row.head), _none(row.app_id),
            _none(row.customer_id), _none(row.barrier_group), tuple(int(s) for s in row.data_sizes),
        )] += 1
    return found


def _decoded_fields(row) -> tuple:
    """The fields of a decoded message that ps-lite logs, from the receiver on (as in logged_message_keys); a
    data frame whose size a capture hole took is None."""
    is_data = _none(row.control_cmd) is None
    return (
        int(row.recver_id), bool(row.request), _none(row.ps_timestamp),
        None if is_data else int(row.control_cmd),
        bool(row.push) if is_data else None, bool(row.simple_app) if is_data else None,
        _none(row.head), _none(row.app_id) if is_data else None, _none(row.customer_id) if is_data else None,
        _none(row.barrier_group), tuple(None if s is None or s != s else int(s) for s in row.data_sizes),
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
    """The same keys as `logged_message_keys`, of the messages decoded from the node's own capture (its
    host's)."""
    own = job.node(node)["pslite_id"]
    mine = messages[messages["capture"] == job.capture_name(node)]
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
        # a hung job the recorder killed has no node records but the stalled node's (lab/record.py mxnet_hang)
        hung = (meta.get("fault") or {}).get("kind") == "hang"
        if (meta.get("framework") == "mxnet" and not meta.get("noise_s") and not hung
                and bool(meta.get("capture_buffer_kib")) == lossy):
            found.append(job.parent.name)
    return found


def server_id(rank: int) -> int:
    """ps-lite's Postoffice::ServerRankToID."""
    return 8 + 2 * rank


def unmatched_messages(messages: pd.DataFrame, job, node: str) -> tuple[collections.Counter, collections.Counter]:
    """(logged but not decoded, decoded but not logged): the node's log against its host's capture."""
    logged, decoded = logged_message_keys(job, node), decoded_message_keys(messages, job, node)
    assert sum(logged.values()) > 0, f"{node}: its log lists no message"
    return logged - decoded, decoded - logged


class KvMessage(NamedTuple):
    """A KV or SimpleApp message of a BytePS job, as the workers' records imply it and as it is decoded."""
    sender: int
    recver: int
    request: bool
    push: bool
    timestamp: int
    app_id: int
    customer_id: int
    head: int
    keys: tuple[int, ...]
    lens: tuple[int, ...] | None
    data_sizes: tuple[int, ...]
    tensor_key: int | None
    part: int | None
    server_rank: int
    head_says: tuple[str, str] | None     # BytePS's (request type, dtype), where the record gives a dtype


def kv_app_messages(job: Job) -> list[KvMessage]:
    """Every KV and SimpleApp message the workers' records (lab/byteps/kv_app.cc) imply: each request, one
    ps-lite message per server it touched (KVWorker's slicer), and its answer. The data frames an answer
    carries are in the record (`answer`: none, keys + an empty vals frame, keys + vals, keys + vals + lens);
    lens count values (bytes / `val_type_bytes`); tensor and part are kv_app's BytePS key layout of the
    message's first key; a BytePS-protocol request's dtype is in its head (request type "default")."""
    out = []
    for node in job.nodes:
        if node["role"] != "worker":
            continue
        worker = node["pslite_id"]
        for entry in job.records[node["name"]]:
            if entry["event"] != "request":
                continue
            common = (entry["ts"], entry["app"], entry["customer"], entry["cmd"])
            if entry["op"] == "simple":
                for server in entry["recvers"]:
                    rank = (server - server_id(0)) // 2
                    out.append(KvMessage(worker, server, True, False, *common, (), None, (), None, None, rank, None))
                    out.append(KvMessage(server, worker, False, False, *common, (), None, (), None, None, rank, None))
                continue
            push = entry["op"].endswith("push")
            width = entry["val_type_bytes"]
            bytes_of = dict(zip(entry["keys"], entry["lens"]))
            part_of = dict(zip(entry["keys"], entry["parts"]))
            head_says = ("default", entry["dtype"]) if "dtype" in entry else None
            for message in entry["messages"]:
                server = server_id(message["server"])
                keys = tuple(message["keys"])
                lens = tuple(bytes_of[key] // width for key in keys)
                attribution = (*part_of[keys[0]], message["server"], head_says)
                if push:
                    sizes = (8 * len(keys), message["vals_bytes"], *((4 * len(keys),) if entry["with_lens"] else ()))
                    out.append(KvMessage(worker, server, True, True, *common, keys,
                                         lens if entry["with_lens"] else None, sizes, *attribution))
                else:
                    out.append(KvMessage(worker, server, True, False, *common, keys, None, (8 * len(keys), 0),
                                         *attribution))
                frames = {"keys": 8 * len(keys), "vals": 0 if push else message["vals_bytes"], "lens": 4 * len(keys)}
                answer = entry["answer"]
                out.append(KvMessage(server, worker, False, push, *common, keys if answer else (),
                                     lens if "lens" in answer else None, tuple(frames[f] for f in answer),
                                     *attribution))
    return out
