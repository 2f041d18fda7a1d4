"""Checks of the vllm package: its stamp matches the stack and the pinned baseline; its patched modules import."""

from __future__ import annotations

from rigstack import history
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.preflight.core import Context, Result, check, fail, passed, skip, warn
from rigstack.versions import load_pins

GOOD_STATUSES = ("applied", "offset", "already-applied")


@check("stamp")
def stamp(ctx: Context) -> Result:
    package = ctx.package
    if package is None:
        return fail("no vllm package found", "pass --package PATH (a patched vllm/ folder)")
    apply = f"python apply.py apply --from dir:{package}"
    try:
        found, stack = ctx.stamp, ctx.stack
        pins = load_pins()
    except UserError as error:
        return fail(str(error), "fix the file it names")
    if found is None:
        return fail(f"{package} was not patched by rigstack (no stamp)", apply)
    # The stamp is a file anyone can edit; where the package keeps its history, the history is the record (as
    # status and apply check it).
    checked = history.check(repo, pins) if (repo := PackageRepo(package.resolve())).exists else None
    if checked is not None and checked.wrong is not None:
        return fail(f"{package}'s stamp disagrees with its git history ({checked.wrong}): edited or copied from "
                    "another package", apply)
    if found.flavour != ctx.profile.flavour:
        return fail(f"{package} is the {found.flavour} build, profile {ctx.profile.name} runs the "
                    f"{ctx.profile.flavour} one", "pass --package PATH for the matching build")
    if found.vllm_version != pins.vllm_version:
        return fail(f"package is vLLM {found.vllm_version}, versions.env pins {pins.vllm_version}", apply)
    if found.stack_hash != stack.stack_hash:
        return fail(f"stamped with another stack ({len(found.patches)} patches, {found.stack_hash[:19]}), "
                    f"patches/ is {len(stack.patches)} patches, {stack.stack_hash[:19]}", apply)
    broken = [patch for patch in found.patches if patch.status not in GOOD_STATUSES]
    if broken:
        return fail(f"patch {broken[0].file} is {broken[0].status} in the stamp ({len(broken)} not applied)", apply)
    pinned = pins.fingerprint(found.flavour)
    if not pinned:
        return warn(f"stack {stack.stack_hash[:19]} matches; versions.env pins no {found.flavour} baseline "
                    "fingerprint, so the baseline is unverified", "pin it with `python apply.py port --write`")
    if found.baseline_fingerprint != pinned:
        return fail(f"baseline {found.baseline_fingerprint[:19]} is not the pinned {pinned[:19]}", apply)
    offset = [patch.file for patch in found.patches if patch.status == "offset"]
    if offset:
        return warn(f"{len(offset)} patch(es) applied at an offset, first {offset[0]}",
                    "refresh them: python apply.py export PATH (see patches/README.md)")
    return passed(f"{len(found.patches)} patches on the pinned baseline, stack {stack.stack_hash[:19]}")


def _not_in_cpu_build(module: str) -> bool:
    """A third-party package, or one of vLLM's compiled extensions (their names start with an underscore)."""
    return not module.startswith("vllm.") or module.rsplit(".", 1)[-1].startswith("_")


def wrong_interpreter(ctx: Context) -> Result:
    """vllm itself does not import: the interpreter lacks vLLM's dependencies, so it is not the serving one."""
    knowledge = ctx.knowledge
    return fail(f"{knowledge.python} cannot import vllm from {ctx.package}: it has no {knowledge.lacks} module, so "
                "it is not an interpreter that can serve this package",
                "pass --python PATH of the interpreter that serves it (the venv with vLLM's dependencies), "
                "or run preflight.py with that interpreter")


@check("imports", slow=True)
def imports(ctx: Context) -> Result:
    knowledge = ctx.knowledge
    if knowledge.lacks:
        return wrong_interpreter(ctx)
    broken = knowledge.broken
    # On the cpu twin the GPU code cannot import, with or without the stack: it needs packages the cpu build does
    # not install (torchvision) or compiled extensions only the GPU wheel has (vllm._C_stable_libtorch). A cpu
    # profile never loads it. Anywhere else, and for any other missing module, the import failure counts.
    absent = {name: needs for name, needs in knowledge.missing.items()
              if ctx.profile.flavour == "cpu" and _not_in_cpu_build(needs)}
    real = {name: error for name, error in broken.items() if name not in absent}
    if real:
        name, error = next(iter(real.items()))
        return fail(f"{name} does not import ({len(real)} of {len(knowledge.imports)} broken): {error}",
                    f"python apply.py status {ctx.package}, then re-apply the stack")
    if knowledge.error:
        return fail(f"vllm does not import: {knowledge.error}", "check the package's interpreter and dependencies")
    cached = ", cached" if knowledge.cached else ""
    gpu_only = (f"; {len(absent)} GPU-only module(s) need {', '.join(sorted(set(absent.values())))}, absent on "
                "this cpu build") if absent else ""
    importable = len(knowledge.imports) - len(absent)
    return passed(f"vllm {knowledge.version} and {importable} patched module(s) import{cached}{gpu_only}")


# What the SM8x fallbacks (patches 0008-0010) add, and below which compute capability each one is needed: vLLM 0.32.0
# ranks sparse-MLA backends only for SM9x+ and stores FP8 from Triton only on sm_89+, so without them GLM-5.3(-Flash)
# does not start ("No valid attention backend found").
SM8X_FALLBACKS = {
    "v1/attention/backends/mla/triton_mla_sparse.py": 9.0,
    "v1/attention/ops/triton_sparse_mla_sm8x.py": 9.0,
    "v1/attention/ops/triton_indexer_sm8x.py": 9.0,
    "v1/attention/ops/fp8_e4m3_sw.py": 8.9,
}


@check("sm8x-fallbacks")
def sm8x_fallbacks(ctx: Context) -> Result:
    capability = ctx.profile.hardware.compute_capability
    if capability is None or capability >= 9.0:
        return skip("the rig's GPUs have sparse-MLA backends and FP8 upstream")
    if ctx.package is None:
        return fail("no vllm package found", "pass --package PATH (a patched vllm/ folder)")
    missing = [path for path, below in SM8X_FALLBACKS.items() if capability < below and
               not (ctx.package / path).is_file()]
    if missing:
        return fail(f"sm_{capability * 10:.0f} needs the SM8x fallbacks, but vllm/{missing[0]} is missing "
                    f"({len(missing)} of {len(SM8X_FALLBACKS)} files)",
                    f"python apply.py apply --from dir:{ctx.package}")
    return passed(f"SM8x fallbacks present for sm_{capability * 10:.0f}")
