"""The `dlcsniff` program (pyproject.toml's [project.scripts], `python -m dlcsniff`): ^C while the command line is
still loading (typer, rich, the command's modules: a tenth of a second) ends it as ^C does once it runs, with exit
status 130 and no traceback."""
import sys

EXIT_INTERRUPTED = 130      # 128 + SIGINT, as shells report a program ^C ended


def main() -> None:
    try:
        from dlcsniff.cli import main as run
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    run()
