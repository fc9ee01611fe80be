"""The sha256 of an input, computed on a thread of its own while decoding goes on.

hashlib lets go of the GIL on large buffers, so on a second core hashing costs the decode no time: a 1 GB
capture took 0.7 s of hashing in line. The reader hands over views of its own buffers, in order; a view is
held until it is hashed, which keeps the reader from reusing that buffer (decoders.inputs.capture_file reuses
only buffers nothing has a view of, and waits for the hash, `wait()`, before it would take a new one).
"""
from __future__ import annotations

import hashlib
import queue
import threading

WAITING_CHUNKS = 4


class BackgroundDigest:
    """sha256 of the bytes given to `update`, in order. `hexdigest()` waits for every chunk, then ends the
    thread; `close()` ends it without a digest. The thread starts with the first chunk."""

    def __init__(self):
        self._digest = hashlib.sha256()
        self._chunks: queue.Queue = queue.Queue(WAITING_CHUNKS)
        self._thread: threading.Thread | None = None

    def update(self, data: bytes | memoryview) -> None:
        """Hash `data` (its bytes must not change until hashed: a view is released once hashed)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._hash, name="dlcsniff-sha256", daemon=True)
            self._thread.start()
        self._chunks.put(data)

    def _hash(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            self._digest.update(chunk)
            if isinstance(chunk, memoryview):
                chunk.release()
            self._chunks.task_done()
        self._chunks.task_done()

    def wait(self) -> None:
        """Return once every chunk given so far is hashed (and its view released)."""
        if self._thread is not None:
            self._chunks.join()

    def _join(self) -> None:
        if self._thread is not None:
            self._chunks.put(None)
            self._thread.join()
            self._thread = None

    def hexdigest(self) -> str:
        self._join()
        return self._digest.hexdigest()

    def close(self) -> None:
        self._join()
