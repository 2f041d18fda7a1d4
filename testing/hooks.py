"""A real `apply.py` process with a hook installed before it runs: killed with SIGKILL at an exact point, or paused
there until the test lets it go on. The hook wraps a real function; nothing the apply does is replaced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from rigstack.versions import REPO_ROOT

_KILL = "os.kill(os.getpid(), signal.SIGKILL)"
HOOKS = {
    # The instant a journal file is created, before a byte of it is written.
    "journal-created": f"""
        real_open = io.open
        def hooked(file, mode="r", *args, **kwargs):
            handle = real_open(file, mode, *args, **kwargs)
            if "applying" in os.path.basename(str(file)) and "w" in mode:
                {_KILL}
            return handle
        io.open = builtins.open = hooked
    """,
    # The checkout's `git read-tree -m -u` has written the files; the branch, the stamp and the journal's removal
    # have not happened.
    "after-checkout-files": f"""
        from rigstack.gitrepo import PackageRepo
        real_run = PackageRepo.run
        def hooked(self, *args, **kwargs):
            out = real_run(self, *args, **kwargs)
            if args[:2] == ("read-tree", "-m"):
                {_KILL}
            return out
        PackageRepo.run = hooked
    """,
    # Before any patch is applied (the lock is held): says "paused" and waits for a line on stdin.
    "pause-before-series": """
        from rigstack import applier
        real_series = applier.commit_series
        def hooked(*args, **kwargs):
            print("paused", flush=True)
            sys.stdin.readline()
            return real_series(*args, **kwargs)
        applier.commit_series = hooked
    """,
}


def hooked_apply(hook: str, *args: str, **popen) -> subprocess.Popen:  # noqa: ANN003 - passed to Popen
    """Start `python apply.py ARGS` with HOOKS[hook] installed."""
    code = "\n".join(["import builtins, io, os, runpy, signal, sys", textwrap.dedent(HOOKS[hook]),
                      f"sys.argv = [{str(REPO_ROOT / 'apply.py')!r}] + sys.argv[1:]",
                      "runpy.run_path(sys.argv[0], run_name='__main__')"])
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO_ROOT, text=True,
                            env={**os.environ, "COLUMNS": "200"}, **popen)


def apply_killed_at(hook: str, *args: str) -> None:
    """Run `apply.py ARGS` and SIGKILL it at the hook; fail when it ends any other way (the hook was not reached)."""
    run = hooked_apply(hook, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = run.communicate(timeout=300)
    assert run.returncode == -signal.SIGKILL, f"not killed at {hook} (exit {run.returncode}): {err}{out}"
