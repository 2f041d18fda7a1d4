"""rigstack.profiles: every shipped profile validates; extends merges; errors name file, line and key."""

from __future__ import annotations

import time
from pathlib import Path

import pydantic
import pytest
import yaml

from rigstack.errors import UserError
from rigstack.profiles import PROFILES_DIR, list_profiles, load_profile, model_dir, resolved_dict
from rigstack.tinymodel import tiny_model_dir

SHIPPED = ["cmp170hx-6x-pp6", "cmp170hx-8x-pp8", "cpu-tiny", "cpu-tiny-2hosts-pp2", "cpu-tiny-a", "cpu-tiny-b",
           "cpu-tiny-docker", "cpu-tiny-pp2", "cpu-tiny-replicas", "glm53-cmp170hx-2x5-pp10", "glm53-cmp170hx-2x8-pp16",
           "glm53-cmp170hx-pp10", "glm53-cmp170hx-pp8", "glm53-cmp170hx-pp9", "l40-8x-tp8", "rtxpro6000-1x-offload",
           "rtxpro6000-tp2-replicas", "rtxpro6000-tp4-qwen38-flash-next"]

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
    def own(name: str) -> tuple[int, ...]:  # the layout the overlay's own file states
        return tuple(yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())["parallel"]["partition"])

    six = load_profile("cmp170hx-6x-pp6")
    assert six.parallel.partition == own("cmp170hx-6x-pp6") != own("cmp170hx-8x-pp8") and six.parallel.pp == 6
    assert six.env["VLLM_PP_MAX_DECODE_REQS_PER_BATCH"] == "4"
    assert six.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # inherited from the 8-card base
    assert "kernel-config" not in six.vllm  # null in the overlay removes the base's flag
    assert six.vllm["enable-prefix-caching"] is False
    assert six.source_files == (str(PROFILES_DIR / "cmp170hx-8x-pp8.yaml"), str(PROFILES_DIR / "cmp170hx-6x-pp6.yaml"))
    assert load_profile("glm53-cmp170hx-pp10").parallel.partition == own("glm53-cmp170hx-pp10")
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
    ("tensor-parallel-size: 2", "vllm.tensor-parallel-size: --tensor-parallel-size is rendered from parallel.tp; "
     "set that instead"),
    ("hos: 9.9.9.9", "vllm.hos: --host is rendered from host; set that instead"),  # argparse reads it as --host
    ("served-model: x", "vllm.served-model: --served-model-name is rendered from model.served_name; set that instead"),
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


# --- hostile and mistyped files fail at once, named (issue 11, item 14) -----------------------------------------


def fails_fast(path: Path) -> str:
    began = time.process_time()  # CPU time: a loaded CI box stretches the wall clock, not the work
    message = error_of(path)
    assert time.process_time() - began < 1.0, message
    return message


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    # Seven levels of nine aliases each: 4.8 million values in memory, 300 bytes on disk.
    lines = ['x0: &a0 "lol"'] + [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 8)]
    path = write(tmp_path, "bomb", BASE + "\n".join(lines) + "\n")
    assert fails_fast(path).startswith(f"{path}:25: more than 10,000 values once YAML aliases are expanded")
    shared = write(tmp_path, "shared", BASE.replace("  CUDA_DEVICE_ORDER: PCI_BUS_ID", "  CUDA_DEVICE_ORDER: &o PCI")
                   + "  tokenizer-mode: *o\n")
    assert load_profile(shared).vllm["tokenizer-mode"] == "PCI"  # a plain alias is still fine


def test_deep_nesting_is_refused_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "deep", BASE + "  kernel-config: " + "[" * 5000 + "]" * 5000 + "\n")
    assert fails_fast(path) == f"{path}:20: nested more than 32 levels deep (profiles need four); flatten it"
    mapping = write(tmp_path, "deepmap", BASE + "  kernel-config: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n")
    assert "nested more than 32 levels deep" in fails_fast(mapping)


