"""Checks of the weights against the profile: config shape, files and size, partition, KV room, disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rigstack.errors import UserError
from rigstack.planner.config import shape_known
from rigstack.preflight.core import Context, Result, check, fail, passed, read_config, skip, warn
from rigstack.profiles import TINY_PREFIX, Shape, Weights, model_dir
from rigstack.tinymodel import models_root

GIB = 1024**3
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
# A download that stopped early still has its config.json; below this share of the expected size it is partial.
SIZE_LOW, SIZE_HIGH = 0.9, 1.15


def _field(config: dict[str, Any], name: str) -> Any:
    """Multimodal configs keep the language model's shape under text_config."""
    if name in config:
        return config[name]
    return (config.get("text_config") or {}).get(name)


def shape_mismatches(shape: Shape, config: dict[str, Any]) -> list[str]:
    wrong = []
    for name, want in shape.model_dump(exclude_none=True).items():
        have = _field(config, name)
        if name == "architectures":
            if not set(want) & set(have or ()):
                wrong.append(f"architectures {have} (want one of {list(want)})")
        elif have != want:
            wrong.append(f"{name} {have} (want {want})")
    return wrong


def weight_files(folder: Path) -> list[Path]:
    return [path for path in folder.iterdir() if path.suffix in WEIGHT_SUFFIXES and path.is_file()]


def _missing_shards(folder: Path) -> list[str]:
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return []
    try:
        listed = set(json.loads(index.read_text()).get("weight_map", {}).values())
    except ValueError:
        return [index.name]
    return sorted(name for name in listed if not (folder / name).is_file())


def check_weights(what: str, weights: Weights, folder: Path | None, config: dict[str, Any] | None) -> Result:
    if folder is None or not folder.is_dir():
        where = folder or weights.path
        if weights.path.startswith(TINY_PREFIX) and folder is not None and folder.parent == models_root():
            return fail(f"the tiny model is not built yet ({where})",
                        f"python scripts/make_tiny_model.py --kind {weights.path.removeprefix(TINY_PREFIX)}")
        return fail(f"{what} folder {where} not found",
                    f"download {weights.source or 'the weights'} to {where}, or pass --model PATH")
    if config is None:
        return fail(f"{folder}/config.json is missing or not JSON", f"re-download {weights.source or what}")
    wrong = shape_mismatches(weights.shape, config)
    if wrong:
        return fail(f"{what} config.json does not match the profile: {'; '.join(wrong)}",
                    "point the profile (or --model) at the checkpoint it was written for")
    files = weight_files(folder)
    missing = _missing_shards(folder)
    if not files or missing:
        gone = f"{len(missing)} shard(s) in the index missing, first {missing[0]}" if missing else "no weight files"
        return fail(f"{what} in {folder}: {gone}", f"finish the download of {weights.source or what}")
    total = sum(path.stat().st_size for path in files) / GIB
    if weights.size_gib:
        if total < weights.size_gib * SIZE_LOW:
            return fail(f"{what} weights are {total:.3g} GiB, expected about {weights.size_gib:g} (partial download?)",
                        f"finish the download of {weights.source or what}")
        if total > weights.size_gib * SIZE_HIGH:
            return warn(f"{what} weights are {total:.3g} GiB, expected about {weights.size_gib:g}",
                        "check that this is the checkpoint the profile names")
    return passed(f"{what} shape matches; {len(files)} weight file(s), {total:.3g} GiB")


@check("model")
def model(ctx: Context) -> Result:
    if ctx.model_problem:
        return fail(ctx.model_problem, "pass --package (and --python) of the serving vLLM, or --model PATH")
    return check_weights("model", ctx.profile.model, ctx.model, ctx.model_config)


@check("drafter")
def drafter(ctx: Context) -> Result:
    weights = ctx.profile.drafter
    if weights is None:
        return skip("no drafter")
    folder = model_dir(weights, build=False)
    return check_weights("drafter", weights, folder, read_config(folder))


