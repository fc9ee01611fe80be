"""The typer application every command registers on (`command`), and what the commands share: the consoles,
the one-line errors and their exit codes, warnings and details by verbosity, the steps -v times, the old
spellings of options that still work, the options several commands take.

Habits of the command line: -h/--help, -V/--version, -q/--quiet (errors only), -v/--verbose (what each step
took, every detail); flags take no value (their help shows none); output to a pipe or a file keeps whole
tables and lines (no terminal width to fit); numbers out of range are refused before any work; every error is
one line `error: ...` on stderr.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.console import Console
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer.core import TyperCommand, TyperGroup

from dlcsniff import __version__
from dlcsniff.cli.coercion import use_plain_coercion
from dlcsniff.cli.commands import COMMANDS

# True when dlcsniff runs as the program (dlcsniff.cli.main without argv), False when a caller runs the app in its
# own process (tests, other programs): what only a process of its own may change (decode keeping pandas out of
# it, decoders.arrow_without_pandas) asks `as_program`.
AS_PROGRAM = False
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_CODES = ("Exit codes: 0 done; 1 the command refused or failed (a bad or undecodable capture, a missing input, "
              "an output in the way, options that do not go together); 2 the command line cannot be read (an "
              "unknown command or option, a missing, malformed or out-of-range value).")


def as_program() -> bool:
    """Whether dlcsniff runs as the program (AS_PROGRAM). A function: `dlcsniff.cli.app` names the typer
    application once the package is imported, not this module."""
    return AS_PROGRAM


class _FlagHelp:
    """-h/--help is a flag like the others: no value placeholder in the help, and False when not given (typer
    would otherwise coerce its missing value through pydantic, an import a run without --help may not need)."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
            option.default = False
        return option


class _Group(_FlagHelp, TyperGroup):
    """dlcsniff's group: a command's module is imported, and its click command built from its signature, when
    click first asks for it (get_command), the way click's lazily loading groups do; the program running one
    command builds that one. Everything click lists (help, completion) comes from COMMANDS, in its order."""

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, cmd_name: str):
        """The command `cmd_name`, built on first use; a name that is no command builds them all (click's error
        then suggests the close ones)."""
        if cmd_name not in self.commands:
            self._build([cmd_name] if cmd_name in COMMANDS else list(COMMANDS))
        return self.commands.get(cmd_name)

    def _build(self, names: list[str]) -> None:
        """Import the modules of the commands `names` (each registers its commands on `app`), then build those
        not built yet as typer builds a group's commands (typer.main.get_group_from_info)."""
        for module in dict.fromkeys(COMMANDS[name] for name in names):
            __import__(module)      # not importlib.import_module: -X importtime lists this one, what it loads under it
        for info in app.registered_commands:
            name = info.name or typer.main.get_command_name(info.callback.__name__)
            if name in names and name not in self.commands:
                self.add_command(typer.main.get_command_from_info(
                    info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode))

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """typer's main, with its errors as one line `error: ...` (no boxes, no usage block) and the exit codes
        of EXIT_CODES; an OSError no command caught is one line too."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError as exc:          # `dlcsniff` alone: the help
            exc.show()
            code = exc.exit_code
        except ClickException as exc:
            say_error(exc.format_message().rstrip(".").replace("\n", " ") + _help_hint(exc))
            code = exc.exit_code
        except typer.Abort:
            say_error("aborted")
            code = EXIT_FAILED
        except OSError as exc:
            say_error(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror or exc))
            code = EXIT_FAILED
        sys.exit(code if isinstance(code, int) else EXIT_OK)


def _help_hint(exc: ClickException) -> str:
    ctx = getattr(exc, "ctx", None)
    return f" (see `{ctx.command_path} -h`)" if ctx is not None else ""


class _Command(_FlagHelp, TyperCommand):
    """A dlcsniff command: plain coercion of its parameters, and its options' old spellings (`renamed`: old ->
    new) still understood, each with a one-line deprecation warning."""

    renamed: dict[str, str] = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            use_plain_coercion(param)

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, respell(args, self.renamed, ctx.command_path))


def respell(args: list[str], renamed: dict[str, str], command_path: str) -> list[str]:
    """`args` with every old spelling of an option (`--workers`, `--workers=2`, `-fchrome`) in its new one, up
    to `--` (after it everything is an argument), saying so once per spelling."""
    if not renamed:
        return args
    end = args.index("--") if "--" in args else len(args)
    respelled, said = [], set()
    for arg in args[:end]:
        old = next((old for old in renamed if _spells(arg, old)), None)
        if old is not None:
            new, rest = renamed[old], arg[len(old):]      # rest: "", "=VALUE", or a short option's VALUE
            if rest and not old.startswith("--") and new.startswith("--"):
                rest = "=" + rest
            if old not in said:
                warn(f"`{command_path} {old}` is deprecated: use {new}")
                said.add(old)
            arg = new + rest
        respelled.append(arg)
    return respelled + args[end:]


def _spells(arg: str, option: str) -> bool:
    """Whether `arg` gives `option`: --name, --name=VALUE; -x, or -xVALUE."""
    if option.startswith("--"):
        return arg == option or arg.startswith(option + "=")
    return arg.startswith(option) and not arg.startswith("--")


app = typer.Typer(
    cls=_Group,
    help="See what a distributed deep-learning job puts on the network, per tensor, without touching the job.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def command(*args, renamed: dict[str, str] | None = None, epilog: str = EXIT_CODES, **kwargs):
    """`app.command` for dlcsniff's commands: flags without a value placeholder in their help, the exit codes
    as the help's epilog, and `renamed` (old spelling -> new) for the options they renamed."""
    cls = type("Command", (_Command,), {"renamed": dict(renamed or {})}) if renamed else _Command
    return app.command(*args, cls=cls, epilog=epilog, **kwargs)


