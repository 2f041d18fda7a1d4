"""Flags and env vars against the real vLLM's parser and envs.py, flag combinations, production switches and
licences: each fed a profile that is wrong in one way."""

from __future__ import annotations

from pathlib import Path

import pytest
from testing.preflight import assert_status, context, profile_at, vllm_knowledge  # noqa: F401 - a fixture

from rigstack.preflight import settings
from rigstack.preflight.core import Status
from rigstack.preflight.knowledge import Knowledge
from rigstack.profiles import list_profiles, load_profile
from rigstack.stack import load_stack

STACK = load_stack()


def known(profile, knowledge: Knowledge, **kwargs):  # noqa: ANN001, ANN201
    return context(profile, knowledge=knowledge, stack=STACK, **kwargs)


def test_every_shipped_profile_uses_only_real_flags(vllm_knowledge: Knowledge) -> None:  # noqa: F811
    for name in list_profiles():
        assert_status(settings.flags(known(name, vllm_knowledge)), Status.PASS, "flag(s) known to vLLM")


@pytest.mark.parametrize(("flags", "words"), [
    ("max-num-seq: 4", ["--max-num-seq is not a vLLM flag (did you mean max-num-seqs?)"]),
    ("kv-cache-dtype: fp9", ["--kv-cache-dtype fp9 is not one of"]),
    ("enable-auto-tool-choice: 3", ["--enable-auto-tool-choice is a switch; write true or false, not 3"]),
    # (max-model-len: true no longer loads: the profile refuses KV-sizing flags that are not whole numbers)
    ("max-logprobs: true", ["--max-logprobs needs a value, not true"]),
    ("enable-auto-tool-choice: false", []),  # vLLM 0.34.0 pairs it with --disable-auto-tool-choice
    # A list renders as one argv word per item; vLLM's parser says how many words each flag takes (its nargs).
    ("dtype: [bfloat16, float16]", ["--dtype takes one value, not a list of 2"]),
    ("ignore-patterns: ['*.pt', '*.bin']", []),  # nargs="+"
    ("ignore-patterns: []", ["--ignore-patterns needs at least one value, not an empty list"]),
])
def test_bad_flags_fail(tmp_path: Path, vllm_knowledge: Knowledge, flags: str, words: list[str]) -> None:  # noqa: F811
    profile = profile_at(tmp_path, f"extends: cpu-tiny\nvllm:\n  {flags}\n")
    result = settings.flags(known(profile, vllm_knowledge))
    assert_status(result, Status.FAIL if words else Status.PASS, *words)


def test_flag_without_a_no_form(vllm_knowledge: Knowledge) -> None:  # noqa: F811
    switches = [name for name, flag in vllm_knowledge.flags.items()
                if not flag.takes_value and not name.startswith("no-") and f"no-{name}" not in vllm_knowledge.flags
                and name != "help"]
    assert switches, "vLLM has no plain store_true flag left to test with"
    problems = settings.flag_problems({switches[0]: False}, vllm_knowledge.flags)
    assert problems == [f"--{switches[0]} has no --no-{switches[0]} form; remove the key to keep the default"]


def test_unknown_env_var_fails(tmp_path: Path, vllm_knowledge: Knowledge) -> None:  # noqa: F811
    profile = profile_at(tmp_path, "extends: cpu-tiny\nenv:\n  VLLM_CPU_KVCACHE_SPAC: '1'\n  NCCL_DEBUG: INFO\n")
    result = settings.env(known(profile, vllm_knowledge))
    assert_status(result, Status.FAIL, "VLLM_CPU_KVCACHE_SPAC (did you mean VLLM_CPU_KVCACHE_SPACE?)")
    assert "NCCL_DEBUG" not in result.reason  # NCCL's own variables are allowed by prefix


def test_known_env_vars_pass(tmp_path: Path, vllm_knowledge: Knowledge) -> None:  # noqa: F811
    assert_status(settings.env(known("cpu-tiny-pp2", vllm_knowledge)), Status.PASS, "3 env var(s) known")
    # A patch's Switch: header makes its variable known, though vllm/envs.py has never heard of it.
    own = sorted(STACK.switches() - vllm_knowledge.env)
    if not own:
        pytest.skip("no stack switch outside vllm/envs.py")
    profile = profile_at(tmp_path, f"extends: cpu-tiny\nenv:\n  {own[0]}: '1'\n")
    assert_status(settings.env(known(profile, vllm_knowledge)), Status.PASS, "2 env var(s) known")


