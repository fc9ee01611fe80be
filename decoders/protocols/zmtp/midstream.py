"""A TCP direction caught mid-connection, read as plain ZMTP: no greeting, and no ps-lite meta to vouch for
the frames (decoders.protocols.pslite.decoder reads such a direction for ps-lite at the same time, and that reading
wins when it finds ps-lite).

`MidstreamZmtp` feeds the direction's bytes to a `ZmtpDecoder(midstream=True)` without a frame validator: the
decoder's own resynchronisation (decoders.protocols.zmtp._ZmtpScanner) finds the frame boundaries, and its
messages and commands are kept, not emitted, until the capture ends. A stretch from one boundary to the next
loss of framing is a run; the direction's ZMTP begins with the first run of at least MIDSTREAM_RUN_FRAMES frames
with a body, MIDSTREAM_RUN_MESSAGES of them whole messages, that ends where the direction ends or where the
capture lost bytes (a boundary found by chance inside a large body ends in bytes that are no frame header; the
true ones go on); its bytes before that run are lost (`events`, `lost_bytes`). Why that run rules out chance:
on bytes that are no ZMTP, a frame header is plausible where its flags byte is a short data frame's (0x00 or
0x01; the LONG form needs a size of at most 2^32 in 8 bytes, a command a known name), at most 1 time in 128,
and each header's place is fixed by the size before it, so 16 chained headers happen at most once in 2^112
starting bytes. Bytes of little variety (arrays of small integers: "01 00" reads as an empty MORE frame, "00 01
00" as a 1-byte message) chain far more often, which is why only frames with a body count, whole messages are
needed, and a frame larger than any the resynchronisation believes (2^32 bytes) undoes a run: with 8 frames and
2 messages, a few in a hundred such arrays passed (tests/decoders/test_zmtp_midstream.py has them), with 16 and 4
none of 400. The caller decides with it whether the direction is ZMTP: only where another connection to the same
address and port opened with a ZMTP greeting in the same capture.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dlcsniff.decoders.protocols.zmtp.decoder import RESYNC_MAX_FRAME_BYTES, Command, Message, ZmtpDecoder
from dlcsniff.decoders.sansio import NEED_DATA, Resync

MIDSTREAM_RUN_FRAMES = 16    # frames with a body, chained, that make a boundary found mid-stream believable
MIDSTREAM_RUN_MESSAGES = 4   # whole messages among them (ended by a frame without MORE, none touched by a gap)


def _keep_nothing(frame_index: int, size_bytes: int) -> bool:
    return False


@dataclass(slots=True)
class _Run:
    """From one frame boundary the resynchronisation found to the next loss of framing."""
    offset: int                      # where it begins in the direction's captured bytes
    lost_before: int                 # bytes the decoder had given up on when it began
    after_gap: bool                  # it began after a hole took the framing (so the run before it ended well)
    frames: int = 0                  # frames with a body
    messages: int = 0                # whole messages with a body
    implausible: bool = False        # a frame larger than any the resynchronisation believes
    events: list = field(default_factory=list)    # its Message and Command events


class MidstreamZmtp:
    """One direction's plain-ZMTP reading (module doc); fed like a ZmtpDecoder, judged at the capture's end."""

    __slots__ = ("zmtp", "_runs", "_lost")

    def __init__(self) -> None:
        self.zmtp = ZmtpDecoder(keep_body=_keep_nothing, midstream=True)
        self._runs: list[_Run] = []
        self._lost = 0                   # bytes lost at the resynchronisations so far

    def drain(self) -> None:
        """Take what the decoder has decoded into the runs."""
        while (ev := self.zmtp.next_event()) is not NEED_DATA:
            if isinstance(ev, Resync):
                self._lost += ev.lost_bytes
                # zmtp.py's reasons: "gap in ..." where a hole took the framing, else what was wrong
                self._runs.append(_Run(ev.offset, self._lost, ev.reason.startswith("gap")))
            elif isinstance(ev, (Message, Command)) and self._runs:
                run = self._runs[-1]
                sizes = ev.frame_sizes if isinstance(ev, Message) else (ev.size_bytes,)
                run.frames += sum(1 for size in sizes if size)
                run.messages += isinstance(ev, Message) and ev.complete and any(sizes)
                # a size the resynchronisation would not believe: the run is read into bytes that are no frames
                run.implausible |= any(size > RESYNC_MAX_FRAME_BYTES for size in sizes)
                run.events.append(ev)

    def _first_believed(self) -> int | None:
        """The first run long enough that ends where the direction does or where a hole took the framing (the
        next run began after a gap), not in bytes that are no frame header (module doc)."""
        runs = self._runs
        return next((i for i, run in enumerate(runs) if run.frames >= MIDSTREAM_RUN_FRAMES
                     and run.messages >= MIDSTREAM_RUN_MESSAGES and not run.implausible
                     and (i + 1 == len(runs) or runs[i + 1].after_gap)), None)

    @property
    def believed(self) -> bool:
        """Whether a run long enough to rule out chance was found."""
        return self._first_believed() is not None

    def events(self) -> list:
        """The Message and Command events from the first believed run on."""
        first = self._first_believed()
        return [] if first is None else [ev for run in self._runs[first:] for ev in run.events]

    @property
    def lost_bytes(self) -> int:
        """The direction's bytes not read as ZMTP: those before the first believed run, and those its decoder
        lost after it."""
        first = self._runs[self._first_believed()]
        return first.offset + self.zmtp.lost_bytes - first.lost_before

    @property
    def resyncs(self) -> int:
        return len(self._runs) - self._first_believed()
