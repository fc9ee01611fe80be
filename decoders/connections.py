"""A connection's name, the same in every capture that saw it: how the timeline (decoders.timeline) tells the
observations of one message apart from another connection's, and how the losses (decoders.losses) find the
messages of the streams a capture limit touched."""
from __future__ import annotations

from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc


def _text(column) -> pa.Array:
    """A column of addresses or numbers as text (null stays null); numbers as integers, however they are held
    (a DataFrame holds an integer column with nulls as float)."""
    array = pa.array(column, from_pandas=True) if not isinstance(column, (pa.Array, pa.ChunkedArray)) else column
    if pa.types.is_floating(array.type) or pa.types.is_integer(array.type) or pa.types.is_null(array.type):
        array = pc.cast(array, pa.int64())
    return pc.cast(array, pa.string())


def connection_names(streams: Mapping) -> pa.Array:
    """"src_ip:port>dst_ip:port" of every stream (a TCP direction), "src_ip>dst_ip#qp<n>" of a RoCE queue pair's
    (its destination QP: streams without ports), the same in every capture that saw it; null where an address
    or port it needs is. `streams`: its columns by name (a pyarrow Table, a DataFrame or a dict of lists)."""
    src_ip, src_port, dst_ip, dst_port = (_text(streams[name]) for name in ("src_ip", "src_port", "dst_ip",
                                                                             "dst_port"))
    tcp = pc.binary_join_element_wise(src_ip, ":", src_port, ">", dst_ip, ":", dst_port, "")
    if "dest_qp" not in _names(streams):
        return _array(tcp)
    dest_qp = _text(streams["dest_qp"])
    qp = pc.binary_join_element_wise(src_ip, ">", dst_ip, "#qp", dest_qp, "")
    by_ports = pc.or_(pc.is_valid(src_port), pc.is_null(dest_qp))
    return _array(pc.if_else(by_ports, tcp, qp))


def _names(streams: Mapping) -> list[str]:
    return list(streams.column_names) if isinstance(streams, pa.Table) else list(streams.keys())


def _array(values) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
