"""The stamp check against stamps that are wrong in one way, and the import check against a package whose patched
module raises (run for real in a subprocess of this interpreter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testing.cli import run_apply
from testing.preflight import assert_status, context, profile_at

from rigstack.preflight import package
from rigstack.preflight.core import Status
from rigstack.stack import load_stack
from rigstack.stamp import STAMP_NAME, Stamp, StampedPatch, write_stamp
from rigstack.versions import load_pins

PINS = load_pins()
STACK = load_stack()


def fake_package(root: Path, **changes: object) -> Path:
    pkg = root / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    fields = {"tool_version": "0.1.0", "vllm_version": PINS.vllm_version, "flavour": "cpu", "source": "dir:x",
              "baseline_fingerprint": PINS.fingerprint("cpu"), "baseline_commit": "0" * 40, "head_commit": "1" * 40,
              "stack_hash": STACK.stack_hash,
              "patches": tuple(StampedPatch(id=p.id, file=p.file, sha256=p.sha256, status="applied")
                               for p in STACK.patches)}
    write_stamp(pkg, Stamp(**{**fields, **changes}))
    return pkg


def stamp_result(pkg: Path | None, profile: str = "cpu-tiny"):  # noqa: ANN201
    return package.stamp(context(profile, package=pkg, stack=STACK))


def test_matching_stamp_passes(tmp_path: Path) -> None:
    result = stamp_result(fake_package(tmp_path))
    if PINS.fingerprint("cpu"):
        assert_status(result, Status.PASS, f"{len(STACK.patches)} patches on the pinned baseline")
    else:
        assert_status(result, Status.WARN, "pins no cpu baseline fingerprint")


def test_unstamped_package_fails(tmp_path: Path) -> None:
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    result = stamp_result(pkg)
    assert_status(result, Status.FAIL, "was not patched by rigstack (no stamp)")
    assert result.fix == f"python apply.py apply --from dir:{pkg}"
    assert_status(stamp_result(None), Status.FAIL, "no vllm package found")


@pytest.mark.parametrize(("changes", "words"), [
    ({"stack_hash": "sha256:" + "0" * 64}, ["stamped with another stack"]),
    ({"flavour": "gpu"}, ["is the gpu build, profile cpu-tiny runs the cpu one"]),
    ({"vllm_version": "0.31.0"}, ["package is vLLM 0.31.0, versions.env pins"]),
    ({"patches": (StampedPatch(id="0001", file="0001-x.patch", sha256="0", status="conflict"),)},
     ["patch 0001-x.patch is conflict in the stamp"]),
])
def test_wrong_stamp_fails(tmp_path: Path, changes: dict, words: list[str]) -> None:
    assert_status(stamp_result(fake_package(tmp_path, **changes)), Status.FAIL, *words)


def test_foreign_baseline_fails(tmp_path: Path) -> None:
    if not PINS.fingerprint("cpu"):
        pytest.skip("versions.env pins no cpu fingerprint yet")
    result = stamp_result(fake_package(tmp_path, baseline_fingerprint="sha256:" + "f" * 64))
    assert_status(result, Status.FAIL, "is not the pinned")


def test_offset_patch_warns(tmp_path: Path) -> None:
    if not PINS.fingerprint("cpu") or not STACK.patches:
        pytest.skip("needs a pinned fingerprint and a patch")
    patches = tuple(StampedPatch(id=p.id, file=p.file, sha256=p.sha256, status="offset" if i == 0 else "applied")
                    for i, p in enumerate(STACK.patches))
    assert_status(stamp_result(fake_package(tmp_path, patches=patches)), Status.WARN, "applied at an offset")


def test_patched_module_that_raises_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGSTACK_CACHE", str(tmp_path / "cache"))
    touched = next((path for patch in STACK.patches for path in patch.touched_files if path.endswith(".py")), None)
    if touched is None:
        pytest.skip("the stack touches no python module")
    pkg = tmp_path / "site" / "vllm"
    module = pkg / touched
    module.parent.mkdir(parents=True)
    for folder in [pkg, *module.relative_to(pkg).parents]:
        (pkg / folder / "__init__.py").touch()
    module.write_text("raise RuntimeError('boom at import')\n")
    name = "vllm." + touched[:-3].replace("/", ".")
    result = package.imports(context("cpu-tiny", package=pkg))
    assert_status(result, Status.FAIL, f"{name} does not import (1 of 1 broken): RuntimeError: boom at import")
    assert not (tmp_path / "cache" / "preflight").exists()  # a failure is retried next run, never cached


@pytest.mark.parametrize(("capability", "present", "status", "words"), [
    (8.0, [], Status.FAIL, "sm_80 needs the SM8x fallbacks"),
    (8.9, ["v1/attention/backends/mla/triton_mla_sparse.py", "v1/attention/ops/triton_sparse_mla_sm8x.py"],
     Status.FAIL, "vllm/v1/attention/ops/triton_indexer_sm8x.py is missing"),
    (8.9, list(package.SM8X_FALLBACKS)[:3], Status.PASS, "SM8x fallbacks present for sm_89"),
    (8.0, list(package.SM8X_FALLBACKS), Status.PASS, "SM8x fallbacks present for sm_80"),
    (12.0, [], Status.SKIP, "upstream"),
])
def test_sm8x_rigs_need_the_fallbacks(tmp_path: Path, capability: float, present: list[str], status: Status,
                                     words: str) -> None:
    pkg = fake_package(tmp_path)
    for path in present:
        (pkg / path).parent.mkdir(parents=True, exist_ok=True)
        (pkg / path).write_text("")
    profile = profile_at(tmp_path, f"extends: cmp170hx-8x-pp8\nhardware:\n  compute_capability: {capability}\n")
    assert_status(package.sm8x_fallbacks(context(profile, package=pkg)), status, words)


def test_the_real_patched_package_has_the_fallbacks() -> None:
    import vllm

    pkg = Path(vllm.__file__).parent
    result = package.sm8x_fallbacks(context("cmp170hx-8x-pp8", package=pkg))
    if (pkg / "rigstack_stamp.json").is_file():
        assert_status(result, Status.PASS, "SM8x fallbacks present for sm_80")
    else:
        assert_status(result, Status.FAIL, "needs the SM8x fallbacks")


@pytest.mark.parametrize(("field", "forged"), [("source", "dir:/somewhere/else/vllm"), ("tool_version", "9.9.9")])
def test_a_forged_stamp_fails_against_the_packages_history(cpu_package: Path, two_patches: Path, field: str,
                                                           forged: str) -> None:
    """Issue 37 item 5: preflight read the stamp file alone, so an edited one passed where status and apply refuse
    it. A package patched for real (its git history beside it), then its stamp edited in one field."""
    assert run_apply("apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches)).returncode == 0
    stack = load_stack(two_patches)
    assert package.stamp(context("cpu-tiny", package=cpu_package, stack=stack)).status is Status.PASS
    path = cpu_package / STAMP_NAME
    path.write_text(json.dumps({**json.loads(path.read_text()), field: forged}))
    result = package.stamp(context("cpu-tiny", package=cpu_package, stack=stack))
    assert_status(result, Status.FAIL, f"stamp disagrees with its git history ({field})")
