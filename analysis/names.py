"""What every output calls a node and a capture, so that no name is both: ps-lite's scheduler gives ranks in
registration order, so the capture `worker0.pcap` may well hold worker rank 1.

- A ps-lite node by its role and rank: "worker rank 1", "server rank 0", "scheduler" (ids that name no single
  node: "unknown node"); a collective library's process by its rank: "rank 2".
- A capture by its file's name, "worker0.pcap.gz" (a daemon's directory "node3/", pieces "w.pcap (+2 pieces)"),
  from the decode manifest's `captures`; an output written before the manifest had them shows the capture's
  name in the tables.
The tables keep their values (`capture`, traffic's `src`/`dst`, DLC file names): these are the labels shown.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from dlcsniff.analysis.operations import ROLE_NAMES, ROLE_SCHEDULER, ROLE_UNKNOWN, node_role_rank
from dlcsniff.decoders.inputs.capture_set import capture_name


def node_labels(node_ids: np.ndarray) -> np.ndarray:
    """ps-lite node ids → "worker rank 1", "server rank 0", "scheduler", "unknown node"."""
    role, rank = node_role_rank(np.asarray(node_ids))
    labels = np.array(ROLE_NAMES, dtype=object)[role] + " rank " + rank.astype(str).astype(object)
    return np.where(role == ROLE_SCHEDULER, "scheduler", np.where(role == ROLE_UNKNOWN, "unknown node", labels))


def node_label(role: str, rank: int) -> str:
    return "scheduler" if role == "scheduler" else f"{role} rank {rank}"


def rank_label(rank: int) -> str:
    return f"rank {rank}"


def capture_labels(manifest: dict | None) -> dict[str, str]:
    """Capture name → how outputs show it (see the module doc), for the captures the manifest lists."""
    labels = {}
    for found in (manifest or {}).get("captures") or ():
        files = [Path(path) for path in found.get("files") or ()]
        if not files:
            continue
        if capture_name(files[0]) != found["capture"] and files[0].parent.name == found["capture"]:
            labels[found["capture"]] = f"{files[0].parent.name}/"          # a capture daemon's directory
        else:
            more = f" (+{len(files) - 1} pieces)" if len(files) > 1 else ""
            labels[found["capture"]] = f"{files[0].name}{more}"
    return labels


def capture_label(capture: str, labels: dict[str, str]) -> str:
    return labels.get(capture, capture)
