"""`decode --engine dask` on a real distributed cluster: `dask scheduler` and two `dask worker` processes, each in a
network namespace standing for a node of its own (lab/dask_nodes.py: its own address, reachable only from the
cluster's other hosts), the client in a fourth; the workers read the captures where they lie (the one file
system of this machine standing for a shared one). The tables are those of a local decode, file by file, and the
decode tasks ran on the cluster."""
from __future__ import annotations

import json
import subprocess

import pytest

from lab.dask_nodes import PYTHON, dask_nodes
from tests.conftest import PCAPS, REPO
from tests.support.decode_compare import compare_dirs

DLCSNIFF = str(REPO / ".venv" / "bin" / "dlcsniff")
# the task prefixes the scheduler has seen
PREFIXES = ("import json, sys; from distributed import Client\n"
            "with Client(sys.argv[1]) as c:\n"
            "    print(json.dumps(c.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))))")


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("job", ["mxnet_sync", "gloo"])
def test_decode_on_a_distributed_cluster_in_namespaces_matches_a_local_decode(tmp_path, job):
    local, distributed = tmp_path / "local", tmp_path / "distributed"
    subprocess.run([DLCSNIFF, "-q", "decode", str(PCAPS / job), "--out", str(local)], check=True)
    with dask_nodes(2, tmp_path) as (cluster, address, _):
        cluster.run("client", [DLCSNIFF, "-q", "decode", str(PCAPS / job), "--out", str(distributed),
                               "--engine", "dask", "--scheduler", address], timeout_s=600)
        prefixes = json.loads(cluster.run("client", [PYTHON, "-c", PREFIXES, address]).stdout)
    assert compare_dirs(local, distributed) == []
    assert "decode_capture" in prefixes
