"""The Dask cluster dlcsniff's `--engine dask` runs on: the one at `scheduler` (an address such as
tcp://10.0.0.5:8786) or, without one, a local cluster started for the call and closed after it (worker
processes listening on loopback only, no dashboard). Workers of a running cluster read the captures
themselves: they must see the same files, under the same absolute paths (a shared file system), and be able
to import dlcsniff. They run as their owner configured them: Dask's default environment for workers
(MALLOC_TRIM_THRESHOLD_, under distributed.nanny.pre-spawn-environ) makes decoding about 1.5 times slower;
the local cluster drops it. Used by decoders.dask_decode and analysis.dask_stats.
"""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from dlcsniff.decoders.errors import ClusterError

if TYPE_CHECKING:
    from distributed import Client

SCHEDULER_TIMEOUT_S = 10      # how long to try reaching a running scheduler before giving up


@contextlib.contextmanager
def dask_client(scheduler: str | None, workers: int | None, *, tasks: int) -> Iterator[Client]:
    """A client of the cluster at `scheduler`, else of a local cluster of `workers` processes (default: one
    per core, no more than `tasks`), one thread each, started on 127.0.0.1 and closed on leaving."""
    import dask
    from distributed import Client, LocalCluster
    from distributed.comm import resolve_address

    if scheduler is not None:
        if workers is not None:
            raise ClusterError(f"a number of workers is for a local cluster; the cluster at {scheduler} "
                               "has its own")
        try:
            # checked first: a client given a malformed address fails, then hangs on closing
            address = resolve_address(scheduler)
            client = Client(address, timeout=SCHEDULER_TIMEOUT_S, set_as_default=False)
        except (OSError, ValueError) as exc:      # unreachable (OSError, TimeoutError) or a malformed address
            raise ClusterError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        with client:
            yield client
        return
    if workers is not None and workers < 1:
        raise ClusterError(f"a local cluster needs at least one worker (got {workers})")
    n_workers = workers if workers is not None else max(1, min(tasks, len(os.sched_getaffinity(0))))
    # Dask's workers give freed memory back to the system eagerly (MALLOC_TRIM_THRESHOLD_), which keeps a
    # long-lived worker small and makes decoding half as slow again (measured): this cluster lives one call.
    environ = {name: value for name, value in dask.config.get("distributed.nanny.pre-spawn-environ").items()
               if name != "MALLOC_TRIM_THRESHOLD_"}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None, silence_logs=logging.CRITICAL)
    with cluster, Client(cluster, set_as_default=False) as client:
        yield client


def worker_path(path: Path, scheduler: str | None) -> Path:
    """A path as a task must be given it: as it is for a local cluster (its workers share this process's
    working directory), absolute for a running cluster (its workers may not)."""
    return path if scheduler is None else path.resolve()


@contextlib.contextmanager
def cluster_failures() -> Iterator[None]:
    """Turn the cluster's own failures (a worker killed, the scheduler gone) into a ClusterError; the
    tasks' exceptions (a CaptureError, an AnalysisError) pass through as they are."""
    from distributed import KilledWorker
    from distributed.client import FutureCancelledError
    from distributed.comm.core import CommClosedError

    try:
        yield
    except KilledWorker as exc:
        raise ClusterError(f"a Dask worker died (out of memory?): {exc}") from None
    except (FutureCancelledError, CommClosedError) as exc:
        raise ClusterError(f"lost the Dask cluster: {exc}") from None
