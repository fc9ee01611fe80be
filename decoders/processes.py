"""A capture daemon's probe files joined with the decoded tables: which process owned each connection,
and when the program handed each message to libzmq.

- streams gain `pid`, `comm`: the process at the capture's own end of the TCP direction (from the daemon's
  flow attribution: socket tracepoints, accept(), /proc for connections already open);
- messages gain `sender_pid`, `recver_pid`: the processes at both ends, from every daemon directory given
  (each node's daemon knows its own processes);
- messages sent by a probed process gain `api_ts_ns` (when the program called zmq_msg_send for the
  message's first frame) and `send_queue_delay_ns` (from that call to the message's first byte in the
  sender's own capture). libzmq calls and wire messages of one process are paired in order, per
  frame-size signature ([meta, data...]); two messages of the same sizes sent on different sockets in
  the same instant may be paired crosswise, which moves their delays by that instant at most.
An (ip, port) reused by another process during the capture is attributed to its last owner.
"""
from __future__ import annotations

import dataclasses

NULLABLE = {"pid": "Int64", "sender_pid": "Int64", "recver_pid": "Int64", "api_ts_ns": "Int64",
            "send_queue_delay_ns": "Int64"}


def _endpoints(flows):
    """(ip, port) → pid, comm of the process owning that local TCP endpoint."""
    owned = flows[flows["pid"].notna()].sort_values("first_ts_ns", kind="stable")
    return owned.drop_duplicates(["local_ip", "local_port"], keep="last").set_index(
        ["local_ip", "local_port"])[["pid", "comm"]]


def join_processes(dataset, captures):
    """The dataset with the process columns above, for the captures that came from a daemon directory."""
    from dlcsniff.decoders.arrow_without_pandas import pandas
    pd = pandas()
    import pyarrow as pa

    from dlcsniff.decoders.inputs.daemon_dir import load_capture_dir, zmq_messages
    from dlcsniff.decoders.protocols import zmq_carried

    directory_of = {c.name: c.directory for c in captures if c.directory is not None}
    loaded = {d: load_capture_dir(d) for d in sorted(set(directory_of.values()))}
    endpoints = _endpoints(pd.concat([d.flows for d in loaded.values()], ignore_index=True))
    local = {name: set(map(tuple, loaded[d].flows[["local_ip", "local_port"]].itertuples(index=False)))
             for name, d in directory_of.items()}

    streams = dataset.tables["streams"].to_pandas()
    src = list(zip(streams["src_ip"], streams["src_port"]))
    dst = list(zip(streams["dst_ip"], streams["dst_port"]))
    # the capture's own end of each direction: its source if the node sent it, else its destination
    own_end = [s if s in local.get(cap, ()) else d if d in local.get(cap, ()) else None
               for cap, s, d in zip(streams["capture"], src, dst)]
    owner = endpoints.reindex(pd.MultiIndex.from_tuples(
        [e if e is not None else ("", -1) for e in own_end], names=["local_ip", "local_port"]))
    streams_pid = owner["pid"].to_numpy()
    streams_comm = owner["comm"].to_numpy()

    messages = dataset.tables["messages"].to_pandas()
    ends = pd.DataFrame({"flow_id": streams["flow_id"], "src": src, "dst": dst})
    m = messages[["flow_id"]].merge(ends, on="flow_id", how="left")
    pid_of = endpoints["pid"].to_dict()
    sender_pid = m["src"].map(lambda e: pid_of.get(e) if isinstance(e, tuple) else None)
    recver_pid = m["dst"].map(lambda e: pid_of.get(e) if isinstance(e, tuple) else None)

    api_ts = pd.Series(pd.NA, index=messages.index, dtype="Int64")
    for name, directory in directory_of.items():
        sends = zmq_messages(loaded[directory].zmq_events)
        sends = sends[sends["direction"] == "send"]
        if sends.empty:
            continue
        mine = (messages["capture"] == name) & messages["protocol"].isin(zmq_carried())
        wire = messages.loc[mine, ["ts_first_ns", "meta_bytes", "data_sizes"]].assign(sender_pid=sender_pid[mine])
        wire = wire[wire["sender_pid"].notna()]
        signature = [tuple([m, *d]) for m, d in zip(wire["meta_bytes"], wire["data_sizes"])]
        wire = wire.assign(signature=signature, pid=wire["sender_pid"].astype("int64")).sort_values(
            "ts_first_ns", kind="stable")
        wire["n"] = wire.groupby(["pid", "signature"]).cumcount()
        sends = sends.assign(signature=sends["frame_sizes"].map(tuple), pid=sends["pid"].astype("int64"))
        sends["n"] = sends.groupby(["pid", "signature"]).cumcount()
        paired = wire.reset_index().merge(sends[["pid", "signature", "n", "api_ts_ns"]],
                                          on=["pid", "signature", "n"], how="inner").set_index("index")
        api_ts.loc[paired.index] = paired["api_ts_ns"].astype("int64")

    tables = dict(dataset.tables)
    tables["streams"] = _with_columns(tables["streams"], {"pid": streams_pid, "comm": streams_comm}, pa)
    delay = messages["ts_first_ns"].astype("Int64") - api_ts
    tables["messages"] = _with_columns(tables["messages"], {
        "sender_pid": sender_pid, "recver_pid": recver_pid, "api_ts_ns": api_ts, "send_queue_delay_ns": delay}, pa)
    summary = dict(dataset.summary)
    summary["processes"] = {
        "daemon_directories": [str(d) for d in loaded],
        "flows_with_pid": int(pd.Series(streams_pid).notna().sum()),
        "messages_with_api_time": int(api_ts.notna().sum()),
        "warnings": [w for d in loaded.values() for w in d.warnings],
    }
    return dataclasses.replace(dataset, tables=tables, summary=summary)


def _with_columns(table, columns: dict, pa):
    """The table with these columns set (replaced when the schema already has them)."""
    import pandas as pd

    for name, values in columns.items():
        series = pd.Series(values)
        if name in NULLABLE:
            series = pd.to_numeric(series, errors="coerce").astype(NULLABLE[name])
        array = pa.array(series, from_pandas=True, type=pa.int64() if name in NULLABLE else pa.string())
        if name in table.schema.names:
            table = table.set_column(table.schema.get_field_index(name), name, array)
        else:
            table = table.append_column(name, array)
    return table
