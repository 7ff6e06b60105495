"""What every mixlab CLI shares: a typer app, and bad input as one line on stderr with exit code 2.

A domain CLI is three lines::

    app = domain_app("mixlab-graphs", "Graph methods: ...")
    def main(argv: list[str] | None = None) -> int:
        return run_app(app, argv, prog_name="mixlab-graphs")

and each method adds its command group with ``app.add_typer(flatnsd_app, name="flatnsd")``.
Set ``MIXLAB_DEBUG=1`` to see the traceback behind a one-line error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import typer
from typer.exceptions import TyperException

USAGE_ERROR = 2
INTERRUPTED = 130
"""the shell's exit code for Ctrl-C (128 + SIGINT)"""
INTERRUPTED_LINE = "interrupted; rerun with --resume to continue"


def domain_app(prog_name: str, help: str) -> typer.Typer:
    """An empty command group that answers ``--help``; methods add their sub-commands to it."""
    app = typer.Typer(
        name=prog_name,
        help=help,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )

    @app.callback()
    def _group() -> None:
        # A callback makes the app a group even before any method adds a command to it.
        pass

    return app


def _one_line(message: str) -> str:
    return " ".join(message.split())


def run_app(app: typer.Typer, argv: Sequence[str] | None = None, *, prog_name: str) -> int:
    """Run ``app`` on ``argv`` (default: the command line) and return its exit code (console scripts
    exit with it). No arguments shows the help; usage errors, ValueErrors (a damaged checkpoint's
    CheckpointError too), file errors (OSError) and an EOFError (an empty or cut file: click
    reports it as an Abort, which read as Ctrl-C until issue 80) become one stderr line and exit
    code 2; Ctrl-C
    one line and exit code 130 (checkpoints are written as runs go, so ``--resume`` continues)."""
    args = list(sys.argv[1:] if argv is None else argv) or ["--help"]
    command = typer.main.get_command(app)
    try:
        outcome = command.main(args=args, prog_name=prog_name, standalone_mode=False)
    except TyperException as error:  # typer's (vendored click's) usage errors: exit_code 2
        context = getattr(error, "ctx", None)
        where = context.command_path if context is not None else prog_name
        typer.echo(f"{where}: error: {_one_line(error.format_message())}", err=True)
        return error.exit_code
    except (typer.Abort, KeyboardInterrupt) as error:
        if isinstance(error.__context__, EOFError):  # click turns EOFError into Abort
            return _error_line(prog_name, error.__context__, "a file ended early (empty or cut)")
        typer.echo(f"{prog_name}: {INTERRUPTED_LINE}", err=True)
        return INTERRUPTED
    except (ValueError, OSError) as error:  # bad values, and paths that cannot be read or written
        return _error_line(prog_name, error)
    if outcome == INTERRUPTED:  # typer turns KeyboardInterrupt into a silent exit code 130
        typer.echo(f"{prog_name}: {INTERRUPTED_LINE}", err=True)
    return outcome if isinstance(outcome, int) else 0


def _error_line(prog_name: str, error: BaseException, what: str = "") -> int:
    """``prog: error: <message>`` on one stderr line and exit code 2, or the traceback with
    ``MIXLAB_DEBUG`` set."""
    if os.environ.get("MIXLAB_DEBUG"):
        raise error
    message = _one_line(str(error)) or repr(error)
    typer.echo(f"{prog_name}: error: {f'{what}: ' if what else ''}{message}", err=True)
    return USAGE_ERROR
