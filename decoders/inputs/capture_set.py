"""What the user names on the command line → the captures to decode, each one node's capture in its files.

A file is a capture, unless it is a piece of one: tcpdump -C (`w.pcap`, `w.pcap1`, `w.pcap2`...) and -W rings,
tcpdump -G (strftime names), dumpcap ring buffers and editcap -c chunks (`prefix_NNNNN_YYYYMMDDhhmmss.ext`), a
capture daemon's rotated files (`capture-SSSS-FFFFF.pcap`). Pieces are recognised by evidence, not by name alone:
files whose names follow one pattern are one capture when they have the same interfaces (link types) and their
packets follow each other in time (each piece starts where the one before ended, give or take a little
reordering); they are read in order of their first packet, as one continuous capture. Named alike but
overlapping in time (worker0.pcap and worker1.pcap: two nodes) they stay separate captures. Where no tool's
naming says they are pieces (names alike but for digits, such as tcpdump -G's), time is not enough (two nodes'
clocks may be seconds apart): the TCP traffic must go on from one file into the next
(decoders.inputs.continuation). Files of one name in different directories are one capture on the same
evidence, and refused otherwise (they would share a capture name).

A capture daemon's directory (capture.json) stands for its captures, one per daemon run, named after the
directory; any other directory for the capture files directly inside it. `-` is standard input, and a fifo is
read as the stream it is: each of them a capture of its own.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from dlcsniff.decoders.errors import CaptureError
from dlcsniff.decoders.formats.capture_dir import PCAP_RE, is_capture_dir, read_capture_json, set_files
from dlcsniff.decoders.inputs.capture_file import (STDIN, Packet, RecordBatch, first_last_ts_ns, is_stream,
                                                   open_capture)
from dlcsniff.decoders.inputs.continuation import EDGE_PACKETS, continues, tcp_head, tcp_tail

CAPTURE_EXTENSIONS = ("pcap", "pcapng", "cap", "dmp")
COMPRESSION_EXTENSIONS = ("gz", "xz", "zst", "zstd")
ProgressFn = Callable[[int], None]   # called with the number of raw input bytes consumed since the last call
# How far a piece's last packets may lie after the next piece's first (timestamps taken on several CPUs are
# not quite in order) and still be read as the piece before it; never more than half the piece's own span.
OVERLAP_TOLERANCE_NS = 1_000_000

_COMPRESSED = re.compile(rf"(.*)\.({'|'.join(COMPRESSION_EXTENSIONS)})", re.IGNORECASE)
_CAPTURE_NAME = re.compile(rf".*\.(?:{'|'.join(CAPTURE_EXTENSIONS)})(\d*)", re.IGNORECASE)
# tcpdump -C / -W: the -w name, then a file number (none on the first file of -C without -W)
_TCPDUMP_NUMBERED = re.compile(rf"(.*\.(?:{'|'.join(CAPTURE_EXTENSIONS)}))(\d+)", re.IGNORECASE)
# dumpcap -b and editcap -c: prefix_NNNNN_YYYYMMDDhhmmss.ext
_NUMBERED_AND_DATED = re.compile(r"(.*)_(\d{5,})_(\d{14})(\.[^.]+)")


def capture_name(path: Path) -> str:
    """The input file name without its extensions (`worker0.pcap.gz` → `worker0`)."""
    name = path.name
    while True:
        stem, dot, ext = name.rpartition(".")
        if not dot or ext.lower() not in {*CAPTURE_EXTENSIONS, *COMPRESSION_EXTENSIONS}:
            return name
        name = stem


def looks_like_capture(path: Path) -> bool:
    """A file a directory's listing takes for a capture: a capture extension, maybe numbered (tcpdump -C),
    maybe compressed."""
    base = _COMPRESSED.fullmatch(path.name)
    return _CAPTURE_NAME.fullmatch(base.group(1) if base else path.name) is not None


@dataclass(frozen=True)
class CaptureInput:
    """One capture: its files, read in order as one continuous capture (rotated or chunked pieces), the
    daemon's directory when it came from one (its probe files then join the tables), and what was noted
    while putting it together (said among the summary's warnings)."""
    name: str
    files: tuple[Path, ...]
    directory: Path | None = None
    notes: tuple[str, ...] = ()

    @property
    def stream(self) -> bool:
        """Read as a stream (standard input, a fifo): no size, read once."""
        return any(is_stream(p) for p in self.files)

    @property
    def size_bytes(self) -> int | None:
        """Bytes on disk; None for a stream."""
        return None if self.stream else sum(p.stat().st_size for p in self.files)

    @property
    def path(self) -> Path:
        """What the user named: the file (the first piece), or the daemon's directory."""
        return self.files[0] if self.directory is None else self.directory

    def with_files(self, files: Iterable[Path]) -> CaptureInput:
        return dataclasses.replace(self, files=tuple(files))


def expand_inputs(inputs: Iterable[Path]) -> list[CaptureInput]:
    """The captures the inputs name (see the module doc), with unique names, in the order the inputs name
    them."""
    placed: list[tuple[int, CaptureInput]] = []      # (position of its first input, capture)
    loose: dict[Path, tuple[int, Path]] = {}         # files to put together: resolved path -> (position, path)
    position = itertools.count()
    for item in inputs:
        item = Path(item)
        if str(item) == STDIN or is_stream(item):
            placed.append((next(position), CaptureInput("stdin" if str(item) == STDIN else capture_name(item),
                                                        (item,))))
        elif item.is_dir() and is_capture_dir(item):
            read_capture_json(item)                # one clear error when it is unreadable
            sets, _ = set_files(item)
            if not any(sets.values()):
                raise CaptureError(f"{item}: the capture daemon's directory holds no packet files")
            for run, files in sorted(sets.items()):
                name = item.resolve().name if len(sets) == 1 else f"{item.resolve().name}-{run}"
                placed.append((next(position), CaptureInput(name, tuple(files), item)))
        elif item.is_dir():
            found = sorted(p for p in item.iterdir() if p.is_file() and looks_like_capture(p))
            if not found:
                raise CaptureError(f"{item}: directory holds no capture files (*.pcap, *.pcapng, numbered by "
                                   f"tcpdump -C, optionally .gz, .xz or .zst)")
            for path in found:
                loose.setdefault(path.resolve(), (next(position), path))
        elif not item.exists():
            raise CaptureError(f"{item}: no such file")
        else:
            loose.setdefault(item.resolve(), (next(position), item))
    first_position = {path: pos for pos, path in loose.values()}
    for capture in assemble_pieces([path for _, path in sorted(loose.values())]):
        placed.append((min(first_position[p] for p in capture.files), capture))
    captures = [capture for _, capture in sorted(placed, key=lambda entry: entry[0])]
    if sum(str(c.path) == STDIN for c in captures) > 1:
        raise CaptureError("standard input (-) named twice")
    return _one_capture_per_name(captures)


def _one_capture_per_name(captures: list[CaptureInput]) -> list[CaptureInput]:
    """Captures that came out with one name (files of one name in different directories: a/node0.pcap and
    b/node0.pcap) are one capture when their packets are its pieces (see _chains: one follows the other in
    time and carries its TCP traffic on); otherwise they are refused, with how to name them apart."""
    by_name: dict[str, list[CaptureInput]] = collections.defaultdict(list)
    for capture in captures:
        by_name[capture.name].append(capture)
    kept = []
    for capture in captures:
        alike = by_name[capture.name]
        if len(alike) == 1:
            kept.append(capture)
            continue
        if capture is not alike[0]:
            continue
        paths = [c.path for c in alike]
        chains, reasons = ([], ["a stream or a daemon's directory is never a piece"]) if any(
            c.stream or c.directory is not None for c in alike) else _chains(
            [_Piece(p, str(p)) for c in alike for p in c.files], named_by_tool=False)
        reasons = reasons or ["a file without packets is no piece of another"]
        if len(chains) == 1:
            kept.append(CaptureInput(capture.name, tuple(piece.path for piece in chains[0]),
                                     notes=tuple(n for c in alike for n in c.notes)))
            continue
        renamed = ", ".join(f"{p.resolve().parent.name}-{p.name}" for p in paths)
        raise CaptureError(f"{' and '.join(map(str, paths))} share the capture name {capture.name!r} (a capture is "
                           f"named after its file) and are not pieces of one capture ({reasons[0]}): give each "
                           f"node's capture a name of its own, e.g. {renamed}")
    return kept


# -- pieces of one capture -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Pattern:
    """Files whose names follow one pattern (candidates for pieces of one capture)."""
    tool: str | None        # the tool whose naming it is; None: names alike but for their digits
    key: tuple
    name: str               # the capture's name when its pieces are one capture


def _name_pattern(path: Path, tcpdump_bases: set[tuple[Path, str]]) -> _Pattern | None:
    compressed = _COMPRESSED.fullmatch(path.name)
    base, suffix = (compressed.group(1), compressed.group(2).lower()) if compressed else (path.name, "")
    where = path.parent.resolve()
    if found := PCAP_RE.fullmatch(base):
        return _Pattern("capture daemon", (where, "daemon", found.group(1), suffix), f"capture-{found.group(1)}")
    if found := _TCPDUMP_NUMBERED.fullmatch(base):
        return _Pattern("tcpdump -C", (where, "tcpdump", found.group(1), suffix), capture_name(Path(found.group(1))))
    if (where, base) in tcpdump_bases:        # the first file of tcpdump -C: the -w name itself
        return _Pattern("tcpdump -C", (where, "tcpdump", base, suffix), capture_name(Path(base)))
    if found := _NUMBERED_AND_DATED.fullmatch(base):
        return _Pattern("dumpcap -b / editcap -c", (where, "numbered", found.group(1), found.group(4), suffix),
                        found.group(1))
    if re.search(r"\d", base):                # tcpdump -G (strftime names), or nodes numbered alike
        return _Pattern(None, (where, "digits", re.sub(r"\d+", "#", base), suffix), capture_name(path))
    return None


class _Piece:
    """What putting pieces together needs of a file: its interfaces, first packet and the TCP traffic its first
    packets show (decoders.inputs.continuation), and whether its packets go on past a given time (read only as
    far as that takes; what was read is remembered, with the TCP traffic of its last packets once read to the
    end)."""

    def __init__(self, path: Path, label: str | None = None):
        self.path = path
        self.label = label or path.name     # what reasons call it
        with open_capture(path) as reader:
            first = next(iter(reader.batches()), None)
            self.interfaces = tuple((i.linktype, i.name) for i in reader.interfaces)
            self.head = tcp_head(itertools.islice(_packets([first] if first else []), EDGE_PACKETS))
        self.first_ts_ns = None if first is None else first_last_ts_ns(first)[0]
        self.seen_until_ns = None if first is None else first_last_ts_ns(first)[1]
        self.last_ts_ns: int | None = None      # known once the whole file was read
        self.tail: dict = {}                    # tcp_tail of its last packets, once the whole file was read

    def ends_by(self, limit_ns: int) -> bool:
        """Whether no packet of the file is later than limit_ns."""
        if self.last_ts_ns is not None:
            return self.last_ts_ns <= limit_ns
        if self.seen_until_ns > limit_ns:
            return False
        last_items: collections.deque = collections.deque(maxlen=2)
        with open_capture(self.path) as reader:
            for item in reader.batches():
                self.seen_until_ns = max(self.seen_until_ns, first_last_ts_ns(item)[1])
                if self.seen_until_ns > limit_ns:
                    return False
                last_items.append(item)
            self.tail = tcp_tail(list(_packets(last_items))[-EDGE_PACKETS:])
        self.last_ts_ns = self.seen_until_ns
        return True

    def describe(self) -> str:
        return ", ".join(f"link type {linktype}" + (f" ({name})" if name else "") for linktype, name in
                         self.interfaces) or "no interfaces"


def _packets(items: Iterable[RecordBatch | Packet]) -> Iterable[Packet]:
    for item in items:
        if item.__class__ is Packet:
            yield item
        else:
            yield from item.packets()


def _follows(before: _Piece, after: _Piece) -> bool:
    """Whether `after` takes up where `before` ended: its first packet no earlier than before's last, but
    for a little reordering (OVERLAP_TOLERANCE_NS, and less than half of before's span)."""
    if not before.ends_by(after.first_ts_ns + OVERLAP_TOLERANCE_NS):
        return False
    overlap = before.last_ts_ns - after.first_ts_ns
    return overlap <= 0 or 2 * overlap < before.last_ts_ns - before.first_ts_ns


def _chains(pieces: list[_Piece], named_by_tool: bool) -> tuple[list[list[_Piece]], list[str]]:
    """The pieces as captures: each a chain of pieces following each other in time, with the same
    interfaces; and why any piece started a capture of its own. A file without packets (tcpdump -G opens
    its first file before any packet) joins a capture of its interfaces when the names are a tool's, or
    when the others are all pieces of one capture; else it stays a capture of nothing (a node whose
    capture saw nothing)."""
    chains: list[list[_Piece]] = []
    reasons: list[str] = []
    for piece in sorted((p for p in pieces if p.first_ts_ns is not None), key=lambda p: p.first_ts_ns):
        alike = [chain for chain in chains if chain[-1].interfaces == piece.interfaces]
        fits = [chain for chain in alike if _follows(chain[-1], piece)]
        # names no tool gave are weak evidence: the TCP traffic must go on from one file into the next
        traffic = [] if named_by_tool else [continues(chain[-1].tail, piece.head, chain[-1].label)
                                            for chain in fits]
        carried_on = [chain for chain, (verdict, _) in zip(fits, traffic or [(True, "")] * len(fits))
                      if verdict is not False]
        if carried_on:  # more than one (two captures rotated at the same moment): the one ending last before it
            max(carried_on, key=lambda chain: chain[-1].last_ts_ns).append(piece)
            continue
        if chains:
            why = (traffic[0][1] if fits else
                   f"its packets start while those of {alike[-1][-1].label} go on" if alike else
                   f"its interfaces ({piece.describe()}) are not those of {chains[-1][-1].label} "
                   f"({chains[-1][-1].describe()})")
            reasons.append(f"{piece.label}: {why}")
        chains.append([piece])
    attach_empty = named_by_tool or len(chains) == 1 and len(chains[0]) > 1
    for piece in (p for p in pieces if p.first_ts_ns is None):      # no packets: nothing to order it by
        alike = [chain for chain in chains if chain[-1].interfaces == piece.interfaces]
        if attach_empty and alike:
            alike[0].append(piece)
        else:
            chains.append([piece])
    return chains, reasons


def assemble_pieces(files: list[Path]) -> list[CaptureInput]:
    """Files → captures: pieces of one capture (see the module doc) put together, in order of their first
    packet; every other file a capture of its own. Captures come in the order of their first file in
    `files`."""
    tcpdump_bases = set()
    for path in files:
        compressed = _COMPRESSED.fullmatch(path.name)
        if found := _TCPDUMP_NUMBERED.fullmatch(compressed.group(1) if compressed else path.name):
            tcpdump_bases.add((path.parent.resolve(), found.group(1)))
    groups: dict[tuple, list[Path]] = collections.defaultdict(list)
    patterns: dict[tuple, _Pattern] = {}
    for path in files:
        pattern = _name_pattern(path, tcpdump_bases)
        key = pattern.key if pattern else (path,)
        groups[key].append(path)
        if pattern:
            patterns.setdefault(key, pattern)
    captures: list[CaptureInput] = []
    for key, paths in groups.items():
        pattern = patterns.get(key)
        if len(paths) == 1:
            captures.append(CaptureInput(capture_name(paths[0]), (paths[0],)))
            continue
        chains, reasons = _chains([_Piece(p) for p in paths], named_by_tool=pattern.tool is not None)
        notes = ()
        if pattern.tool is not None and len(chains) > 1:
            notes = (f"{', '.join(p.name for p in paths)}: named as pieces of one capture ({pattern.tool}), "
                     f"but decoded as {len(chains)} captures: " + "; ".join(reasons),)
        for chain in chains:
            # A tool's pieces are named as the tool named the capture; when they are not one capture, the one
            # holding the first file listed is, the others are named by their first file.
            name = (capture_name(chain[0].path) if pattern.tool is None else pattern.name
                    if any(piece.path == paths[0] for piece in chain) else chain[0].path.name)
            captures.append(CaptureInput(name, tuple(p.path for p in chain), notes=notes))
    order = {path: i for i, path in enumerate(files)}
    return sorted(captures, key=lambda c: min(order[p] for p in c.files))


def capture_start(capture: CaptureInput) -> tuple[set[int], int | None]:
    """(link types of the interfaces its files declare before their first packet, its first packet's time)
    of a capture of files, reading each file only to its first packet."""
    pieces = [_Piece(path) for path in capture.files]
    return ({linktype for piece in pieces for linktype, _ in piece.interfaces},
            next((piece.first_ts_ns for piece in pieces if piece.first_ts_ns is not None), None))
