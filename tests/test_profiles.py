"""rigstack.profiles: every shipped profile validates; extends merges; errors name file, line and key."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from rigstack.errors import UserError
from rigstack.profiles import PROFILES_DIR, list_profiles, load_profile, model_dir, resolved_dict
from rigstack.tinymodel import tiny_model_dir

SHIPPED = ["cmp170hx-6x-pp6", "cmp170hx-8x-pp8", "cpu-tiny", "cpu-tiny-pp2", "glm53-cmp170hx-pp10",
           "glm53-cmp170hx-pp8", "glm53-cmp170hx-pp9", "l40-8x-tp8", "rtxpro6000-1x-offload",
           "rtxpro6000-tp2-replicas"]

BASE = """\
description: a test rig
hardware:
  gpu_name: CMP 170HX
  memory_gib: 64
model:
  path: /data/models/m
  served_name: m
  shape:
    num_hidden_layers: 45
parallel:
  pp: 2
  partition: [40, 5]
env:
  CUDA_DEVICE_ORDER: PCI_BUS_ID
  VLLM_PP_MAX_DECODE_REQS_PER_BATCH: 2
vllm:
  max-model-len: 4096
  enable-prefix-caching: false
  kernel-config: {moe_backend: marlin}
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def error_of(path: Path | str) -> str:
    with pytest.raises(UserError) as caught:
        load_profile(path)
    return str(caught.value)


def test_every_shipped_profile_validates() -> None:
    assert list_profiles() == SHIPPED
    for name in SHIPPED:
        profile = load_profile(name)
        assert profile.name == name and profile.description
        if profile.parallel.partition:
            assert len(profile.parallel.partition) == profile.parallel.pp
            assert sum(profile.parallel.partition) == profile.model.shape.num_hidden_layers


def test_seed_layouts_survive_the_overlays() -> None:
    six = load_profile("cmp170hx-6x-pp6")
    assert six.parallel.partition == (9, 7, 9, 7, 9, 4) and six.parallel.pp == 6
    assert six.env["VLLM_PP_MAX_DECODE_REQS_PER_BATCH"] == "4"
    assert six.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # inherited from the 8-card base
    assert "kernel-config" not in six.vllm  # null in the overlay removes the base's flag
    assert six.vllm["enable-prefix-caching"] is False
    assert six.source_files == (str(PROFILES_DIR / "cmp170hx-8x-pp8.yaml"), str(PROFILES_DIR / "cmp170hx-6x-pp6.yaml"))
    assert load_profile("glm53-cmp170hx-pp10").parallel.partition == (10, 8, 8, 8, 8, 8, 8, 8, 8, 4)
    assert load_profile("glm53-cmp170hx-pp9").vllm["gpu-memory-utilization"] == 0.93
    pp2 = load_profile("cpu-tiny-pp2")
    assert (pp2.parallel.pp, pp2.env["VLLM_CPU_OMP_THREADS_BIND"], pp2.flavour) == (2, "0|1", "cpu")
    assert pp2.gpus_needed == 0 and load_profile("rtxpro6000-tp2-replicas").gpus_needed == 4


def test_extends_merges_mappings_and_replaces_lists(tmp_path: Path) -> None:
    write(tmp_path, "base", BASE)
    path = write(tmp_path, "over", "extends: base\nparallel:\n  partition: [30, 15]\nenv:\n"
                                    "  VLLM_PP_MAX_DECODE_REQS_PER_BATCH: null\nvllm:\n  max-num-seqs: 8\n")
    profile = load_profile(path)
    assert profile.name == "over" and profile.parallel.pp == 2 and profile.parallel.partition == (30, 15)
    assert profile.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert profile.vllm == {"max-model-len": 4096, "enable-prefix-caching": False,
                            "kernel-config": {"moe_backend": "marlin"}, "max-num-seqs": 8}
    assert resolved_dict(profile)["parallel"]["partition"] == [30, 15]


def test_profiles_are_frozen(tmp_path: Path) -> None:
    profile = load_profile(write(tmp_path, "base", BASE))
    with pytest.raises(pydantic.ValidationError):
        profile.port = 1  # type: ignore[misc]


def test_misspelt_key_names_file_line_and_suggests(tmp_path: Path) -> None:
    path = write(tmp_path, "bad", BASE.replace("  memory_gib: 64", "  memory_gb: 64"))
    assert error_of(path) == (f"{path}:4: hardware.memory_gb: unknown key; did you mean 'memory_gib'?; "
                              "fix the profile")


