"""MLCommons Chakra execution traces of a decoded job, so that ASTRA-sim can replay it.

One file per rank, `<prefix>.<rank>.et` (the schema and framing: analysis.chakra_schema). Ranks are the DLC
ranks of the workers and servers (workers 0..W-1, servers W..W+S-1); the scheduler's control traffic has no
counterpart in the other ranks' traces and is left out. Collective operations (collectives.parquet, when the
decode wrote one) go to the file of their rank.

Nodes of a parameter-server job:
- COMM_SEND_NODE / COMM_RECV_NODE: every push, pull and SimpleApp command message seen at both ends, in its
  sender's and its receiver's file with the same comm_src, comm_dst, comm_tag (one number per message) and
  comm_size (the largest length seen of it: a capture that lost the message's end saw less). A message seen
  at one end only would leave a send or a receive waiting for ever in a replay: it is left out and counted.
- COMP_NODE, worker: the computation between its communications in each training iteration: phase 1 (from
  the worker's last communication before the iteration's first push to that push) and then each gap between
  two successive pushes of the iteration (backward computation producing the next gradients).
- COMP_NODE, server: its processing between the requests an answer depends on and the first answer (the
  update of a key in a sync round, the handling of one push in async mode, the search for a pull).
Dependencies: data_deps are the DLC trace's dependencies (analysis.dlc), the data a COMP node consumes (a
worker's first computation of an iteration needs every value pulled in the previous one; a server's needs
the requests it answers), and the COMP node that produced what a message carries; ctrl_deps chain a
worker's COMP nodes in program order. A dependency on something later in time (the DLC rules assume an
order MXNet does not always keep, e.g. an initial pull answered after the first push) is dropped and counted.

Collectives (rows of collectives.parquet, decoders/schema.py: one per operation of the capture's own rank,
`local_rank`): a COMM_COLL_NODE with comm_type and comm_size (tensor bytes) per collective, send and recv
as COMM_SEND/COMM_RECV (peer from `peers`, comm_tag = seq, the operation's number between that pair); per
rank they form one chain in time order, with a COMP_NODE for each gap of at least a microsecond between the
end of one and the start of the next. A job with both ps-lite and collectives writes rank r's collectives
into the file of DLC rank r.

Times: start_time_micros is the capture's wall clock (Unix µs); duration_micros is set on COMP nodes (a
replay takes communication times from its own network model).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dlcsniff.analysis.chakra_schema import AttributeProto, CollectiveCommType, GlobalMetadata, Node, NodeType, delimited
from dlcsniff.analysis.dlc import dlc_table
from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.load import AnalysisError, Dataset
from dlcsniff.analysis.outputs import claim, label
from dlcsniff.analysis.operations import (
    CATEGORY_CONTROL, CATEGORY_DATA, INIT_ITERATION, NO_ITERATION, ROLE_SERVER, ROLE_WORKER, SLOT_PULL_RESPONSE,
    SLOT_PUSH_REQUEST, SLOT_PUSH_RESPONSE, Trace, build_records,
)

CHAKRA_VERSION = "1.0.0"           # the schema release the field numbers were checked against
COLLECTIVE_COLUMNS = ("local_rank", "kind", "seq", "ts_first_ns", "ts_last_ns", "tensor_bytes", "peers")
COLLECTIVE_KINDS = {
    "all_reduce": CollectiveCommType.ALL_REDUCE, "reduce": CollectiveCommType.REDUCE,
    "all_gather": CollectiveCommType.ALL_GATHER, "gather": CollectiveCommType.GATHER,
    "scatter": CollectiveCommType.SCATTER, "broadcast": CollectiveCommType.BROADCAST,
    "all_to_all": CollectiveCommType.ALL_TO_ALL, "reduce_scatter": CollectiveCommType.REDUCE_SCATTER,
    "barrier": CollectiveCommType.BARRIER,
}
POINT_TO_POINT = {"send": NodeType.COMM_SEND_NODE, "recv": NodeType.COMM_RECV_NODE}
MIN_COMPUTE_NS = 1000              # shorter gaps have no duration in Chakra's microseconds
NONE = -1

# What each of the export's losses counts, and why it was left out (export --json's losses_explained)
CHAKRA_LOSSES = {
    "records_without_other_end": "send or receive records of messages only one end's capture saw: left out, as a "
                                 "replay would wait for ever for the other end",
    "dependencies_on_records_not_exported": "DLC trace dependencies on records left out (above, or control "
                                            "traffic): dropped with them",
    "dependencies_against_time_dropped": "dependencies on a node that comes later in its rank's time than the "
                                         "node depending on it (a DLC rule the capture contradicts: MXNet may "
                                         "answer a tensor's initial pull after the first push, and after the "
                                         "computation before that push began): dropped, as a replay would wait "
                                         "for ever",
    "collectives_of_unknown_kind": "collective operations whose kind Chakra has no type for: left out",
    "collectives_of_unknown_rank": "collective operations whose capture's rank the decode could not name: "
                                   "left out",
}

# One row per Chakra node (before ids are given); `ref` names it in the edge table.
NODE_COLUMNS = ("ref", "rank", "start_ns", "duration_ns", "node_type", "name", "comm_src", "comm_dst", "comm_tag",
                "comm_size", "comm_type", "tensor_key", "iteration")


@dataclass(frozen=True, slots=True)
class ChakraFile:
    path: Path
    rank: int
    node: str
    nodes: int
    comm_nodes: int
    comp_nodes: int
    coll_nodes: int


@dataclass(frozen=True, slots=True)
class ChakraExport:
    prefix: Path                   # what ASTRA-sim's workload option takes: <dir>/<name>
    files: list[ChakraFile]
    losses: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ChakraGraph:
    nodes: pd.DataFrame            # NODE_COLUMNS
    edges: pd.DataFrame            # child, parent (refs), data (data_deps, else ctrl_deps), child_id, parent_id
    rank_names: dict[int, str]
    losses: dict[str, int]


def _nodes(**columns) -> pd.DataFrame:
    n = len(columns["ref"])
    defaults = {"duration_ns": 0, "comm_src": NONE, "comm_dst": NONE, "comm_tag": NONE, "comm_size": NONE,
                "comm_type": NONE, "tensor_key": NONE, "iteration": NO_ITERATION}
    return pd.DataFrame({name: np.asarray(columns[name]) if name in columns else np.full(n, defaults[name])
                         for name in NODE_COLUMNS})


def _edges(child, parent, data: bool) -> pd.DataFrame:
    child = np.asarray(child, dtype=np.int64)
    return pd.DataFrame({"child": child, "parent": np.asarray(parent, dtype=np.int64),
                         "data": np.full(len(child), data)})


def _paired_messages(comm: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The records of messages seen at both ends, each with the message's comm_src, comm_dst, comm_tag and
    comm_size; and how many records were left without their other end."""
    src = np.where(comm["is_send"], comm["dlc_rank"], comm["peer_dlc_rank"])
    dst = np.where(comm["is_send"], comm["peer_dlc_rank"], comm["dlc_rank"])
    frame = comm.assign(comm_src=src, comm_dst=dst).sort_values("ts_ns", kind="stable")
    # both ends agree on who sent what with which ps-lite timestamp; should one repeat, the k-th such
    # message at one end is the k-th at the other
    identity = ["comm_src", "comm_dst", "category", "slot", "ps_timestamp"]
    frame["occurrence"] = frame.groupby(identity + ["is_send"]).cumcount()
    message = identity + ["occurrence"]
    ends = frame.groupby(message)["is_send"].agg(["sum", "size"])
    paired = ends[(ends["sum"] == 1) & (ends["size"] == 2)].reset_index()[message]
    paired["comm_tag"] = np.arange(len(paired), dtype=np.int64)
    frame = frame.merge(paired, on=message)
    frame["comm_size"] = frame.groupby("comm_tag")["length"].transform("max")
    return frame, int(len(comm) - len(frame))