def drafter_windows(config: dict[str, Any]) -> list[int | None]:
    """Each DFlash drafter layer's KV window in tokens (None: full context), read as vLLM 0.32.0 does
    (model_executor/models/qwen3_dflash.py, _resolve_layer_attention). A sliding layer without a window size is 0:
    vLLM refuses to build it."""
    dflash = config.get("dflash_config") or {}
    layers = config.get("num_hidden_layers") or 0
    types = config.get("layer_types")
    if types is None or (dflash.get("use_swa") and "sliding_attention" not in types):
        sliding = [bool(dflash.get("use_swa"))] * (len(types) if types else layers)
    else:
        sliding = [kind == "sliding_attention" for kind in types]
    window = dflash.get("swa_window_size", config.get("sliding_window")) or 0
    return [window if is_sliding else None for is_sliding in sliding]


@check("drafter-kv")
def drafter_kv(ctx: Context) -> Result:
    """Seed 003: the DFlash2 drafter's BF16 KV is window-bounded to 2,048 tokens; "without that bound the drafter's
    KV caps the pool at about 0.96M tokens". vLLM counts a sliding drafter layer at its window only with the hybrid
    KV cache manager, so a drafter without a window, or with the manager off, takes full-context KV."""
    weights, spec = ctx.profile.drafter, ctx.profile.speculative or {}
    if weights is None or not str(spec.get("method", "")).startswith("dflash"):
        return skip("no DFlash drafter")
    folder = model_dir(weights, build=False)
    config = read_config(folder)
    if config is None:
        return skip(f"drafter config not readable ({folder or weights.path}/config.json)")
    windows = drafter_windows(config)
    where = f"{folder}/config.json"
    if 0 in windows:
        return fail(f"drafter sliding-window layers without a window size in {where} (vLLM refuses to build them)",
                    f'set "swa_window_size": 2048 in dflash_config of {where}')
    full = sum(window is None for window in windows)
    if full:
        return warn(f"{full} of {len(windows)} drafter layers have no sliding window: their KV spans the whole "
                    "context (seed 003: without a 2,048-token bound the drafter's KV caps the pool at about 0.96M "
                    "tokens)",
                    f'use a window-bounded drafter, or add "use_swa": true, "swa_window_size": 2048 to dflash_config '
                    f"in {where} if it was trained with that window")
    if ctx.profile.vllm.get("disable-hybrid-kv-cache-manager"):
        return warn(f"drafter KV is window-bounded ({max(windows)} tokens), but the hybrid KV cache manager is off, "
                    "so vLLM counts those layers at full context (seed 003: the pool capped at about 0.96M tokens)",
                    "remove disable-hybrid-kv-cache-manager from the profile's vllm flags")
    return passed(f"drafter KV window-bounded: {len(windows)} layer(s), {max(windows)} tokens")


def layer_count(ctx: Context) -> int | None:
    config = ctx.model_config
    have = _field(config, "num_hidden_layers") if config else None
    return have if isinstance(have, int) else ctx.profile.model.shape.num_hidden_layers


@check("partition")
def partition(ctx: Context) -> Result:
    parallel = ctx.profile.parallel
    if parallel.pp == 1:
        return skip("no pipeline parallel")
    stages = parallel.partition
    if stages is None:
        return passed(f"PP{parallel.pp} with vLLM's even split")
    if len(stages) != parallel.pp:
        return fail(f"partition has {len(stages)} stages for PP{parallel.pp}", "give one layer count per stage")
    if any(n <= 0 for n in stages):
        return fail(f"partition {list(stages)} has an empty stage", "give every stage at least one layer")
    layers = layer_count(ctx)
    if layers is None:
        return skip("layer count unknown (no config.json, no model.shape.num_hidden_layers)")
    if sum(stages) != layers:
        return fail(f"partition {','.join(map(str, stages))} sums to {sum(stages)}, the model has {layers} layers",
                    "make parallel.partition add up to num_hidden_layers")
    return passed(f"{len(stages)} stages, {','.join(map(str, stages))} = {layers} layers")


# --- KV room: the capacity planner (rigstack.planner); a first estimate where it cannot run ------------------

_FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")


