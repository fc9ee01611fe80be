"""The Gloo matrix: what real PyTorch jobs run so that every operation PyTorch's Gloo backend offers is recorded at
sizes from 1 B to 64 MiB, in several dtypes, at world sizes 2 to 8 (issue 10 item 4). One job per world size
(a job has one); lab/workloads/gloo_matrix_job.py runs a job's cells, lab/record.py records it.

A cell is `{"op", "nominal_bytes", "dtype", ["root"], ["tag"]}` (`plan_cells`):
- every op at every size of SIZES (1 B to 3 MB), one dtype per (op, size) rotating through DTYPES (1 B cells
  in uint8: a 1-byte tensor); barrier and monitored_barrier once per size;
- every op at DTYPE_SWEEP_BYTES in every dtype;
- the large cells of the world size (LARGE_CELLS: 16 MiB and 64 MiB; what 2 cores can capture);
- rooted ops take turns at the root; p2p cells (send/recv, recv from any source, batch_isend_irecv) each have
  their own tag, and two more send/recv share tag 0 (repeated peer and tag).
Sizes follow nccl-tests (all_gather, gather: the output; reduce_scatter, scatter: the input; all_to_all: one
rank's input); the workload cuts them to whole elements and chunks and records what it moved.

The bundled jobs (`BUNDLED`, in pcaps/ and `make pcaps`): 2 and 3 ranks, every cell up to 65 537 B. The full
matrix (`make gloo-matrix`) is ~8 min of recording and ~27 GB of captures: it is not in `make test`.
"""
from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
SIZES = (1, 37, 1000, 65_537, MiB, 3_000_011)
DTYPES = ("float32", "float16", "bfloat16", "int64", "uint8", "float64", "int32", "int8")
DTYPE_SWEEP_BYTES = 65_537
COLLECTIVE_OPS = ("all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather",
                  "all_gather_into_tensor", "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor",
                  "all_to_all", "all_to_all_single", "all_to_all_single_uneven", "gather", "scatter")
BARRIER_OPS = ("barrier", "monitored_barrier")
P2P_OPS = ("send_recv", "recv_any", "batch_p2p")
ALL_OPS = (*COLLECTIVE_OPS, *P2P_OPS)
# One op per distinct wire pattern (the list and coalesced forms run the same Gloo algorithms).
PATTERN_OPS = ("all_reduce", "reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_to_all_single", "gather", "scatter", "send_recv")
# The large cells, by world size: each rank's capture holds ~2-4x the tensor per op, and 2 cores write every
# rank's capture, so 16 MiB for every op only up to 4 ranks and 64 MiB only for a few ops.
LARGE_CELLS = {
    2: {16 * MiB: ALL_OPS, 64 * MiB: PATTERN_OPS},
    3: {16 * MiB: ALL_OPS, 64 * MiB: ("all_reduce", "all_to_all_single")},
    4: {16 * MiB: ALL_OPS, 64 * MiB: ("all_reduce", "reduce_scatter_tensor")},
    5: {16 * MiB: PATTERN_OPS, 64 * MiB: ("broadcast",)},
    6: {16 * MiB: PATTERN_OPS, 64 * MiB: ("all_gather_into_tensor",)},
    7: {16 * MiB: PATTERN_OPS, 64 * MiB: ("reduce",)},
    8: {16 * MiB: PATTERN_OPS, 64 * MiB: ("all_reduce",)},
}
ROOTED_OPS = frozenset({"reduce", "broadcast", "gather", "scatter"})
P2P_FIRST_TAG = 100
# Sending rate of all ranks together (tc tbf on each rank's eth0, split evenly): what the captures of every
# rank, written on 2 cores, keep up with without the kernel dropping packets (800 Mbit/s lost some at k=3, 4
# with 16 MiB cells for every op; unlimited, k=2 lost 7 %).
JOB_RATE_MBIT = 500
JOB_TIMEOUT_S = 900.0


@dataclass(frozen=True, slots=True)
class MatrixJobSpec:
    name: str
    world_size: int
    max_size: int | None = None                         # sizes above it left out (the large cells too)
    large: dict[int, tuple[str, ...]] | None = None     # instead of LARGE_CELLS[world_size]
    rate_mbit: int = JOB_RATE_MBIT
    gzip: bool = True

    def cells(self) -> list[dict]:
        return plan_cells(self.world_size, {} if self.max_size is not None else self.large, self.max_size)


BUNDLED = {spec.name: spec for spec in (MatrixJobSpec("gloo_matrix_k2", 2, max_size=DTYPE_SWEEP_BYTES),
                                        MatrixJobSpec("gloo_matrix_k3", 3, max_size=DTYPE_SWEEP_BYTES))}


def plan_cells(world_size: int, large: dict[int, tuple[str, ...]] | None = None,
               max_size: int | None = None) -> list[dict]:
    """The cells of one job, in the order the ranks run them (sizes above `max_size` left out; `large`: the
    large cells instead of LARGE_CELLS[world_size])."""
    cells: list[dict] = []
    for size_index, size in enumerate(SIZES):
        if max_size is not None and size > max_size:
            continue
        for op_index, op in enumerate(ALL_OPS):
            dtype = "uint8" if size == 1 else DTYPES[(size_index + op_index) % len(DTYPES)]
            cells.append({"op": op, "nominal_bytes": size, "dtype": dtype})
        cells.extend({"op": op, "nominal_bytes": 0, "dtype": "float32"} for op in BARRIER_OPS)
    for op in ALL_OPS:
        cells.extend({"op": op, "nominal_bytes": DTYPE_SWEEP_BYTES, "dtype": dtype} for dtype in DTYPES)
    for size, ops in sorted((LARGE_CELLS.get(world_size, {}) if large is None else large).items()):
        cells.extend({"op": op, "nominal_bytes": size, "dtype": DTYPES[index % 4]} for index, op in enumerate(ops))
    for index, cell in enumerate(cells):
        if cell["op"] in ROOTED_OPS:
            cell["root"] = index % world_size
        if cell["op"] in P2P_OPS:
            cell["tag"] = P2P_FIRST_TAG + index
    # Two p2p cells on the default tag 0: the decoder numbers repeated (peer, tag) operations in order.
    cells.extend({"op": "send_recv", "nominal_bytes": size, "dtype": "float32", "tag": 0} for size in (4096, 40))
    return cells