def _explode_dependencies(table: pd.DataFrame) -> pd.DataFrame:
    """(child record, parent record) for every op_id in the DLC trace's IDdep column."""
    ids = table[["node_id", "record_id", "OP_ID"]][table["OP_ID"] != "NA"]
    deps = table[["node_id", "record_id", "IDdep"]][table["IDdep"] != "-1"]
    deps = deps.assign(OP_ID=deps["IDdep"].str.strip("()").str.split(",")).explode("OP_ID")
    found = deps.merge(ids.rename(columns={"record_id": "parent_record"}), on=["node_id", "OP_ID"])
    return found[["node_id", "record_id", "parent_record", "IDdep"]]


def _pslite_graph(trace: Trace, first_ref: int) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    records = trace.records
    table = dlc_table(trace).rename(columns={"ID": "record_id"})
    records = records.merge(table[["node_id", "record_id", "OP_ID", "IDdep"]], on=["node_id", "record_id"])
    kv = records["node_role"].isin([ROLE_WORKER, ROLE_SERVER]) & (records["category"] != CATEGORY_CONTROL)
    comm, unpaired = _paired_messages(records[kv.to_numpy()])
    comm = comm.sort_values(["node_id", "record_id"], ignore_index=True)
    comm["ref"] = first_ref + np.arange(len(comm))
    ref_of = comm.set_index(["node_id", "record_id"])["ref"]
    data = (comm["category"] == CATEGORY_DATA).to_numpy()
    comm_nodes = _nodes(
        ref=comm["ref"], rank=comm["dlc_rank"], start_ns=comm["ts_ns"],
        node_type=np.where(comm["is_send"], NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE),
        name=comm["operation"].astype(str) + " " + comm["OP_ID"], comm_src=comm["comm_src"],
        comm_dst=comm["comm_dst"], comm_tag=comm["comm_tag"], comm_size=comm["comm_size"],
        tensor_key=np.where(data, comm["tensor_key"], NONE),
        iteration=np.where(data & (comm["iteration"] >= INIT_ITERATION), comm["iteration"], NO_ITERATION))

    dependencies = _explode_dependencies(table)
    key = pd.MultiIndex.from_frame(dependencies[["node_id", "record_id"]])
    parent_key = pd.MultiIndex.from_arrays([dependencies["node_id"], dependencies["parent_record"]])
    dependencies["child"] = ref_of.reindex(key).to_numpy()
    dependencies["parent"] = ref_of.reindex(parent_key).to_numpy()
    exported = dependencies["child"].notna().to_numpy() & dependencies["parent"].notna().to_numpy()
    dependencies = dependencies[exported]
    edges = [_edges(dependencies["child"], dependencies["parent"], True)]

    next_ref = first_ref + len(comm)
    worker_nodes, worker_edges = _worker_computation(comm, next_ref)
    next_ref += len(worker_nodes)
    server_nodes, server_edges = _server_computation(comm, dependencies, next_ref)
    losses = {"records_without_other_end": unpaired, "dependencies_on_records_not_exported": int((~exported).sum())}
    return (pd.concat([comm_nodes, worker_nodes, server_nodes], ignore_index=True),
            pd.concat(edges + worker_edges + server_edges, ignore_index=True), losses)


