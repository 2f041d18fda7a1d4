"""How the user started this process, so that errors and hints name a command the way the user types it:
`rigstack port --skip` after `rigstack port ...`, `python apply.py port --skip` after `python apply.py port ...`
(the seeds' entry points, which are also what a library caller and the tests get).

    command(words) -> str   `rigstack WORDS` (e.g. "port --skip", "preflight profiles") as the user would type it
    rerun_env() -> dict     the variable that keeps it so in a rerun under another interpreter (rigstack.serving)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "RIGSTACK_INVOKED_AS"
_ENTRY_POINTS = "entry points"  # ENV's value when the user ran apply.py, preflight.py or scripts/*.py

# rigstack's subcommands and the entry point each one is; the rest (apply, check, status, diff, export, import,
# port) are apply.py's. Longest first: "image verify" before "image".
_SHIMS = [("image verify", "python -m rigstack.images verify-image"), ("image", "python -m rigstack.images"),
          ("preflight", "python preflight.py"), ("plan", "python preflight.py plan"),
          ("serve", "python scripts/run_prod.py"), ("stop", "python scripts/run_prod.py stop"),
          ("bang", "python scripts/probe_bang.py"), ("expert-trace", "python scripts/expert_trace.py"),
          ("upstream-tests", "python scripts/upstream_tests.py"),
          *((name, f"python scripts/{name}.py") for name in ("bench", "conc", "needle", "qual", "compare"))]


def _invoked_as() -> str | None:
    """`rigstack` or `python -m rigstack` when the user ran the rigstack command, else None."""
    given = os.environ.get(ENV)
    if given:
        return None if given == _ENTRY_POINTS else given
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == "rigstack.__main__":
        return "python -m rigstack"
    return "rigstack" if Path(sys.argv[0]).name == "rigstack" else None


def command(words: str) -> str:
    """The rigstack subcommand `words` as the user would type it in this process's form."""
    prog = _invoked_as()
    if prog is not None:
        return f"{prog} {words}"
    for sub, shim in _SHIMS:
        if words == sub or words.startswith(sub + " "):
            return shim + words[len(sub):]
    return f"python apply.py {words}"


def rerun_env() -> dict[str, str]:
    return {ENV: _invoked_as() or _ENTRY_POINTS}