# Not a terminal (a pipe, a file): no width to fit, so whole tables and unbroken lines.
_WIDE = 100_000
# No emoji codes (`:name:`) in anything dlcsniff prints: a path or an address is printed as it is, and rich never
# loads its emoji table.
out = Console(width=None if sys.stdout.isatty() else _WIDE, emoji=False)
err = Console(stderr=True, width=None if sys.stderr.isatty() else _WIDE, emoji=False)
_verbosity = {"level": 0}     # -1 quiet, 0 normal, 1 verbose


def say_error(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True, markup=True)


def fail(message: str, exit_code: int = EXIT_FAILED) -> None:
    """The command stops: one line `error: message` on stderr, exit `exit_code`."""
    say_error(message)
    raise typer.Exit(exit_code)


def warn(message: str) -> None:
    if _verbosity["level"] >= 0:
        err.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def print_losses(losses: dict[str, int], explained: dict[str, str]) -> None:
    """An analysis's losses on one line, then what each count that is not zero is, and why (`explained`)."""
    out.print(", ".join(f"{name.replace('_', ' ')} {value:,}" for name, value in losses.items()), highlight=False)
    for name, value in losses.items():
        if value and name in explained:
            out.print(f"  {name.replace('_', ' ')} {value:,}: {explained[name]}", highlight=False, soft_wrap=True)


def detail(message: str) -> None:
    """What -v adds (on stderr: stdout stays the result)."""
    if _verbosity["level"] > 0:
        err.print(f"[dim]{message}[/]", highlight=False, soft_wrap=True)


def took(what: str, seconds: float) -> None:
    """-v's line for one step: `<what> in <seconds> s`."""
    detail(f"{what} in {seconds:.2f} s")


@contextmanager
def step(what: str, status: str | None = None):
    """One step of a command: a spinner saying `status` while it runs (on a terminal), then under -v one line
    saying what it took (`what`: what was done, e.g. "computed the statistics")."""
    start = time.perf_counter()
    if status is None:
        yield
    else:
        with err.status(status):
            yield
    took(what, time.perf_counter() - start)


def _version(value: bool) -> None:
    if value:
        out.print(f"dlcsniff {__version__}")
        raise typer.Exit()


Flag = dict(metavar="")


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_version, is_eager=True, **Flag,
                                          help="Print the version and exit.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", **Flag, help="Print errors only.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", **Flag, help="Also say what each step took (one "
                                          "line a step, on stderr), and every detail.")] = False,
) -> None:
    """Capture, decode and analyse distributed deep-learning traffic."""
    if quiet and verbose:
        fail("--quiet and --verbose exclude each other")
    _verbosity["level"] = -1 if quiet else 1 if verbose else 0
    out.quiet = quiet


Engine = Annotated[Literal["pandas", "dask"], typer.Option(
    "--engine", help="pandas: this machine's processes; dask: a Dask cluster (a local one unless --scheduler).")]
SchedulerAddress = Annotated[Optional[str], typer.Option(
    "--scheduler", help="Address of a running Dask scheduler (e.g. tcp://10.0.0.5:8786), for --engine dask; "
    "its workers must see the same files under the same absolute paths.")]


def check_engine(engine: str, scheduler: Optional[str]) -> None:
    if scheduler is not None and engine != "dask":
        fail("--scheduler needs --engine dask")


DecodeDir = Annotated[Path, typer.Argument(metavar="DECODE_DIR", help="The --out directory of `dlcsniff decode`.")]
Force = Annotated[bool, typer.Option("--force", **Flag, help="Replace the output of an earlier run of the same "
                                     "command in --out (a directory: the files its manifest.json lists, nothing "
                                     "else; a file: only one that command wrote). Anything else is refused, exit 1.")]
Json = Annotated[bool, typer.Option("--json", **Flag, help="Print the result as JSON (on stdout).")]