def kv_bytes_per_token(ctx: Context) -> int | None:
    kv, config = ctx.profile.kv, ctx.model_config
    per_layer = kv.bytes_per_token_per_layer
    if per_layer is None:
        if not config:
            return None
        heads = _field(config, "num_key_value_heads") or _field(config, "num_attention_heads")
        head_dim = _field(config, "head_dim") or (_field(config, "hidden_size") or 0) // max(
            _field(config, "num_attention_heads") or 1, 1)
        if not heads or not head_dim:
            return None
        width = 1 if ctx.profile.vllm.get("kv-cache-dtype") in _FP8_KV else 2
        per_layer = 2 * heads * head_dim * width  # K and V
    layers = kv.layers or layer_count(ctx)
    return (per_layer + kv.extra_bytes_per_token_per_layer) * layers if layers else None


def _weights_gib(ctx: Context) -> float | None:
    if ctx.model is not None and ctx.model.is_dir():
        return sum(path.stat().st_size for path in weight_files(ctx.model)) / GIB
    return ctx.profile.model.size_gib


def _measured_card_gib(ctx: Context) -> float | None:
    """The smallest of the replica's cards as NVML reports them; None unless this host has all of them."""
    cards = [gpu.memory_gib for gpu in ctx.gpus.gpus[:ctx.profile.parallel.gpus_per_replica]]
    return min(cards) if len(cards) == ctx.profile.parallel.gpus_per_replica else None


def kv_budget_gib(ctx: Context) -> tuple[float, str] | None:
    """GiB left for KV after weights, and how it was worked out."""
    profile = ctx.profile
    if profile.flavour == "cpu":
        space = ctx.env_value("VLLM_CPU_KVCACHE_SPACE")
        return (float(space), f"VLLM_CPU_KVCACHE_SPACE={space} GiB") if space else None
    weights = _weights_gib(ctx)
    if weights is None:
        return None
    per_card = _measured_card_gib(ctx) or profile.hardware.card_gib
    if not per_card:
        return None
    util = float(profile.vllm.get("gpu-memory-utilization", 0.9))
    on_gpu = weights - (profile.offload.host_gib if profile.offload else 0)
    cards_n = profile.parallel.gpus_per_replica
    budget = cards_n * (per_card * util - profile.kv.reserve_gib_per_gpu) - on_gpu
    return budget, f"{cards_n} x {per_card:.0f} GiB x {util:g} - {on_gpu:.0f} GiB weights"


def _planned_room(ctx: Context, max_len: int) -> Result:
    """kv-room from the capacity planner: vLLM's own KV sizing per stage and its own startup check."""
    from rigstack.planner import plan_dict

    # On the rig a card's memory is what NVML reports, not the profile's.
    measured = _measured_card_gib(ctx)
    plan = plan_dict(ctx.profile.source_files[-1], model=str(ctx.model) if ctx.model else None, memory_gib=measured)
    host = _host_short(plan)
    if host is not None:
        return fail(host, "add host RAM, or serve a smaller checkpoint: patch 0014 pins every routed expert in host "
                          "RAM, the cached ones too (`python preflight.py plan` shows each stage's share)")
    stage = plan["stages"][plan["binding_stage"]]
    where = "NVML's reading" if measured else "the profile's"
    line = (f"planned pool {plan['pool_tokens']:,} tokens (stage {plan['binding_stage']} of {plan['pp']} has the "
            f"fewest blocks: {stage['layers']} layers, {stage['available_gib']:.2f} GiB for KV; cards of "
            f"{plan['memory_gib']:.2f} GiB, {where})")
    verdict = plan["verdict"]
    unchecked = "".join(f"; unchecked: {item}" for item in verdict["unchecked"])
    if plan["starts"] and verdict["value"] == "refused":  # a check of the planner's own, past vLLM's KV check
        return fail(f"{verdict['why']}; {line}", "serve a model, KV dtype or block size a backend of this rig "
                    "accepts (`python preflight.py plan` names each backend's reasons)")
    if not plan["starts"]:
        refusing = plan["refusal_stage"]
        short = plan["stages"][refusing]
        fixes = (f"raise gpu-memory-utilization, move layers off stage {refusing} (parallel.partition; `python "
                 f"preflight.py plan --profile {ctx.profile.name} --search` finds the best split), add a PP stage, "
                 "or use a smaller KV dtype")
        if plan["util"] is None:
            fixes = "raise VLLM_CPU_KVCACHE_SPACE"
        return fail(f"vLLM would refuse to start: stage {refusing} cannot hold one {max_len:,}-token request "
                    f"({short['request_gib']:.2f} GiB of KV, {short['available_gib']:.2f} GiB for KV there; short "
                    f"stages: {', '.join(map(str, plan['short_stages']))}); {line}",
                    f"{fixes}; or lower max-model-len")
    if verdict["value"] == "marginal":
        return warn(f"marginal: {verdict['why']}; {line}{unchecked}",
                    "free that memory before a long boot, or expect vLLM may refuse it")
    target = plan["target_sessions"]
    if plan["sessions"] < target:
        return warn(f"{line}: {plan['sessions']:.2f} of {target:g} target requests fit at {max_len:,} tokens"
                    f"{unchecked}",
                    "fine for mixed lengths; lower max-num-seqs or planner.target_sessions if every request is long")
    return passed(f"{line} >= {target:g} x {max_len:,}{unchecked}")