def _worker_computation(comm: pd.DataFrame, first_ref: int) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """COMP nodes of the workers: per training iteration, phase 1 and the gaps between successive pushes."""
    worker = comm[(comm["node_role"] == ROLE_WORKER).to_numpy()]
    pushes = worker[(worker["is_send"] & (worker["category"] == CATEGORY_DATA) & (worker["slot"] == SLOT_PUSH_REQUEST)
                     & (worker["iteration"] >= 0)).to_numpy()]
    ends = pushes[["node_id", "dlc_rank", "iteration", "ts_ns"]].drop_duplicates().sort_values(
        ["node_id", "iteration", "ts_ns"], ignore_index=True)
    previous_push = ends.groupby(["node_id", "iteration"])["ts_ns"].shift(1, fill_value=NONE).to_numpy()
    first = previous_push == NONE
    # phase 1 starts at the worker's last communication before the iteration's first push
    communications = worker[["node_id", "ts_ns"]].sort_values("ts_ns")
    communications = communications.assign(communication_ns=communications["ts_ns"].astype("Int64"))
    latest = pd.merge_asof(ends.reset_index().sort_values("ts_ns"), communications, on="ts_ns", by="node_id",
                           allow_exact_matches=False)
    latest = latest.set_index("index")["communication_ns"].reindex(ends.index).fillna(NONE).to_numpy(np.int64)
    ends["start_ns"] = np.where(first, latest, previous_push)
    gaps = ends[((ends["start_ns"] != NONE) & (ends["ts_ns"] - ends["start_ns"] >= MIN_COMPUTE_NS)).to_numpy()].copy()
    gaps["phase1"] = first[gaps.index]
    gaps = gaps.sort_values(["node_id", "start_ns"], ignore_index=True)
    gaps["ref"] = first_ref + np.arange(len(gaps))
    step = gaps.groupby(["node_id", "iteration"]).cumcount().to_numpy()
    nodes = _nodes(ref=gaps["ref"], rank=gaps["dlc_rank"], start_ns=gaps["start_ns"],
                   duration_ns=gaps["ts_ns"] - gaps["start_ns"], node_type=np.full(len(gaps), NodeType.COMP_NODE),
                   name="Compute_Worker iteration " + gaps["iteration"].astype(str) + " step " + step.astype(str)
                   + np.where(gaps["phase1"], " (phase 1)", ""),
                   iteration=gaps["iteration"])

    same_worker = gaps["node_id"].to_numpy()[1:] == gaps["node_id"].to_numpy()[:-1]
    chain = _edges(gaps["ref"].to_numpy()[1:][same_worker], gaps["ref"].to_numpy()[:-1][same_worker], False)
    pulls = worker[(~worker["is_send"] & (worker["category"] == CATEGORY_DATA)
                    & (worker["slot"] == SLOT_PULL_RESPONSE)).to_numpy()]
    phase1 = gaps[gaps["phase1"].to_numpy()].assign(pulled_in=lambda g: g["iteration"] - 1)
    needs = phase1[["node_id", "pulled_in", "ref"]].merge(
        pulls[["node_id", "iteration", "ref"]].rename(columns={"iteration": "pulled_in", "ref": "pull"}),
        on=["node_id", "pulled_in"])
    # each push carries what the latest computation before it produced
    produced = pd.merge_asof(pushes[["node_id", "ts_ns", "ref"]].sort_values("ts_ns"),
                             gaps.assign(end_ns=gaps["ts_ns"])[["node_id", "end_ns", "ref"]].rename(
                                 columns={"ref": "computation"}).sort_values("end_ns"),
                             left_on="ts_ns", right_on="end_ns", by="node_id").dropna(subset=["computation"])
    return nodes, [chain, _edges(needs["ref"], needs["pull"], True),
                   _edges(produced["ref"], produced["computation"], True)]