@pytest.mark.parametrize(("overlay", "status", "words"), [
    ("vllm:\n  enable-prefix-caching: null\n", Status.FAIL, ["DFlash with prefix caching corrupts output"]),
    ("vllm:\n  async-scheduling: false\n", Status.FAIL, ["PP + DFlash2 without async scheduling asserts"]),
    ("vllm:\n  kv-cache-dtype: fp8_ds_mla\n  block-size: 64\n", Status.FAIL, ["fp8_ds_mla KV needs block size 128"]),
    ("vllm:\n  gpu-memory-utilization: 0.96\n", Status.WARN, ["gpu-memory-utilization >= 0.95"]),
])
def test_broken_combinations(tmp_path: Path, overlay: str, status: Status, words: list[str]) -> None:
    profile = profile_at(tmp_path, "extends: cmp170hx-8x-pp8\n" + overlay)
    assert_status(settings.compat(context(profile)), status, *words)
    assert_status(settings.compat(context("cmp170hx-8x-pp8")), Status.PASS, "5 flag-combination rules hold")


def test_cpu_core_groups_must_match_the_workers(tmp_path: Path) -> None:
    three = profile_at(tmp_path, "extends: cpu-tiny-pp2\nenv:\n  VLLM_CPU_OMP_THREADS_BIND: '0|1|0'\n")
    assert_status(settings.compat(context(three)), Status.FAIL, "one core group per worker")
    assert_status(settings.compat(context("cpu-tiny-pp2")), Status.PASS)
    assert_status(settings.compat(context("cpu-tiny")), Status.PASS)


def test_production_switches(tmp_path: Path) -> None:
    pp8 = context("cmp170hx-8x-pp8", stack=STACK)
    assert_status(settings.switches(pp8), Status.PASS, "VLLM_PP_MAX_DECODE_REQS_PER_BATCH=2")
    off = profile_at(tmp_path, "extends: cmp170hx-8x-pp8\nenv:\n  VLLM_PP_MAX_DECODE_REQS_PER_BATCH: '0'\n")
    assert_status(settings.switches(context(off, stack=STACK)), Status.FAIL, "VLLM_PP_MAX_DECODE_REQS_PER_BATCH is 0",
                  "117 instead of 260 tok/s")
    unset = profile_at(tmp_path, "extends: cmp170hx-8x-pp8\nenv:\n  VLLM_PP_MAX_DECODE_REQS_PER_BATCH: null\n",
                       name="unset")
    assert_status(settings.switches(context(unset, stack=STACK)), Status.FAIL, "is unset")
    fused = context("cmp170hx-8x-pp8", stack=STACK, environ={"VLLM_ENABLE_FUSED_DRAFT": "1"})
    assert_status(settings.switches(fused), Status.FAIL, "VLLM_ENABLE_FUSED_DRAFT=1 crashes")
    assert settings.switches(context("cpu-tiny-pp2", stack=STACK)).status is Status.SKIP


def test_switch_the_stack_lacks_is_not_required() -> None:
    # Seed 002's sidecar block size: no patch of the stack reads it (see patch 0006), so it cannot be demanded.
    if "VLLM_GLM5N_SIDECAR_BLOCK_SIZE" in STACK.switches():
        pytest.skip("a patch now declares the sidecar switch")
    result = settings.switches(context("cmp170hx-8x-pp8", stack=STACK))
    assert_status(result, Status.PASS)
    assert "SIDECAR" not in result.reason


def test_drafter_licence_needs_acknowledgement() -> None:
    result = settings.licence(context("glm53-cmp170hx-pp8"))
    assert_status(result, Status.FAIL, "the drafter is licensed CC-BY-NC-ND-4.0 (non-commercial)")
    assert result.fix == "read the CC-BY-NC-ND-4.0 licence, then: export DFLASH_LICENSE_ACK=1"
    wrong = context("glm53-cmp170hx-pp8", environ={"DFLASH_LICENSE_ACK": "yes"})
    assert settings.licence(wrong).status is Status.FAIL
    ok = context("glm53-cmp170hx-pp8", environ={"DFLASH_LICENSE_ACK": "1"})
    assert_status(settings.licence(ok), Status.PASS, "drafter CC-BY-NC-ND-4.0 (non-commercial), acknowledged")
    assert settings.licence(context("l40-8x-tp8")).status is Status.SKIP
    assert load_profile("l40-8x-tp8").drafter is None  # the commercial L40 stack uses MTP, not the drafter
