"""The launcher on the terminal: the staged wait live (a spinner per stage with the server log's newest line under
it), the log tail of a server that died, a SIGKILL, the dry run's commands (stdout, to paste), ready, stopped."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import RenderableType
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from rigstack import launch
from rigstack.cli import console


class _BootProgress(Progress):
    """The staged progress with the server log's newest line under it."""

    log_line = ""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.log_line:
            yield Text(f"  {self.log_line}", style="dim", no_wrap=True, overflow="ellipsis")


class LaunchView:
    """The on_event a command passes to rigstack.launch; one per command run (it holds the live wait)."""

    def __init__(self) -> None:
        self._progress: _BootProgress | None = None
        self._task: tuple[str, TaskID] | None = None

    def __call__(self, event: launch.Event) -> None:
        match event:
            case launch.WaitStarted(record):
                console.print(f"server log: {record.log}", markup=False)
                self._progress = _BootProgress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                                               TimeElapsedColumn(), console=console, transient=True)
                self._progress.start()
            case launch.Waiting(stage, log_line) if self._progress is not None:
                if self._task is None or self._task[0] != stage:
                    self._task = (stage, self._progress.add_task(f"waiting for {stage}"))
                self._progress.log_line = log_line
            case launch.StagePassed(stage, after_s) if self._progress is not None:
                if self._task is not None:
                    self._progress.remove_task(self._task[1])
                    self._task = None
                console.print(f"[green]ok[/] {stage} after {after_s:.1f} s")
            case launch.WaitEnded() if self._progress is not None:
                self._progress.stop()
                self._progress, self._task = None, None
            case launch.Died(log, tail):
                console.print(f"--- last lines of {log} ---\n{tail}\n---", markup=False, style="dim")
            case launch.Killing(pgid, grace_s):
                console.print(f"[yellow]server group {pgid} ignored SIGTERM for {grace_s:.0f} s; sending SIGKILL[/]")
            case launch.DryRun(commands):
                print(commands)
            case launch.Forced():
                console.print("[yellow]preflight failed; starting anyway (--force)[/]")
            case launch.Ready(url, served_name, record):
                console.print(Text.assemble(("ready", "green"), f" {url} serves {served_name!r} "
                                            f"(pid {record.pid}, log {record.log})"))
            case launch.Serving(stop_hint):
                console.print(f"stop with `{stop_hint}`", markup=False)
            case launch.Stopped(count, run_dir):
                console.print(f"stopped {count} server(s) recorded in {run_dir}", markup=False)
