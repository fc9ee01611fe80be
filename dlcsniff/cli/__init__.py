"""dlcsniff's command line: one typer application (dlcsniff.cli.app), a module per command group. The modules
register their commands when imported, in the order `--help` lists them: the data path first."""
from dlcsniff.cli import decode  # noqa: F401, I001
from dlcsniff.cli import analyse  # noqa: F401
from dlcsniff.cli import export  # noqa: F401
from dlcsniff.cli import simulate  # noqa: F401
from dlcsniff.cli import wireshark  # noqa: F401
from dlcsniff.cli import capture  # noqa: F401
from dlcsniff.cli import schema  # noqa: F401
from dlcsniff.cli.app import app

__all__ = ["app", "main"]

VERBOSITY_FLAGS = frozenset({"-q", "--quiet", "-v", "--verbose"})


def main(argv: list[str] | None = None) -> None:
    """The `dlcsniff` program: `app`, with -q / -v accepted after the command name too (`dlcsniff decode ...
    -q`), where users put them, as well as before it, where they belong to the whole program."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    moved = [arg for arg in args[:end] if arg in VERBOSITY_FLAGS]
    rest = [arg for arg in args[:end] if arg not in VERBOSITY_FLAGS] + args[end:]
    app(args=moved + rest, prog_name="dlcsniff")
