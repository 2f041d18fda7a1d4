"""Model config shape, weight files and size, partition, KV room and disk: each fed a model folder or profile
that is wrong in one way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testing.preflight import assert_status, context, profile_at

from rigstack.preflight import model
from rigstack.planner.config import shape_known
from rigstack.profiles import model_dir
from rigstack.preflight.core import Status

TINY_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 256, "num_hidden_layers": 4,
               "vocab_size": 4106, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}


def model_folder(root: Path, config: dict | None = None, weights: dict[str, int] | None = None,
                 index: list[str] | None = None) -> Path:
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG if config is None else config))
    for name, size in (weights if weights is not None else {"model.safetensors": 8_930_000}).items():
        with open(folder / name, "wb") as handle:
            handle.truncate(size)  # sparse: the checks read sizes, not contents
    if index is not None:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            f"w{i}": name for i, name in enumerate(index)}}))
    return folder


def test_matching_model_passes(tmp_path: Path) -> None:
    ctx = context("cpu-tiny", model=model_folder(tmp_path))
    assert_status(model.model(ctx), Status.PASS, "shape matches; 1 weight file(s)")


@pytest.mark.parametrize(("change", "words"), [
    ({"hidden_size": 512}, ["hidden_size 512 (want 256)"]),
    ({"architectures": ["LlamaForCausalLM"]}, ["architectures ['LlamaForCausalLM']"]),
    ({"num_hidden_layers": 3, "vocab_size": 32000}, ["num_hidden_layers 3 (want 4)", "vocab_size 32000 (want 4106)"]),
])
def test_wrong_shape_fails(tmp_path: Path, change: dict, words: list[str]) -> None:
    ctx = context("cpu-tiny", model=model_folder(tmp_path, {**TINY_CONFIG, **change}))
    assert_status(model.model(ctx), Status.FAIL, "config.json does not match the profile", *words)


def test_shape_read_from_text_config(tmp_path: Path) -> None:
    nested = {"architectures": TINY_CONFIG["architectures"], "text_config": TINY_CONFIG}
    assert_status(model.model(context("cpu-tiny", model=model_folder(tmp_path, nested))), Status.PASS)


def test_missing_or_partial_weights_fail(tmp_path: Path) -> None:
    assert_status(model.model(context("cpu-tiny", model=tmp_path / "nowhere")), Status.FAIL,
                  f"model folder {tmp_path}/nowhere not found")
    (tmp_path / "a").mkdir()
    empty = model_folder(tmp_path / "a", weights={})
    assert_status(model.model(context("cpu-tiny", model=empty)), Status.FAIL, "no weight files")
    (tmp_path / "b").mkdir()
    shards = model_folder(tmp_path / "b", weights={"m-1.safetensors": 5_000_000},
                          index=["m-1.safetensors", "m-2.safetensors"])
    assert_status(model.model(context("cpu-tiny", model=shards)), Status.FAIL, "1 shard(s) in the index missing",
                  "m-2.safetensors")
    (tmp_path / "c").mkdir()
    small = model_folder(tmp_path / "c", weights={"model.safetensors": 1_000_000})
    assert_status(model.model(context("cpu-tiny", model=small)), Status.FAIL, "partial download")
    (tmp_path / "d").mkdir()
    broken = model_folder(tmp_path / "d")
    (broken / "config.json").write_text("{not json")
    assert_status(model.model(context("cpu-tiny", model=broken)), Status.FAIL, "missing or not JSON")


def test_unbuilt_tiny_model_names_the_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGSTACK_CACHE", str(tmp_path))
    from rigstack.profiles import load_profile, model_dir

    profile = load_profile("cpu-tiny")
    result = model.model(context(profile, model=model_dir(profile.model, build=False)))
    assert_status(result, Status.FAIL, "the tiny model is not built yet")
    assert result.fix == "python scripts/make_tiny_model.py --kind dense"


def test_drafter_is_checked_like_the_model(tmp_path: Path) -> None:
    assert model.drafter(context("cpu-tiny")).status is Status.SKIP
    result = model.drafter(context("cmp170hx-8x-pp8"))
    assert_status(result, Status.FAIL, "drafter folder /data/models/GLM-5.3-Flash-DFlash2 not found")


@pytest.mark.parametrize(("partition", "words"), [
    ("[2, 1]", ["sums to 3, the model has 4 layers"]),
    ("[4, 0]", ["has an empty stage"]),
])
def test_bad_partition_fails(tmp_path: Path, partition: str, words: list[str]) -> None:
    profile = profile_at(tmp_path, f"extends: cpu-tiny-pp2\nparallel:\n  partition: {partition}\n")
    assert_status(model.partition(context(profile, model=model_folder(tmp_path))), Status.FAIL, *words)


def test_partition_passes_and_skips(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    assert_status(model.partition(context("cpu-tiny-pp2", model=folder)), Status.PASS, "2 stages, 3,1 = 4 layers")
    assert model.partition(context("cpu-tiny", model=folder)).status is Status.SKIP
    # Without the weights, the profile's own layer count is used: seed 002's partition adds up to 45.
    from rigstack.profiles import load_profile

    shipped = ",".join(map(str, load_profile("cmp170hx-8x-pp8").parallel.partition))
    assert_status(model.partition(context("cmp170hx-8x-pp8")), Status.PASS, f"8 stages, {shipped} = 45 layers")


def test_kv_room(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    ok = model.kv_room(context("cpu-tiny", model=folder))
    # 1 GiB of KV / (2 x 2 heads x 64 x 2 bytes x 4 layers) = 524,288 tokens
    assert_status(ok, Status.PASS, "~524,288 tokens of KV", "2,048 B/token")
    few = profile_at(tmp_path, "extends: cpu-tiny\nvllm:\n  max-model-len: 300000\n  max-num-seqs: 2\n")
    assert_status(model.kv_room(context(few, model=folder)), Status.WARN, "1 of 2 sequences fit at full length")
    none = profile_at(tmp_path, "extends: cpu-tiny\nvllm:\n  max-model-len: 600000\n", name="none")
    assert_status(model.kv_room(context(none, model=folder)), Status.FAIL, "cannot hold one 600,000-token request")


def test_kv_room_on_gpu_rigs_uses_the_planner(tmp_path: Path) -> None:
    # Seed 003's PP8 at 0.96 on the pin without the stack's switches: vLLM's startup check refuses on the first
    # stage that cannot hold one 1M request, the last, where vLLM allocates the DFlash2 drafter's sliding-window KV at
    # full length and which has the fewest blocks.
    bare = profile_at(tmp_path, "extends: glm53-cmp170hx-pp8\nenv:\n  VLLM_SWA_OWN_POOL: '0'\n  "
                                "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB: '512'\nvllm:\n  max-model-len: 1048576\n"
                                "parallel:\n  partition: [11, 10, 10, 10, 10, 10, 9, 8]\n")
    result = model.kv_room(context(bare))
    assert_status(result, Status.FAIL, "vLLM would refuse to start: stage 7 cannot hold one 1,048,576-token request",
                  "stage 7 of 8 has the fewest blocks")
    assert "gpu-memory-utilization" in result.fix and "parallel.partition" in result.fix and "--search" in result.fix
    # As shipped (patch 0016's window, the logits sentinel halved, 768k context) it starts past the planner's error
    # bar: a WARN only against its 8 target requests.
    assert_status(model.kv_room(context("glm53-cmp170hx-pp8")), Status.WARN, "planned pool 1,167,360 tokens",
                  "1.48 of 8 target requests fit at 786,432 tokens")
    # Seed 004's own 524,288-token context passes vLLM's check by less than the error bar: marginal, with the
    # planned lever, before a boot that could be refused.
    seeds = profile_at(tmp_path, "extends: rtxpro6000-tp2-replicas\nvllm:\n  max-model-len: 524288\n")
    marginal = model.kv_room(context(seeds))
    assert_status(marginal, Status.WARN, "marginal: stage 0 has 1.04 GiB a card over one 524,288-token request",
                  "max-model-len 391,680 (planned)", "unchecked: FLASHINFER_MLA_SPARSE_SM120",
                  "cards of 95.59 GiB, the profile's")


def _gpu_profiles() -> list[str]:
    from rigstack.profiles import list_profiles, load_profile

    return [name for name in list_profiles() if load_profile(name).flavour == "gpu"]


@pytest.mark.parametrize("name", _gpu_profiles())
def test_kv_room_fails_exactly_the_shipped_profiles_that_would_not_start(name: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27 lever 5: every shipped rig profile through kv-room: FAIL when vLLM 0.32.0 with the stack would
    refuse it (the planner's verdict), never otherwise (this machine's RAM stands in for a rig's: plenty)."""
    from rigstack.planner import plan_dict
    from rigstack.preflight import host

    monkeypatch.setattr(host, "meminfo", lambda: {"MemAvailable": 4096.0})
    ctx = context(name)
    result = model.kv_room(ctx)
    # Seed 004's Qwen engine: the seed gives no shape, and none is made up for it.
    if not shape_known(ctx.profile, model_dir(ctx.profile.model, build=False)):
        assert_status(result, Status.SKIP, "the model's shape is unknown")
        return
    verdict = plan_dict(name)["verdict"]["value"]
    assert (result.status is Status.FAIL) == (verdict == "refused"), result
    assert (verdict == "marginal") <= (result.status is Status.WARN and "marginal" in result.reason), result


