"""Decoding captures in forked worker processes, one capture each, with their progress and results sent back
through pipes (length-prefixed pickles)."""
from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import traceback
from typing import Callable

from dlcsniff.decoders.capture_decoder import CaptureResult, decode_capture
from dlcsniff.decoders.inputs.capture_set import CaptureInput, ProgressFn
from dlcsniff.decoders.inputs.selection import PacketSelection

FORK_MIN_BYTES = 8 << 20        # below this, a worker process costs more than it saves
_FRAME = struct.Struct("<I")    # worker -> parent: length-prefixed pickles ("progress", n) / ("result", r)


class _Worker:
    """One forked process decoding one capture; it writes its progress and result to a pipe."""

    def __init__(self, capture: CaptureInput, flow_id_base: int, selection: PacketSelection | None):
        self.path = path = capture.path
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:                     # the child: decode, report, and leave without cleanup
            os.close(read_fd)
            code = 0
            try:
                with os.fdopen(write_fd, "wb") as out:
                    self._run(out, capture, flow_id_base, selection)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        self.pipe = os.fdopen(read_fd, "rb", buffering=0)
        self.buffer = bytearray()
        self.outcome: tuple | None = None

    @staticmethod
    def _run(out, capture: CaptureInput, flow_id_base: int, selection: PacketSelection | None) -> None:
        def send(message: tuple) -> None:
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            out.write(_FRAME.pack(len(data)) + data)
            out.flush()

        signal.signal(signal.SIGINT, signal.SIG_DFL)     # the parent handles ^C, and kills us
        try:
            result = decode_capture(capture, flow_id_base=flow_id_base, progress=lambda n: send(("progress", n)),
                                    selection=selection)
        except Exception as exc:
            try:
                pickle.dumps(exc)
            except Exception:
                exc = RuntimeError(f"decoding {capture.path} failed:\n{traceback.format_exc()}")
            send(("error", exc))
        else:
            send(("result", result))

    def read(self, progress: ProgressFn | None) -> bool:
        """Take what the pipe holds; True once the worker has said its last word (or died)."""
        chunk = self.pipe.read(1 << 20)
        if not chunk:
            if self.outcome is None:
                self.outcome = ("error", RuntimeError(f"the worker decoding {self.path} died"))
            return True
        self.buffer += chunk
        while len(self.buffer) >= _FRAME.size:
            size = _FRAME.unpack_from(self.buffer)[0]
            if len(self.buffer) < _FRAME.size + size:
                break
            message = pickle.loads(self.buffer[_FRAME.size:_FRAME.size + size])
            del self.buffer[:_FRAME.size + size]
            if message[0] == "progress":
                if progress is not None:
                    progress(message[1])
            else:
                self.outcome = message
        return False

    def close(self, kill: bool) -> None:
        if kill:
            os.kill(self.pid, signal.SIGKILL)
        self.pipe.close()
        os.waitpid(self.pid, 0)


def decode_forked(jobs: list[tuple[CaptureInput, int]], sizes: list[int], total: int | None, workers: int,
                  progress_total: Callable[[int | None], ProgressFn] | None,
                  selection: PacketSelection | None = None,
                  meanwhile: Callable[[], None] | None = None) -> list[CaptureResult]:
    """Decode the captures (with their flow id bases), the largest (`sizes`) first; progress_total is
    called with `total` (None: unknown, streams among the captures). `meanwhile` runs in this process once
    the first workers are started (e.g. the imports the caller needs next), while they decode."""
    pending = sorted(range(len(jobs)), key=lambda i: -sizes[i])       # the largest first
    running: dict[int, _Worker] = {}
    outcomes: dict[int, tuple] = {}
    selector = selectors.DefaultSelector()

    def start_next() -> None:
        index = pending.pop(0)
        worker = _Worker(*jobs[index], selection)
        running[index] = worker
        selector.register(worker.pipe, selectors.EVENT_READ, index)

    try:
        for _ in range(min(workers, len(pending))):
            start_next()
        # Forked first: the progress bar's thread and the caller's imports happen while the workers decode.
        progress = progress_total(total) if progress_total else None
        if meanwhile is not None:
            meanwhile()
        while running:
            for key, _ in selector.select():
                index = key.data
                worker = running[index]
                if worker.read(progress):
                    selector.unregister(worker.pipe)
                    worker.close(kill=False)
                    del running[index]
                    outcomes[index] = worker.outcome
                    if outcomes[index][0] == "error":
                        raise outcomes[index][1]
                    if pending:
                        start_next()
    finally:
        for worker in running.values():
            worker.close(kill=True)
        selector.close()
    return [outcomes[i][1] for i in range(len(jobs))]
