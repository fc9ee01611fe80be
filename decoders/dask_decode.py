"""Decoding on a Dask cluster (decoders.dask_cluster): one task per capture, the job-wide tables built where
the caller is.

`decode_paths_dask` is `decoders.job.decode_paths` with the captures decoded as Dask tasks instead of forked
processes: each task is `decode_capture(path, flow_id_base=index << FLOW_ID_CAPTURE_SHIFT)`, and the gathered
results go through the same `finish_job`, so both engines give the same tables by construction.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Iterable

from dlcsniff.decoders.capture_decoder import decode_capture
from dlcsniff.decoders.dask_cluster import cluster_failures, dask_client, worker_path
from dlcsniff.decoders.errors import CaptureError
from dlcsniff.decoders.inputs.capture_set import ProgressFn
from dlcsniff.decoders.inputs.selection import PacketSelection
from dlcsniff.decoders.job import FLOW_ID_CAPTURE_SHIFT, DecodedJob, finish_job, prepare_inputs


def decode_paths_dask(inputs: Iterable[Path], *, scheduler: str | None = None, workers: int | None = None,
                      progress_total: Callable[[int], ProgressFn] | None = None,
                      selection: PacketSelection | None = None) -> DecodedJob:
    """Decode captures (files or directories of them) of one job into one dataset, one Dask task per capture
    (the largest first); progress advances by a capture's size as its task finishes."""
    from distributed import as_completed

    paths, selection = prepare_inputs(inputs, selection)
    streams = [str(capture.path) for capture in paths if capture.stream]
    if streams:
        raise CaptureError(f"{streams[0]}: a stream cannot be handed to Dask workers; decode it with --engine pandas")
    sizes = [capture.size_bytes for capture in paths]
    with dask_client(scheduler, workers, tasks=len(paths)) as client, cluster_failures():
        progress = progress_total(sum(sizes)) if progress_total else None
        # pure=False: a key of its own per call, never another client's result on a shared cluster
        futures = [client.submit(decode_capture, path.with_files(worker_path(f, scheduler) for f in path.files),
                                 flow_id_base=index << FLOW_ID_CAPTURE_SHIFT, selection=selection, priority=size,
                                 pure=False)
                   for index, (path, size) in enumerate(zip(paths, sizes))]
        index_of = {future.key: index for index, future in enumerate(futures)}
        results = [None] * len(paths)
        for future in as_completed(futures, loop=client.loop):
            index = index_of[future.key]
            # the dataset names the captures as the caller did, whatever the workers were told
            results[index] = dataclasses.replace(future.result(), path=str(paths[index].path))
            if progress is not None:
                progress(sizes[index])
    return finish_job(results, paths, selection)