def test_kv_room_fails_a_profile_the_planner_cannot_plan(tmp_path: Path) -> None:
    """A profile whose own figures contradict each other would not start as written: kv-room says why, instead of
    passing on a first estimate."""
    bad = profile_at(tmp_path, "extends: rtxpro6000-tp2-replicas\nmodel:\n  rank_gib: 75.85\n")
    assert_status(model.kv_room(context(bad)), Status.FAIL, "the capacity planner cannot plan this profile",
                  "planner.bits states")


def test_disk_for_missing_weights(tmp_path: Path) -> None:
    huge = profile_at(tmp_path, f"extends: cmp170hx-8x-pp8\nmodel:\n  path: {tmp_path}/w\n  size_gib: 1.0e+9\n")
    assert_status(model.disk(context(huge, model=tmp_path / "w")), Status.FAIL, "the weights need 1e+09 GiB")
    fits = profile_at(tmp_path, f"extends: cmp170hx-8x-pp8\nmodel:\n  path: {tmp_path}/w\n  size_gib: 0.001\n",
                      name="fits")
    assert_status(model.disk(context(fits, model=tmp_path / "w")), Status.PASS)
    assert model.disk(context("cpu-tiny", model=model_folder(tmp_path))).status is Status.SKIP


def _dflash_profile(tmp_path: Path, config: dict | None, vllm: str = ""):
    """seed 002's PP8 DFlash2 rig, its drafter at tmp_path/drafter with `config` (None: no folder)."""
    folder = tmp_path / "drafter"
    if config is not None:
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    return profile_at(tmp_path, f"extends: cmp170hx-8x-pp8\ndrafter:\n  path: {folder}\n{vllm}"), folder