def _server_computation(comm: pd.DataFrame, dependencies: pd.DataFrame,
                        first_ref: int) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """COMP nodes of the servers: from the latest request an answer depends on to the first such answer."""
    answers = comm["ref"][((comm["node_role"] == ROLE_SERVER) & comm["is_send"]).to_numpy()]
    ts_of = comm.set_index("ref")["ts_ns"]
    links = dependencies[dependencies["child"].isin(answers).to_numpy()].astype({"child": np.int64,
                                                                                  "parent": np.int64})
    links = links.assign(child_ts=ts_of.reindex(links["child"]).to_numpy(),
                         parent_ts=ts_of.reindex(links["parent"]).to_numpy())
    # answers sharing one set of requests (a sync round's answers to every worker) share one computation
    per = links.sort_values("child_ts", kind="stable").groupby(["node_id", "IDdep"]).agg(
        start_ns=("parent_ts", "max"), end_ns=("child_ts", "min"), first_answer=("child", "first"))
    per = per[(per["end_ns"] - per["start_ns"] >= MIN_COMPUTE_NS).to_numpy()].reset_index()
    per["ref"] = first_ref + np.arange(len(per))
    answer = comm.set_index("ref").loc[per["first_answer"]]
    update = ((answer["slot"] == SLOT_PUSH_RESPONSE) | answer["fused"]).to_numpy()
    nodes = _nodes(ref=per["ref"], rank=answer["dlc_rank"], start_ns=per["start_ns"],
                   duration_ns=per["end_ns"] - per["start_ns"], node_type=np.full(len(per), NodeType.COMP_NODE),
                   name=np.where(update, "Update_Server ", "Search_Server ") + per["IDdep"].to_numpy(object),
                   tensor_key=answer["tensor_key"], iteration=answer["iteration"])
    inputs = links.merge(per[["node_id", "IDdep", "ref"]], on=["node_id", "IDdep"])
    requests = inputs.drop_duplicates(["ref", "parent"])
    consumers = inputs.drop_duplicates(["ref", "child"])
    return nodes, [_edges(requests["ref"], requests["parent"], True),
                   _edges(consumers["child"], consumers["ref"], True)]


