"""`dlcsniff wireshark`: the Lua dissector that shows ZMTP, ps-lite and Gloo messages in Wireshark and tshark."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from dlcsniff.cli.app import Flag, Json, command, fail, out, step


@command()
def wireshark(
    out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="Directory to write dlcsniff.lua into.")
                       ] = None,
    install: Annotated[bool, typer.Option(
        "--install", **Flag, help="Write it into Wireshark's personal Lua plugin folder "
        "(~/.local/lib/wireshark/plugins), where Wireshark and tshark load it at start.")] = False,
    force: Annotated[bool, typer.Option("--force", **Flag, help="Replace a dlcsniff.lua an earlier `dlcsniff "
                                        "wireshark` wrote (never another file).")] = False,
    as_json: Json = False,
) -> None:
    """Write the Wireshark / tshark dissector (dlcsniff.lua): the ZMTP, ps-lite and Gloo messages `decode` finds,
    with fields such as pslite.sender, pslite.recver, pslite.timestamp, pslite.push, pslite.request, pslite.key,
    pslite.data_sizes, zmtp.flags and zmtp.size.

    Examples: dlcsniff wireshark --out plugins, then
    tshark -2 -X lua_script:plugins/dlcsniff.lua -r pcaps/mxnet_sync/worker0.pcap.gz -Y pslite;
    dlcsniff wireshark --install, then tshark -2 -r pcaps/mxnet_sync/worker0.pcap.gz -Y pslite
    """
    from dlcsniff.decoders.output_dir import OutputError
    from dlcsniff.decoders.wireshark import SCRIPT_NAME, personal_plugin_dir, write_dissector

    if out_dir is None and not install:
        fail("say where to write it: --out DIR, --install, or both")
    targets = ([(out_dir, False)] if out_dir is not None else []) + ([(personal_plugin_dir(), True)] if install else [])
    written = []
    for directory, installed in targets:
        try:
            with step(f"wrote {SCRIPT_NAME} into {directory}"):
                path = write_dissector(directory, force=force, option="--install:" if installed else "--out")
        except OutputError as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"cannot write {directory / SCRIPT_NAME}: {exc.strerror or exc}")
        written.append({"path": str(path), "bytes": path.stat().st_size, "installed": installed})
    if as_json:
        print(json.dumps({"written": written}, indent=2))
        return
    for entry in written:
        if entry["installed"]:
            out.print(f"installed {entry['path']}: Wireshark and tshark load it at start "
                      "(tshark -2 -r CAPTURE -Y pslite)", highlight=False, soft_wrap=True)
        else:
            out.print(f"wrote {entry['path']} (tshark -2 -X lua_script:{entry['path']} -r CAPTURE -Y pslite)",
                      highlight=False, soft_wrap=True)
