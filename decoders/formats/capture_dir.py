"""A capture daemon's directory, as the daemon (sniffer/) writes it and the decoders read it: defined here once.

    capture.json               {"format": FORMAT, "runs": [...], "files": [{"name", "packets", "dropped"...}]}
    capture-SSSS-FFFFF.pcap    packets of daemon run ("set") S, rotated: file F of the set
    probes-SSSS.events         probe events of set S (decoders.formats.probe_events)

A restart adds the next set and leaves the old files alone.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from dlcsniff.decoders.errors import CaptureError

FORMAT = "dlcsniff-capture/1"
CAPTURE_JSON = "capture.json"
PCAP_NAME = "capture-{set:04d}-{index:05d}.pcap"
PROBES_NAME = "probes-{set:04d}.events"
PCAP_RE = re.compile(r"capture-(\d{4})-(\d{5})\.pcap$")
PROBES_RE = re.compile(r"probes-(\d{4})\.events$")
SET_FILE_RE = re.compile(r"(?:capture|probes)-(\d{4})[-.]")     # any file of a set


def is_capture_dir(path: Path) -> bool:
    return (Path(path) / CAPTURE_JSON).is_file()


def read_capture_json(path: Path) -> dict:
    """capture.json of a daemon's directory; CaptureError when there is none or it is unreadable."""
    try:
        return json.loads((Path(path) / CAPTURE_JSON).read_text())
    except FileNotFoundError:
        raise CaptureError(f"{path}: no {CAPTURE_JSON}: not a dlcsniff capture directory") from None
    except (OSError, ValueError) as exc:
        raise CaptureError(f"{Path(path) / CAPTURE_JSON}: unreadable ({exc})") from None


def recorded_drops(path: Path) -> dict[str, int]:
    """Packets the kernel dropped while each packet file of the directory was written, as capture.json records
    them (file name -> dropped)."""
    return {entry["name"]: int(entry.get("dropped") or 0) for entry in read_capture_json(path).get("files", [])
            if entry.get("kind", "packets") == "packets" and "name" in entry}


def set_files(path: Path) -> tuple[dict[int, list[Path]], dict[int, Path]]:
    """(packet files of each set in rotation order, probe file of each set) found in the directory."""
    sets: dict[int, list[tuple[int, Path]]] = defaultdict(list)
    probes: dict[int, Path] = {}
    for entry in Path(path).iterdir():
        if not entry.is_file():
            continue
        if found := PCAP_RE.match(entry.name):
            sets[int(found.group(1))].append((int(found.group(2)), entry))
        elif found := PROBES_RE.match(entry.name):
            probes[int(found.group(1))] = entry
    return {run: [file for _, file in sorted(files)] for run, files in sorted(sets.items())}, probes
