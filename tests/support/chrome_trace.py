"""A reader of Chrome trace event JSON written from the format alone (the Trace Event Format document: a JSON
object with traceEvents, phases M/X/i/s/f, µs timestamps, flow events bound to the slice enclosing them on their
track, read in file order as a viewer reads them), for the export tests."""
from __future__ import annotations

import collections
import json
from dataclasses import dataclass, field


@dataclass
class Slice:
    start_ns: int
    end_ns: int
    event: dict


@dataclass
class OpenedTrace:
    """What a trace viewer builds from the file: named processes and threads, slices, flows."""

    process_names: dict[int, str] = field(default_factory=dict)
    process_labels: dict[int, str] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    slices: dict[tuple[int, int], list[Slice]] = field(default_factory=lambda: collections.defaultdict(list))
    instants: list[dict] = field(default_factory=list)
    flows: dict[int, dict[str, dict]] = field(default_factory=lambda: collections.defaultdict(dict))
    bound: dict[int, Slice | None] = field(default_factory=dict)      # id(flow event) → its slice
    other: dict = field(default_factory=dict)


def ns(microseconds: float) -> int:
    return round(microseconds * 1000)


def open_trace(path) -> OpenedTrace:
    document = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(document, dict) and document["displayTimeUnit"] == "ns"
    opened = OpenedTrace(other=document.get("otherData", {}))
    for event in document["traceEvents"]:
        ph, pid, tid = event["ph"], event["pid"], event["tid"]
        assert isinstance(pid, int) and isinstance(tid, int)
        if ph == "M":
            if event["name"] == "process_name":
                assert pid not in opened.process_names
                opened.process_names[pid] = event["args"]["name"]
            elif event["name"] == "process_labels":
                opened.process_labels[pid] = event["args"]["labels"]
            elif event["name"] == "thread_name":
                assert (pid, tid) not in opened.thread_names
                opened.thread_names[(pid, tid)] = event["args"]["name"]
            continue
        assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
        if ph == "X":
            assert event["dur"] >= 0
            start = ns(event["ts"])
            opened.slices[(pid, tid)].append(Slice(start, start + ns(event["dur"]), event))
        elif ph == "i":
            assert event["s"] in ("g", "p", "t")
            opened.instants.append(event)
        elif ph in ("s", "f"):
            assert ph not in opened.flows[event["id"]], f"flow {event['id']} has two {ph} events"
            opened.flows[event["id"]][ph] = event
            # bound as a viewer reading the file in order binds it: to the track's latest slice, if open then
            latest = opened.slices[(pid, tid)][-1] if opened.slices[(pid, tid)] else None
            at = ns(event["ts"])
            opened.bound[id(event)] = latest if latest and latest.start_ns <= at <= latest.end_ns else None
        else:
            raise AssertionError(f"unexpected phase {ph}")
    return opened


def enclosing(opened: OpenedTrace, event: dict) -> Slice | None:
    return opened.bound[id(event)]


def slices_nest(slices: list[Slice]) -> bool:
    """Whether the slices of one track nest (each inside or after the one before, never half over it)."""
    stack: list[Slice] = []
    for current in sorted(slices, key=lambda s: (s.start_ns, -s.end_ns)):
        while stack and stack[-1].end_ns <= current.start_ns and stack[-1].start_ns < current.start_ns:
            stack.pop()
        if stack and current.end_ns > stack[-1].end_ns:
            return False
        stack.append(current)
    return True
