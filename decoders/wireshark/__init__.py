"""dlcsniff's Wireshark / tshark dissector: dlcsniff.lua, a Lua script that shows ZMTP, ps-lite and Gloo messages
as `dlcsniff decode` finds them; its header says what it decodes, how to run it and what it leaves out. Its
source is the files of parts/ (package data), one part of the script each, in the order of their names: the
header, wire constants and fields, ps-lite metas, ZMTP, ps-lite, Gloo, the capture's state and the decoders as
owners of TCP directions, TCP reassembly, ps-lite across the capture, display and registration. Wireshark loads
one file, so the parts are one script, written whole. This module only writes it: where the user asks, or into
Wireshark's personal Lua plugin folder, where Wireshark and tshark load it at start.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from dlcsniff.decoders.output_dir import claim_output_file

SCRIPT_NAME = "dlcsniff.lua"


def dissector_source() -> str:
    """The Lua script's text: its parts in order."""
    parts = sorted((part for part in resources.files(__package__).joinpath("parts").iterdir()
                    if part.name.endswith(".lua")), key=lambda part: part.name)
    return "".join(part.read_text(encoding="utf-8") for part in parts)


def personal_plugin_dir(home: Path | None = None) -> Path:
    """Wireshark's personal Lua plugin folder (what `tshark -G folders` calls "Personal Lua Plugins").

    Wireshark 4.x on Unix-like systems: ~/.local/lib/wireshark/plugins, from $HOME (XDG_CONFIG_HOME moves the
    configuration folder, not this one); on Windows %APPDATA%\\Wireshark\\plugins."""
    if os.name == "nt" and home is None:
        return Path(os.environ["APPDATA"]) / "Wireshark" / "plugins"
    return (home if home is not None else Path.home()) / ".local" / "lib" / "wireshark" / "plugins"


# the script's first bytes (parts/00_header.lua): what tells a dlcsniff.lua this command wrote
SCRIPT_MARKER = b"-- dlcsniff.lua: "


def write_dissector(out_dir: Path, *, force: bool = False, option: str = "--out") -> Path:
    """Write the script to out_dir/dlcsniff.lua (creating out_dir) and return its path: an existing
    dlcsniff.lua only with `force`, and only one this command wrote (decoders.output_dir.claim_output_file:
    OutputError otherwise). Raises OSError when it cannot be written."""
    path = claim_output_file(Path(out_dir) / SCRIPT_NAME, marker=SCRIPT_MARKER, command="dlcsniff wireshark",
                             force=force, option=option)
    path.write_text(dissector_source(), encoding="utf-8")
    return path
