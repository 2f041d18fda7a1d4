"""The launchers on the terminal: preflight's report, the staged wait live (a spinner per stage with the server log's
newest line under it), the log tail of a server that died, a SIGKILL, the dry run's commands (stdout, to paste),
ready, stopped."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import RenderableType
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from rigstack.cli import console
from rigstack.fleetlaunch import FleetPreflighted, GatewayReady
from rigstack.launch import Preflighted
from rigstack.output.preflight import print_fleet_report, print_report
from rigstack.serving import events


class _BootProgress(Progress):
    """The staged progress with the server log's newest line under it."""

    log_line = ""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.log_line:
            yield Text(f"  {self.log_line}", style="dim", no_wrap=True, overflow="ellipsis")


class LaunchView:
    """The on_event a command passes to the launchers; one per command run (it holds the live wait)."""

    def __init__(self) -> None:
        self._progress: _BootProgress | None = None
        self._task: tuple[str, TaskID] | None = None

    def __call__(self, event: events.Event | Preflighted | FleetPreflighted | GatewayReady) -> None:
        match event:
            case events.WaitStarted(record):
                console.print(f"server log: {record.log}", markup=False)
                self._progress = _BootProgress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                                               TimeElapsedColumn(), console=console, transient=True)
                self._progress.start()
            case events.Waiting(stage, log_line) if self._progress is not None:
                if self._task is None or self._task[0] != stage:
                    self._task = (stage, self._progress.add_task(f"waiting for {stage}"))
                self._progress.log_line = log_line
            case events.StagePassed(stage, after_s) if self._progress is not None:
                if self._task is not None:
                    self._progress.remove_task(self._task[1])
                    self._task = None
                console.print(f"[green]ok[/] {stage} after {after_s:.1f} s")
            case events.WaitEnded() if self._progress is not None:
                self._progress.stop()
                self._progress, self._task = None, None
            case events.Died(log, tail):
                console.print(f"--- last lines of {log} ---\n{tail}\n---", markup=False, style="dim")
            case events.Killing(pgid, grace_s):
                console.print(f"[yellow]server group {pgid} ignored SIGTERM for {grace_s:.0f} s; sending SIGKILL[/]")
            case events.DryRun(commands):
                print(commands)
            case Preflighted(report):
                print_report(report, as_json=False)
            case FleetPreflighted(report):
                print_fleet_report(report, as_json=False)
            case events.Forced():
                console.print("[yellow]preflight failed; starting anyway (--force)[/]")
            case events.Ready(url, served_name, record):
                console.print(Text.assemble(("ready", "green"), f" {url} serves {served_name!r} "
                                            f"(pid {record.pid}, log {record.log})"))
            case GatewayReady(url, served, record):
                console.print(Text.assemble(("gateway", "green"), f" {url} routes {', '.join(map(repr, served))} "
                                            f"by model (pid {record.pid}, log {record.log})"))
            case events.Serving(stop_hint):
                console.print(f"stop with `{stop_hint}`", markup=False)
            case events.Stopped(count, run_dir):
                console.print(f"stopped {count} server(s) recorded in {run_dir}", markup=False)