def test_error_in_an_overlay_points_at_the_overlay_line(tmp_path: Path) -> None:
    write(tmp_path, "base", BASE)
    path = write(tmp_path, "over", "extends: base\ndescription: over\nparallel:\n  tp: 0\n")
    message = error_of(path)
    assert message.startswith(f"{path}:4: parallel.tp: Input should be greater than or equal to 1")


def test_error_in_the_base_points_at_the_base(tmp_path: Path) -> None:
    base = write(tmp_path, "base", BASE.replace("  served_name: m", "  served_name: [m]"))
    path = write(tmp_path, "over", "extends: base\n")
    assert error_of(path).startswith(f"{base}:7: model.served_name: Input should be a valid string")


def test_partition_must_match_pp(tmp_path: Path) -> None:
    path = write(tmp_path, "bad", BASE.replace("[40, 5]", "[40, 3, 2]"))
    assert error_of(path) == (f"{path}:12: parallel.partition: 3 stages but parallel.pp is 2; give one layer count "
                              "per stage; fix the profile")
    cpu = write(tmp_path, "cpu", BASE.replace("description", "flavour: cpu\ndescription"))
    assert error_of(cpu) == f"{cpu}:4: hardware.gpu_name: a cpu profile matches no GPU; remove it; fix the profile"


@pytest.mark.parametrize(("flag", "expected"), [
    ("--max-num-seqs: 4", "vllm.--max-num-seqs: write long flag names without dashes in front, like 'max-num-seqs'"),
    ("max_num_seqs: 4", "vllm.max_num_seqs: write long flag names without dashes in front, like 'max-num-seqs'"),
    ("tensor-parallel-size: 2", "vllm.tensor-parallel-size: rendered from parallel.tp; set that instead"),
])
def test_vllm_flag_names(tmp_path: Path, flag: str, expected: str) -> None:
    path = write(tmp_path, "bad", BASE + f"  {flag}\n")
    assert error_of(path) == f"{path}:20: {expected}; fix the profile"


def test_env_values(tmp_path: Path) -> None:
    path = write(tmp_path, "bad", BASE.replace("PCI_BUS_ID", "yes"))  # YAML 1.1: yes is a boolean
    assert error_of(path).startswith(f"{path}:14: env.CUDA_DEVICE_ORDER: write the value as a quoted string")
    path = write(tmp_path, "part", BASE.replace("env:\n", "env:\n  VLLM_PP_LAYER_PARTITION: 1,2\n"))
    assert error_of(path) == (f"{path}:14: env.VLLM_PP_LAYER_PARTITION: set parallel.partition instead; "
                              "fix the profile")


def test_duplicate_key_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "dup", BASE + "  max-model-len: 8192\n")
    assert error_of(path) == f"{path}:20: key vllm.max-model-len appears twice; keep one"


def test_broken_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "broken", BASE.replace("  pp: 2", "  pp: [2"))
    assert error_of(path).startswith(f"{path}:12: invalid YAML")


def test_extends_problems(tmp_path: Path) -> None:
    write(tmp_path, "a", "extends: b\n")
    write(tmp_path, "b", "extends: a\n")
    assert "extends loops (a -> b -> a)" in error_of(tmp_path / "a.yaml")
    path = write(tmp_path, "orphan", "extends: cmp170hx-8x-pp9\n")
    assert "no profile named 'cmp170hx-8x-pp9'; did you mean 'cmp170hx-8x-pp8'?" in error_of(path)


def test_loader_keys_and_relative_paths(tmp_path: Path) -> None:
    path = write(tmp_path, "named", "name: other\n" + BASE)
    assert error_of(path) == f"{path}:1: key 'name' is set by the loader (the name is the file name); remove it"
    path = write(tmp_path, "rel", BASE.replace("/data/models/m", "models/m"))
    assert f"{path}:6: model.path: must be an absolute host path or tiny:KIND" in error_of(path)


def test_unknown_profile_name_suggests() -> None:
    assert "did you mean 'cpu-tiny'?" in error_of("cpu-tiy")


def test_tiny_model_path_resolves_without_building() -> None:
    profile = load_profile("cpu-tiny")
    assert profile.model.path == "tiny:dense"
    assert model_dir(profile.model, build=False) == tiny_model_dir("dense")
    assert model_dir(load_profile("l40-8x-tp8").model) == Path("/data/models/GLM-5.3-Flash-NVFP4")