def _host_short(plan: dict[str, Any]) -> str | None:
    """Why the offloaded experts do not fit in host RAM: the profile's figure (the plan's own check), else this
    machine's available RAM (preflight runs on the rig)."""
    need = plan.get("host_gib", 0.0)
    if not need:
        return None
    if not plan.get("host_fits", True):
        return plan["refusal"]
    from rigstack.preflight.host import meminfo

    available = meminfo().get("MemAvailable", 0.0)
    if available < need:
        return f"host RAM: the offloaded experts take {need:.1f} GiB pinned, this machine has {available:.1f} GiB free"
    return None


@check("kv-room")
def kv_room(ctx: Context) -> Result:
    flags = ctx.profile.vllm
    max_len, seqs = flags.get("max-model-len"), int(flags.get("max-num-seqs", 1))
    if not isinstance(max_len, int):
        return skip("no max-model-len in the profile")
    # GPU rigs get the planner (30 s of vLLM import against a 12-17 minute boot that may be refused); cpu
    # profiles keep the first estimate, which is vLLM's figure for the dense tiny model (tests/test_planner.py).
    unplanned = "cpu profile"
    if ctx.profile.flavour == "gpu":
        from rigstack.interpreter import serving_python

        folder = ctx.model or model_dir(ctx.profile.model, build=False)
        if not shape_known(ctx.profile, folder):
            # Preflight may run before the download; the shape then comes from config.json or planner.config only.
            return skip(f"no config.json at {folder} and no planner.config: the model's "
                        "shape is unknown; run preflight again once the weights are downloaded")
        if serving_python() is not None:
            try:
                return _planned_room(ctx, max_len)
            except UserError as error:  # the profile or the weights, said by the planner: it would not start
                return fail(f"the capacity planner cannot plan this profile: {error}",
                            "fix what it names, then `python preflight.py plan` shows the stages")
        unplanned = "planner not run: no serving interpreter with vLLM (set RIGSTACK_VLLM_PYTHON)"
    per_token, budget = kv_bytes_per_token(ctx), kv_budget_gib(ctx)
    if per_token is None or budget is None:
        return skip(f"{unplanned}; not enough known for a first estimate")
    gib, how = budget
    pool = int(max(gib, 0) * GIB / per_token)
    line = f"~{pool:,} tokens of KV (first estimate, {unplanned}; {how}; {per_token:,} B/token)"
    if pool < max_len:
        return fail(f"{line} cannot hold one {max_len:,}-token request",
                    "lower max-model-len, use an fp8 KV cache, or add cards")
    if pool < max_len * seqs:
        return warn(f"{line}: {pool // max_len} of {seqs} sequences fit at full length",
                    "fine for mixed lengths; lower max-num-seqs if every request is long")
    return passed(f"{line} >= {seqs} x {max_len:,}")


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


@check("disk")
def disk(ctx: Context) -> Result:
    if ctx.model is not None and ctx.model.is_dir() and weight_files(ctx.model):
        return skip("weights already on disk")
    size = ctx.profile.model.size_gib
    target = ctx.model or Path(ctx.profile.model.path)
    if not size:
        return skip("profile gives no model.size_gib")
    free = shutil.disk_usage(_existing_parent(target)).free / GIB
    if free < size:
        return fail(f"{free:.0f} GiB free at {_existing_parent(target)}, the weights need {size:g} GiB",
                    "free disk space or download the weights to another disk and pass --model PATH")
    return passed(f"{free:.0f} GiB free for {size:g} GiB of weights")