def _collective_graph(collectives: pd.DataFrame, first_ref: int) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """COMM_COLL (and p2p) nodes per rank in time order, chained through the computation gaps between them."""
    known = collectives["kind"].isin(list(COLLECTIVE_KINDS) + list(POINT_TO_POINT)).to_numpy()
    ranked = collectives["local_rank"].notna().to_numpy()
    ops = collectives[known & ranked].rename(columns={"local_rank": "rank"}).astype({"rank": np.int64})
    ops = ops.sort_values(["rank", "ts_first_ns"], ignore_index=True)
    ops["ref"] = first_ref + np.arange(len(ops))
    kind = ops["kind"].to_numpy(object)
    p2p = np.isin(kind, list(POINT_TO_POINT))
    peer = ops["peers"].map(lambda peers: int(peers[0]) if peers is not None and len(peers) else NONE).to_numpy()
    send = kind == "send"
    op_nodes = _nodes(
        ref=ops["ref"], rank=ops["rank"], start_ns=ops["ts_first_ns"],
        node_type=np.array([POINT_TO_POINT.get(k, NodeType.COMM_COLL_NODE) for k in kind]),
        name=ops["kind"] + " " + ops["seq"].astype(str), comm_size=ops["tensor_bytes"],
        comm_type=np.array([COLLECTIVE_KINDS.get(k, NONE) for k in kind]),
        comm_src=np.where(p2p, np.where(send, ops["rank"], peer), NONE),
        comm_dst=np.where(p2p, np.where(send, peer, ops["rank"]), NONE),
        comm_tag=np.where(p2p, ops["seq"], NONE))

    same_rank = ops["rank"].to_numpy()[1:] == ops["rank"].to_numpy()[:-1]
    gap_start = ops["ts_last_ns"].to_numpy()[:-1]
    gap_end = ops["ts_first_ns"].to_numpy()[1:]
    computes = same_rank & (gap_end - gap_start >= MIN_COMPUTE_NS)
    before, after = ops["ref"].to_numpy()[:-1], ops["ref"].to_numpy()[1:]
    comp_refs = first_ref + len(ops) + np.arange(int(computes.sum()))
    comp_nodes = _nodes(ref=comp_refs, rank=ops["rank"].to_numpy()[1:][computes], start_ns=gap_start[computes],
                        duration_ns=(gap_end - gap_start)[computes], node_type=np.full(len(comp_refs),
                                                                                       NodeType.COMP_NODE),
                        name=[f"Compute before {k} {seq}" for k, seq in
                              zip(kind[1:][computes], ops["seq"].to_numpy()[1:][computes])])
    direct = same_rank & ~computes
    edges = pd.concat([_edges(after[direct], before[direct], True), _edges(comp_refs, before[computes], True),
                       _edges(after[computes], comp_refs, True)], ignore_index=True)
    return (pd.concat([op_nodes, comp_nodes], ignore_index=True), edges,
            {"collectives_of_unknown_kind": int((~known).sum()),
             "collectives_of_unknown_rank": int((known & ~ranked).sum())})


def chakra_graph(trace: Trace | None, collectives: pd.DataFrame | None) -> ChakraGraph:
    """The Chakra nodes and dependencies of a job: its ps-lite trace, its collectives, or both."""
    parts, edges, losses, rank_names = [], [], {}, {}
    if trace is not None:
        nodes, found, lost = _pslite_graph(trace, 0)
        parts.append(nodes)
        edges.append(found)
        losses.update(lost)
        kv = trace.nodes[trace.nodes["role"].isin(["worker", "server"])]
        rank_names.update(zip(kv["dlc_rank"].astype(int), kv["name"]))
    if collectives is not None and len(collectives):
        nodes, found, lost = _collective_graph(collectives, sum(len(p) for p in parts))
        parts.append(nodes)
        edges.append(found)
        losses.update(lost)
        rank_names.update({int(r): rank_names.get(int(r), f"rank{int(r)}") for r in nodes["rank"].unique()})
    if not parts or not sum(len(p) for p in parts):
        raise AnalysisError("nothing to export: no ps-lite message seen at both ends and no collective")
    nodes = pd.concat(parts, ignore_index=True)
    # ids per rank in time order; at one instant, communications before a computation starting there (it may
    # depend on them)
    nodes["computation"] = nodes["node_type"] == NodeType.COMP_NODE
    nodes = nodes.sort_values(["rank", "start_ns", "computation", "ref"], ignore_index=True).drop(
        columns="computation")
    nodes.insert(0, "id", nodes.groupby("rank").cumcount())
    edges = pd.concat(edges, ignore_index=True).drop_duplicates()
    position = nodes.set_index("ref")["id"]
    edges["child_id"] = position.reindex(edges["child"]).to_numpy()
    edges["parent_id"] = position.reindex(edges["parent"]).to_numpy()
    forward = edges["parent_id"].to_numpy() >= edges["child_id"].to_numpy()
    losses["dependencies_against_time_dropped"] = int(forward.sum())
    return ChakraGraph(nodes=nodes, edges=edges[~forward], rank_names=rank_names, losses=losses)


