"""vLLM configs built as the rigs' package builds them, also on the CPU twin.

On the twin (x86 without triton-cpu, rigstack/twin.py) vLLM validates a config against its standalone CPU runner and
refuses what that runner lacks, speculative decoding among it. The rigs run the V2 GPU runner, which refuses none of
it: code that only builds a config to ask vLLM what it would do (the planner, in-process tests) builds it inside
rigs_runner(). A server that must run such a config on the twin runs the V2 runner under Triton's interpreter
(TRITON_INTERPRET=1, twin/0005).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def rigs_runner() -> Iterator[None]:
    """Inside, vLLM's platform says the V2 runner serves (uses_standalone_cpu_model_runner is False)."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    saved = platform.__dict__.get("uses_standalone_cpu_model_runner")
    if saved is None:  # a vLLM with no standalone runner: nothing to do
        yield
        return
    platform.uses_standalone_cpu_model_runner = classmethod(lambda cls: False)
    try:
        yield
    finally:
        platform.uses_standalone_cpu_model_runner = saved
