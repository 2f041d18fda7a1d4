"""Stopping a workload that only fails: after N failed requests in a row the rest of it is not sent.

A server that failed every request so far will most likely fail the next, and each failure can cost a whole
--timeout (15 planned requests at a 6 s deadline were 90 s of nothing). N in a row, not N in all: a server that
fails now and then still gets every request, and its failures are counted as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

STOP_AFTER = 3  # the default of --stop-after-failures; 0 sends every request whatever happens


@dataclass
class Streak:
    limit: int = STOP_AFTER
    run: int = 0  # failures in a row so far

    def record(self, ok: bool) -> None:
        self.run = 0 if ok else self.run + 1

    @property
    def over(self) -> bool:
        """Whether the workload must stop sending."""
        return self.limit > 0 and self.run >= self.limit


def stopped_note(what: str, limit: int, not_sent: int, planned: int) -> str:
    return (f"{what}: stopped after {limit} failed requests in a row; {not_sent} of its {planned} planned requests "
            "were not sent (--stop-after-failures 0 sends them all)")