@pytest.mark.parametrize(("text", "expected"), [
    ("parallel:\n  replicas: 200000000\n", ":3: parallel.replicas: Input should be less than or equal to 1024"),
    ("hardware:\n  shm_gib: .inf\n", ":3: hardware.shm_gib: inf is not a finite number"),
    ("hardware:\n  memory_gib: 1.0e+400\n", ":3: hardware.memory_gib: inf is not a finite number"),
    # YAML 1.1 reads 1e400 (no dot) as text, which strict typing no longer turns into a number
    ("hardware:\n  memory_gib: 1e400\n", ':3: hardware.memory_gib: Input should be a valid number, not the text '
     '"1e400"'),
    ("kv:\n  reserve_gib_per_gpu: .nan\n", ":3: kv.reserve_gib_per_gpu: nan is not a finite number"),
    ("vllm:\n  max-num-seqs: 1.0e+400\n", ":3: vllm.max-num-seqs: inf is not a finite number"),
    ("vllm:\n  max-num-seqs: 1e400\n", ":3: vllm.max-num-seqs: 1e400 is not a finite number"),  # text to YAML
    ("vllm:\n  kernel-config: {scale: -.inf}\n", ":3: vllm.kernel-config.scale: -inf is not a finite number"),
    # issue 39 item 12: 0 divided by zero in the planner, -5 passed kv-room, "1e20" crashed int() in the planner
    ("vllm:\n  max-model-len: 0\n", ":3: vllm.max-model-len: 0 is not a whole number of at least 1; write it out"),
    ("vllm:\n  max-model-len: -5\n", ":3: vllm.max-model-len: -5 is not a whole number of at least 1"),
    ("vllm:\n  max-model-len: 1e20\n", ":3: vllm.max-model-len: '1e20' is not a whole number of at least 1"),
    ("vllm:\n  max-num-seqs: true\n", ":3: vllm.max-num-seqs: True is not a whole number of at least 1"),
    ("kv:\n  layers: " + "9" * 30 + "\n", ":3: kv.layers: a 30-digit number is out of range"),
    ("kv:\n  layers: " + "9" * 5000 + "\n", ": a value cannot be read (Exceeds the limit (4300 digits)"),
    ("health_timeout_s: 99999999999\n", ":2: health_timeout_s: Input should be less than or equal to 604800"),
    ('env:\n  FOO: "a\\0b"\n', ":3: a value holds the control character '\\x00'; remove it"),
    ('description: "ring \\a the bell"\n', ":2: a value holds the control character '\\x07'; remove it"),
])
def test_numbers_and_characters_no_rig_needs(tmp_path: Path, text: str, expected: str) -> None:
    """Each of these once passed the loader and failed later: a dry run that never ended, an OverflowError in a
    preflight check, a ValueError from exec() at launch."""
    path = write(tmp_path, "bad", "extends: cpu-tiny\n" + text)
    assert fails_fast(path).startswith(f"{path}{expected}")


# --- no value becomes a flag of its own (issue 11, item 15) -----------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ('vllm:\n  dtype: [bf16, "--port", "9999", "--model", "/evil", "--trust-remote-code"]\n',
     ":3: vllm.dtype: value '--port' starts with '-', so vLLM would read it as a flag of its own"),
    ('vllm:\n  tokenizer: "--trust-remote-code"\n', ":3: vllm.tokenizer: value '--trust-remote-code' starts"),
    ("vllm:\n  compilation-config: -O3\n", ":3: vllm.compilation-config: value '-O3' starts with '-'"),
    ("vllm:\n  ignore-patterns: [a, [b]]\n", ":3: vllm.ignore-patterns: a list of values holds plain strings"),
    ("vllm:\n  ignore-patterns: [a, true]\n", ":3: vllm.ignore-patterns: a list of values holds plain strings"),
    ('model:\n  path: tiny:dense\n  served_name: "--trust-remote-code"\n',
     ":4: model.served_name: '--trust-remote-code' starts with '-', so it would reach the command line as an"),
    ('host: "--privileged"\n', ":2: host: '--privileged' starts with '-'"),
    ('image: "--privileged"\n', ":2: image: '--privileged' starts with '-'"),
    ('docker:\n  ipc: "--pid=host"\n', ":3: docker.ipc: '--pid=host' starts with '-'"),
])
def test_values_that_read_as_options_are_refused(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, "bad", "extends: cpu-tiny\n" + text)
    assert fails_fast(path).startswith(f"{path}{expected}")


def test_negative_numbers_are_values(tmp_path: Path) -> None:
    path = write(tmp_path, "neg", "extends: cpu-tiny\nvllm:\n  seed: -1\n  logits-processors: ['-2', -0.5]\n")
    assert load_profile(path).vllm["seed"] == -1
