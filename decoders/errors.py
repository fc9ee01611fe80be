"""The errors decoders/ raises. Internally one: DecodeError, bytes that do not make sense as the format being
decoded; stream decoders turn it into an event (decoders.sansio) and go on. At the edge: CaptureError, an input
that cannot be decoded at all (the message says why, in one line); ClusterError, the Dask cluster of --engine dask
failing (decoders.dask_cluster raises it; here, so that catching it loads nothing of Dask's)."""
from __future__ import annotations


class DecodeError(Exception):
    """Bytes that do not make sense as the format being decoded."""


class CaptureError(DecodeError):
    """A capture input that cannot be read (missing, not a capture, unsupported link type...)."""


class ClusterError(Exception):
    """The Dask cluster cannot be reached or lost a task's worker (the message says which and why)."""
