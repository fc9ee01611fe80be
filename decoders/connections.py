"""A connection's name, the same in every capture that saw it: how the timeline (decoders.timeline) tells the
observations of one message apart from another connection's, and how the losses (decoders.losses) find the
messages of the streams a capture limit touched."""
from __future__ import annotations

from typing import Mapping

import pyarrow as pa


def _text(column) -> list[str | None]:
    """A column of addresses or numbers as text (None stays None); numbers as integers, however they are held
    (a DataFrame holds an integer column with nulls as float)."""
    array = pa.array(column, from_pandas=True) if not isinstance(column, (pa.Array, pa.ChunkedArray)) else column
    numbers = pa.types.is_floating(array.type) or pa.types.is_integer(array.type)
    return [None if value is None else str(int(value)) if numbers else str(value) for value in array.to_pylist()]


def connection_names(streams: Mapping) -> pa.Array:
    """"src_ip:port>dst_ip:port" of every stream (a TCP direction), "src_ip>dst_ip#qp<n>" of a RoCE queue pair's
    (its destination QP: streams without ports), the same in every capture that saw it; null where an address
    or port it needs is. `streams`: its columns by name (a pyarrow Table, a DataFrame or a dict of lists)."""
    src_ip, src_port, dst_ip, dst_port = (_text(streams[name]) for name in ("src_ip", "src_port", "dst_ip",
                                                                             "dst_port"))
    dest_qp = _text(streams["dest_qp"]) if "dest_qp" in _names(streams) else [None] * len(src_ip)
    names = [(f"{src}:{sport}>{dst}:{dport}" if None not in (src, sport, dst, dport) else None)
             if sport is not None or qp is None else (f"{src}>{dst}#qp{qp}" if None not in (src, dst) else None)
             for src, sport, dst, dport, qp in zip(src_ip, src_port, dst_ip, dst_port, dest_qp)]
    return pa.array(names, pa.string())


def _names(streams: Mapping) -> list[str]:
    return list(streams.column_names) if isinstance(streams, pa.Table) else list(streams.keys())
