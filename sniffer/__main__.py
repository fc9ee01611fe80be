"""The capture daemon as its own lean process: `dlcsniff capture` parses and checks its options, then executes
`python -m dlcsniff.sniffer OPTIONS_JSON` in its place (same pid, same descriptors), so that the daemon
that runs for hours holds only what capturing needs, not the command line's libraries (typer, rich: tens of
MB of Python objects)."""
from __future__ import annotations

import sys

from dlcsniff.sniffer.daemon import run_capture
from dlcsniff.sniffer.options import DaemonError, EXIT_BAD_OPTIONS, options_from_json


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m dlcsniff.sniffer OPTIONS_JSON (run by `dlcsniff capture`)", file=sys.stderr)
        return EXIT_BAD_OPTIONS
    try:
        return run_capture(options_from_json(argv[0])).exit_code
    except DaemonError as exc:
        print(f"dlcsniff capture: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except OSError as exc:
        print(f"dlcsniff capture: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
