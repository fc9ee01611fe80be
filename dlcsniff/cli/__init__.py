"""dlcsniff's command line: one typer application (dlcsniff.cli.app), a module per command group. The modules
register their commands when imported, in the order `--help` lists them: the data path first."""
from dlcsniff.cli import decode  # noqa: F401, I001
from dlcsniff.cli import analyse  # noqa: F401
from dlcsniff.cli import export  # noqa: F401
from dlcsniff.cli import wireshark  # noqa: F401
from dlcsniff.cli import capture  # noqa: F401
from dlcsniff.cli.app import app

__all__ = ["app"]
