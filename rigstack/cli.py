"""Top-level wrapper shared by every entry point: one line for user errors, a traceback only with --debug."""

from __future__ import annotations

import errno
import os
import sys
import tempfile
import traceback
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from rigstack.errors import EXIT_BUG, EXIT_INTERRUPTED, UserError
from rigstack.output import json_printed, print_json

# Results go to stdout (so `--json` output stays clean); everything for humans goes to stderr.
console = Console(stderr=True, highlight=False, soft_wrap=True)


def _log_traceback() -> str:
    fd, path = tempfile.mkstemp(prefix="rigstack-crash-", suffix=".log")
    with os.fdopen(fd, "w") as log:
        traceback.print_exc(file=log)
    return path


def _usage_error(error: typer.TyperException) -> int:
    """One line with typer's own message (it carries the "Did you mean" suggestion) and where the help is."""
    # no_args_is_help: typer has already printed the help; the error itself carries nothing more to say.
    if type(error).__name__ == "NoArgsIsHelpError":
        return error.exit_code
    context = getattr(error, "ctx", None)
    where = f" (see `{context.command_path} --help`)" if context is not None else ""
    console.print(f"[bold red]error:[/] {escape(error.format_message() + where)}")
    return error.exit_code


_DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def _prog_name() -> str:
    """What the user typed to start this: `python -m rigstack.images` rather than the module's file name."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return f"python -m {spec.name.removesuffix('.__main__')}" if spec is not None else Path(sys.argv[0]).name


def _refuse_another_checkout() -> None:
    from rigstack.versions import refuse_another_checkout

    try:
        cwd = Path.cwd()
    except OSError:  # the folder was removed under the shell: nothing to confuse it with
        return
    refuse_another_checkout(cwd)


def run(app: typer.Typer, argv: list[str] | None = None) -> int:
    """Run a typer app and turn every failure into an exit code; entry points call only this."""
    args = list(sys.argv[1:] if argv is None else argv)
    # --debug is consumed here, wherever it stands, so it works even when parsing the rest fails.
    debug = "--debug" in args
    args = [arg for arg in args if arg != "--debug"]
    printed = json_printed()
    try:
        _refuse_another_checkout()
        result = app(args=args, standalone_mode=False, prog_name=_prog_name())
    except UserError as error:
        if debug:
            console.print_exception()
        # soft_wrap: the message stays one line however narrow the terminal, so it can be grepped and pasted.
        console.print(f"[bold red]error:[/] {escape(str(error))}", soft_wrap=True)  # it quotes user values
        if "--json" in args and json_printed() == printed:  # a script reading stdout finds the failure there too
            print_json({"error": str(error), "exit_code": error.exit_code})
        return error.exit_code
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return EXIT_INTERRUPTED
    except (typer.Exit, SystemExit) as stop:
        code = getattr(stop, "exit_code", None)
        return int(code if code is not None else getattr(stop, "code", 0) or 0)
    except typer.Abort:
        return EXIT_INTERRUPTED
    except typer.TyperException as error:
        # typer's own parsing errors (unknown command or option, missing argument, bad value); since 0.29 typer
        # vendors click, so these are typer's classes, not click's.
        return _usage_error(error)
    except Exception as error:  # noqa: BLE001 - the last line of defence: a bug, reported as one
        if debug:
            raise
        if isinstance(error, OSError) and error.errno in _DISK_ERRORS:
            # A full or read-only disk is the user's to fix wherever the write was, not a bug of the tool.
            where = f" {error.filename}" if error.filename else ""
            console.print(f"[bold red]error:[/] cannot write{escape(where)}: {error.strerror}; free space there or "
                          "point the command elsewhere (--out, --run-dir, RIGSTACK_CACHE) and rerun",
                          soft_wrap=True)
            return 1
        console.print(f"[bold red]bug:[/] {type(error).__name__}: {error} (traceback in {_log_traceback()}; "
                      "rerun with --debug to see it)", soft_wrap=True)
        return EXIT_BUG
    return int(result or 0)
