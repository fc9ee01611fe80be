"""Which module defines each of dlcsniff's commands, in the order `--help` lists them (the data path first).

dlcsniff.cli.app's group looks a command's name up here and imports only that module: a run of one command
needs neither the other modules (and what they import, e.g. rich.table) nor typer building the other commands
from their signatures. `--help`, completion and an unknown command's error load them all."""
from __future__ import annotations

COMMANDS = {
    "decode": "dlcsniff.cli.decode",
    "dlc": "dlcsniff.cli.analyse",
    "stats": "dlcsniff.cli.analyse",
    "report": "dlcsniff.cli.analyse",
    "diagnose": "dlcsniff.cli.diagnose",
    "export": "dlcsniff.cli.export",
    "simulate": "dlcsniff.cli.simulate",
    "wireshark": "dlcsniff.cli.wireshark",
    "capture": "dlcsniff.cli.capture",
    "schema": "dlcsniff.cli.schema",
}
