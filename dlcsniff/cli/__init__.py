"""dlcsniff's command line: one typer application (dlcsniff.cli.app), a module per command group. A module
registers its commands when imported, which the application does when a command is first asked for
(dlcsniff.cli.commands: which module defines which command, in the order `--help` lists them)."""
from dlcsniff.cli import app as app_module
from dlcsniff.cli.app import app

__all__ = ["app", "main"]

VERBOSITY_FLAGS = frozenset({"-q", "--quiet", "-v", "--verbose"})
# The cyclic garbage collector's thresholds for a run (gc.set_threshold): a young collection every 100,000
# allocations, not 700. Nearly all a run allocates lives to its end (modules, the tables), so the default made the
# collector walk those objects hundreds of times over, for no garbage. The decoders' reference cycles go after each
# capture (decoders.job collects them; a forked worker exits), so peak memory stays as it was (README, "Decode
# speed", has the figures).
GC_THRESHOLDS = (100_000, 50, 100)


def main(argv: list[str] | None = None) -> None:
    """The `dlcsniff` program: `app`, with -q / -v accepted after the command name too (`dlcsniff decode ...
    -q`), where users put them, as well as before it, where they belong to the whole program. Run as the program
    (no `argv`), it collects garbage by GC_THRESHOLDS, says so (`app.AS_PROGRAM`: decode then keeps pandas out
    of the process) and leaves without the interpreter's teardown (`_leave`); called with `argv` (tests, other
    programs), it changes none of these."""
    import gc
    import sys

    if argv is None:
        gc.set_threshold(*GC_THRESHOLDS)
        app_module.AS_PROGRAM = True
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    moved = [arg for arg in args[:end] if arg in VERBOSITY_FLAGS]
    rest = [arg for arg in args[:end] if arg not in VERBOSITY_FLAGS] + args[end:]
    if argv is not None:
        app(args=moved + rest, prog_name="dlcsniff")
        return
    try:
        app(args=moved + rest, prog_name="dlcsniff")
    except SystemExit as done:
        _leave(done.code)
        raise


def _leave(code) -> None:
    """Exit with `code` once the exit handlers have run and the output is flushed, without freeing every object
    and module first: with pandas and pyarrow loaded that teardown is a good part of a small decode (README:
    decode speed). Only when nothing else runs (no other thread) and the code is a number; otherwise it
    returns (a normal exit)."""
    import atexit
    import os
    import sys
    import threading

    if threading.active_count() > 1 or not (code is None or isinstance(code, int)):
        return
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):        # e.g. a closed pipe: the normal exit reports it
        return
    os._exit(code or 0)