DFLASH2_SWA = {"architectures": ["DFlash2DraftModel"], "num_hidden_layers": 5,
               "layer_types": ["sliding_attention"] * 5, "dflash_config": {"swa_window_size": 2048}}


@pytest.mark.parametrize("config", [
    {**DFLASH2_SWA, "layer_types": None, "dflash_config": {"use_swa": True, "swa_window_size": 2048}},
    {**DFLASH2_SWA, "dflash_config": {}, "sliding_window": 2048},
    DFLASH2_SWA,
])
def test_window_bounded_drafter_passes(tmp_path: Path, config: dict) -> None:
    profile, _ = _dflash_profile(tmp_path, config)
    assert_status(model.drafter_kv(context(profile)), Status.PASS, "5 layer(s), 2048 tokens")


def test_drafter_without_a_window_warns_with_the_fix(tmp_path: Path) -> None:
    # seed 003: "without that bound the drafter's KV caps the pool at about 0.96M tokens"
    profile, folder = _dflash_profile(tmp_path, {**DFLASH2_SWA, "layer_types": ["full_attention"] * 5,
                                                 "dflash_config": {}})
    result = model.drafter_kv(context(profile))
    assert_status(result, Status.WARN, "5 of 5 drafter layers have no sliding window", "about 0.96M tokens")
    assert f"{folder}/config.json" in result.fix and '"swa_window_size": 2048' in result.fix
    (tmp_path / "m").mkdir()
    mixed, _ = _dflash_profile(tmp_path / "m", {**DFLASH2_SWA,
                                                "layer_types": ["sliding_attention"] * 4 + ["full_attention"]})
    assert_status(model.drafter_kv(context(mixed)), Status.WARN, "1 of 5 drafter layers")


def test_window_without_a_size_fails_and_hybrid_manager_off_warns(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    sizeless, _ = _dflash_profile(tmp_path / "a", {**DFLASH2_SWA, "dflash_config": {}})
    assert_status(model.drafter_kv(context(sizeless)), Status.FAIL, "without a window size")
    (tmp_path / "b").mkdir()
    off, _ = _dflash_profile(tmp_path / "b", DFLASH2_SWA, "vllm:\n  disable-hybrid-kv-cache-manager: true\n")
    result = model.drafter_kv(context(off))
    assert_status(result, Status.WARN, "hybrid KV cache manager is off")
    assert "disable-hybrid-kv-cache-manager" in result.fix


def test_drafter_kv_skips_without_a_dflash_drafter_or_its_config(tmp_path: Path) -> None:
    assert_status(model.drafter_kv(context("cpu-tiny")), Status.SKIP, "no DFlash drafter")
    profile, folder = _dflash_profile(tmp_path, None)
    assert_status(model.drafter_kv(context(profile)), Status.SKIP, f"{folder}/config.json")


def test_kv_room_fails_when_the_offloaded_experts_outgrow_host_ram(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from rigstack.preflight import host

    short = profile_at(tmp_path, "extends: rtxpro6000-1x-offload\nhardware:\n  host_ram_gib: 128\n")
    result = model.kv_room(context(short))
    assert_status(result, Status.FAIL, "host RAM: the offloaded experts take 159.5 GiB pinned, the rig has 128")
    assert "pins every routed expert" in result.fix
    # The profile's 182 GiB would do; this machine's free RAM is checked too (preflight runs on the rig).
    monkeypatch.setattr(host, "meminfo", lambda: {"MemAvailable": 100.0})
    assert_status(model.kv_room(context("rtxpro6000-1x-offload")), Status.FAIL, "this machine has 100.0 GiB free")
    monkeypatch.setattr(host, "meminfo", lambda: {"MemAvailable": 170.0})
    assert model.kv_room(context("rtxpro6000-1x-offload")).status is not Status.FAIL
