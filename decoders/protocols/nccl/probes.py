"""libnccl's API as the capture daemon's uprobes see it (sniffer/probes/*.c): the functions probed, by the id
the BPF program writes, and the enums of their arguments. The probe records' layouts stay in
decoders.formats.probe_events, which reads these to name a call's function, type and operation.

nccl.h: ncclDataType_t and ncclRedOp_t (2.x numbering, unchanged since 2.0 but for the float8 types of 2.19).
"""
from __future__ import annotations

# Index = the function id the BPF program writes (NCCL_FN_* there).
FUNCTIONS = ("ncclAllReduce", "ncclBroadcast", "ncclBcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter",
             "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd")
COMM_INIT_FUNCTIONS = ("ncclCommInitRank", "ncclCommInitRankConfig")
# ncclDataType_t -> (name, bytes per element)
DATATYPES = {0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
             6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8e4m3", 1),
             11: ("float8e5m2", 1)}
REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}


def function_defines() -> dict[str, int]:
    """The -D values naming the probed functions' ids in the BPF programs (NCCL_FN_ALLREDUCE...)."""
    return {f"NCCL_FN_{name.removeprefix('nccl').upper()}": index for index, name in enumerate(FUNCTIONS)}