def _attributes(row) -> list:
    attributes = [AttributeProto(name="is_cpu_op", bool_val=False)]
    if row.node_type == NodeType.COMM_COLL_NODE:
        attributes.append(AttributeProto(name="comm_type", int64_val=int(row.comm_type)))
    if row.node_type != NodeType.COMP_NODE:
        attributes.append(AttributeProto(name="comm_size", int64_val=int(row.comm_size)))
    if row.node_type in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
        attributes += [AttributeProto(name="comm_src", int32_val=int(row.comm_src)),
                       AttributeProto(name="comm_dst", int32_val=int(row.comm_dst)),
                       AttributeProto(name="comm_tag", int32_val=int(row.comm_tag))]
    if row.tensor_key != NONE:
        attributes.append(AttributeProto(name="tensor_key", int64_val=int(row.tensor_key)))
    if row.iteration != NO_ITERATION:
        attributes.append(AttributeProto(name="iteration", int64_val=int(row.iteration)))
    return attributes


def write_chakra(graph: ChakraGraph, out_dir: str | Path, name: str, source: str) -> ChakraExport:
    """Write `<out_dir>/<name>.<rank>.et` for every rank of the graph."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnalysisError(f"cannot create {out_dir}: {exc.strerror or exc}") from exc
    deps = {data: graph.edges[graph.edges["data"] == data].groupby("child")["parent_id"].agg(
        lambda ids: sorted(int(i) for i in ids)) for data in (True, False)}
    world = len(graph.rank_names)
    files = []
    for rank, nodes in graph.nodes.groupby("rank"):
        rank, node_name = int(rank), graph.rank_names[int(rank)]
        metadata = GlobalMetadata(version=CHAKRA_VERSION, attr=[
            AttributeProto(name="producer", string_val="dlcsniff"), AttributeProto(name="source", string_val=source),
            AttributeProto(name="rank", uint64_val=rank), AttributeProto(name="node", string_val=node_name),
            AttributeProto(name="world_size", uint64_val=world),
            AttributeProto(name="start_time", string_val="Unix epoch microseconds, as captured"),
        ])
        path = out_dir / f"{name}.{rank}.et"
        chunks = [delimited(metadata)]
        for row in nodes.itertuples(index=False):
            chunks.append(delimited(Node(
                id=row.id, name=row.name, type=int(row.node_type),
                ctrl_deps=deps[False].get(row.ref, ()), data_deps=deps[True].get(row.ref, ()),
                start_time_micros=int(row.start_ns) // 1000, duration_micros=round(int(row.duration_ns) / 1000),
                attr=_attributes(row))))
        try:
            path.write_bytes(b"".join(chunks))
        except OSError as exc:
            raise AnalysisError(f"cannot write {path}: {exc.strerror or exc}") from exc
        types = nodes["node_type"].to_numpy()
        files.append(ChakraFile(
            path=path, rank=rank, node=node_name, nodes=len(nodes),
            comm_nodes=int(np.isin(types, [NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE]).sum()),
            comp_nodes=int((types == NodeType.COMP_NODE).sum()),
            coll_nodes=int((types == NodeType.COMM_COLL_NODE).sum())))
    return ChakraExport(prefix=out_dir / name, files=files, losses=dict(graph.losses))


def _pslite_part(dataset: Dataset) -> Dataset | None:
    """The ps-lite messages of the dataset (rows of other protocols have no ps-lite flavor), if any."""
    messages = dataset.messages[dataset.messages["flavor"].notna().to_numpy()]
    return Dataset(messages=messages, nodes=dataset.nodes, source=dataset.source) if len(messages) else None


def write_chakra_traces(job: JobModel, out_dir: str | Path, *, force: bool = False) -> ChakraExport:
    """`dlcsniff export --format chakra`: `<out_dir>/<job>.<rank>.et` per rank, <job> the decode directory's name
    (and manifest.json)."""
    out_dir = claim(out_dir, job.path, kind="chakra", force=force)
    pslite = _pslite_part(job.pslite)
    trace = build_records(pslite) if pslite is not None else None
    # the operations as decoded, each on its capture's clock
    collectives = job.table("collectives", COLLECTIVE_COLUMNS) if job.has_table("collectives") else None
    name = job.path.resolve().name or "job"
    written = write_chakra(chakra_graph(trace, collectives), out_dir, name, source=job.source)
    label(out_dir, "chakra", job, [file.path for file in written.files])
    return written


