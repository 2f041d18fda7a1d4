"""The plan: per stage weights, non-KV reserve and KV bytes, then vLLM's own sizing of the pool (rigstack.planner.kv).

Runs in an interpreter that has vLLM (and transformers, which ships the model configs); see rigstack.planner.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from itertools import accumulate
from pathlib import Path
from typing import Any, Literal

from rigstack.errors import UserError
from rigstack.planner import weights as wt
from rigstack.planner.offload import split as offload_split
from rigstack.profiles import Profile, model_dir

GIB = 1024**3
# vLLM 0.32.0's defaults where a profile sets no flag (EngineArgs / SchedulerConfig).
DEFAULT_BATCHED_TOKENS = 2048
DEFAULT_UTIL = 0.9
# platforms/cpu.py check_and_update_config: a non-MLA model without --block-size gets 128-token blocks on CPU.
CPU_BLOCK_SIZE = 128


@dataclass(frozen=True)
class Reserve:
    """The non-KV memory of one stage beside its weights, in GiB: a fixed part (CUDA context, NCCL buffers, the
    CUDA-graph pool that vLLM measures by a trial capture) plus the profile run's scratch as vLLM's own shape
    functions size it (planner.scratch, kv.sparse_workspace_bytes): the larger of the fused-MoE workspaces and
    the sparse-MLA workspaces, because vLLM's WorkspaceManager serves both from one shared allocation, plus the
    allocations beside it (the indexer's logits sentinel, kv.indexer_logits_bytes; the runner's buffers on that
    stage). fixed_gib is the one fitted constant (published.fit); README,
    "Capacity planner", says on which case."""

    fixed_gib: float = 1.725  # fitted on seed 003 PP8 (python -m rigstack.planner.published --fit)

    def gib(self, workspace_bytes: int, buffer_bytes: int = 0) -> float:
        return self.fixed_gib + (workspace_bytes + buffer_bytes) / GIB


RESERVE = Reserve()


@dataclass
class Stage:
    index: int
    first_layer: int
    layers: int
    weights_gib: float
    weights_by_class: dict[str, float]
    reserve_gib: float
    available_gib: float  # what vLLM's determine_available_memory returns: the KV budget of this stage
    kv_gib: float  # what the pool takes on this stage (its blocks x its bytes per block)
    blocks: int  # the blocks this stage alone could hold
    bytes_per_block: int
    tokens: int  # tokens this stage alone could hold
    host_gib: float = 0.0  # pinned host RAM for this stage's offloaded experts (patch 0014; planner.offload)


@dataclass
class Plan:
    profile: str
    architecture: str
    flavour: str
    pp: int
    tp: int
    partition: list[int]
    util: float | None
    memory_gib: float | None
    max_model_len: int
    max_num_seqs: int
    kv_cache_dtype: str
    block_size: int
    groups: list[str]
    stages: list[Stage]
    pool_blocks: int
    pool_tokens: int
    binding_stage: int
    sessions: float
    starts: bool
    refusal: str | None
    weights_source: str
    notes: list[str] = field(default_factory=list)
    attention_backend: dict[str, Any] | None = None  # vLLM's CUDA selector for the rig (GPU profiles)
    host_gib: float = 0.0  # pinned host RAM the offloaded experts take, all stages (planner.offload)
    host_ram_gib: float | None = None  # the profile's hardware.host_ram_gib
    host_fits: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


DrafterKv = Literal["pool", "own", "sidecar"]
# Seed 002's engine reads the sidecar block size from this variable (its patch 0024); its default was 16.
SIDECAR_ENV = "VLLM_GLM5N_SIDECAR_BLOCK_SIZE"


@dataclass(frozen=True)
class Request:
    profile: Profile
    pp: int | None = None
    tp: int | None = None
    partition: tuple[int, ...] | None = None
    util: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    model: Path | None = None
    kv_space_gib: float | None = None  # cpu flavour: VLLM_CPU_KVCACHE_SPACE, else the profile's env
    # "pool": a DFlash drafter's KV layers join the pool, grouped by vLLM's get_kv_cache_groups (what 0.32.0 does);
    # "own": held apart on the last stage (kv.drafter_own_bytes), seed 003's engine's accounting; "sidecar": seed
    # 002's, its ids drawn from the pool at the profile's VLLM_GLM5N_SIDECAR_BLOCK_SIZE (kv.sidecar_group).
    drafter_kv: DrafterKv = "pool"


# --- the model config ------------------------------------------------------------------------------------------


def load_config(profile: Profile, folder: Path | None) -> tuple[Any, str]:
    """The model's config as transformers reads it: config.json from the model folder, else the profile's
    planner.config (real keys of the architecture's config; transformers fills in the class defaults)."""
    from transformers import AutoConfig

    source = None
    if folder is not None and (folder / "config.json").is_file():
        data, source = json.loads((folder / "config.json").read_text()), str(folder / "config.json")
    elif profile.planner is not None and profile.planner.config:
        data, source = dict(profile.planner.config), f"profile {profile.name} planner.config"
    else:
        raise UserError(f"profile {profile.name}: no config.json at {folder} and no planner.config; download the "
                        "model or add the model's config keys under planner.config")
    model_type = data.get("model_type")
    if not model_type:
        raise UserError(f"{source}: no model_type; add the architecture's model_type (e.g. glm_moe_dsa)")
    try:
        config = AutoConfig.for_model(model_type, **{k: v for k, v in data.items() if k != "model_type"})
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{source}: transformers cannot build a {model_type} config ({error}); fix the keys") from None
    archs = data.get("architectures") or list(profile.model.shape.architectures or ())
    if not archs:
        raise UserError(f"{source}: no architectures; add the model class name (e.g. GlmMoeDsaForCausalLM)")
    return config, archs[0]


def _text(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


@dataclass(frozen=True)
class Drafter:
    config: Any  # transformers' config of the drafter's config.json
    folder: Path | None  # where its weights are, if here
    source: str  # where the config came from


def load_drafter_config(profile: Profile) -> Drafter | None:
    """A DFlash drafter's config as transformers reads it (its config.json from the drafter folder, else the
    profile's planner.drafter_config; DFlash drafters are Qwen3 configs); None without one."""
    from transformers import AutoConfig

    if (profile.speculative or {}).get("method") != "dflash":
        return None
    folder = model_dir(profile.drafter, build=False) if profile.drafter else None
    if folder is not None and (folder / "config.json").is_file():
        data, source = json.loads((folder / "config.json").read_text()), str(folder / "config.json")
    elif profile.planner is not None and profile.planner.drafter_config:
        data, source = dict(profile.planner.drafter_config), f"profile {profile.name} planner.drafter_config"
    else:
        return None
    kind = data.get("model_type", "qwen3")
    try:
        config = AutoConfig.for_model(kind, **{k: v for k, v in data.items() if k != "model_type"})
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{source}: transformers cannot build a {kind} config ({error}); fix the keys") from None
    return Drafter(config, folder, source)


# --- the partition ----------------------------------------------------------------------------------------------


def vllm_partition(layers: int, pp: int) -> list[int]:
    """vLLM's own split when no partition is given (distributed/utils.py:get_pp_indices, which reads
    VLLM_PP_LAYER_PARTITION first: the planner's partition comes from the profile or --partition instead)."""
    import os

    from vllm.distributed.utils import get_pp_indices

    os.environ.pop("VLLM_PP_LAYER_PARTITION", None)
    return [end - start for start, end in (get_pp_indices(layers, rank, pp) for rank in range(pp))]


def check_partition(partition: list[int], layers: int, pp: int) -> None:
    if len(partition) != pp:
        raise UserError(f"partition {','.join(map(str, partition))} has {len(partition)} stages for PP{pp}; "
                        "give one layer count per stage")
    if any(n <= 0 for n in partition):
        raise UserError(f"partition {','.join(map(str, partition))} has an empty stage; give every stage a layer")
    if sum(partition) != layers:
        raise UserError(f"partition {','.join(map(str, partition))} sums to {sum(partition)}, the model has "
                        f"{layers} layers; make it add up to num_hidden_layers")


def bounds_of(partition: list[int]) -> list[tuple[int, int]]:
    edges = [0, *accumulate(partition)]
    return list(zip(edges, edges[1:]))


# --- weights ----------------------------------------------------------------------------------------------------


def _mtp_layers(profile: Profile, text: Any) -> int:
    spec = profile.speculative or {}
    return int(getattr(text, "num_nextn_predict_layers", 1) or 1) if spec.get("method") == "mtp" else 0


def linear_layers(config: Any) -> frozenset[int]:
    types = getattr(_text(config), "layer_types", None) or ()
    return frozenset(i for i, kind in enumerate(types) if kind == "linear_attention")


_SHAPES: dict[str, dict[str, int]] = {}


def _shape_params(key: str, config: Any) -> dict[str, int]:
    """wt.shape_params, once per config in a process (building the meta model takes seconds)."""
    if key not in _SHAPES:
        _SHAPES[key] = wt.shape_params(config)
    return _SHAPES[key]


def weight_sizes(profile: Profile, config: Any, folder: Path | None) -> tuple[dict[str, float], str]:
    """Bytes per tensor: the checkpoint's headers when its safetensors are there, else shapes x bits."""
    if folder is not None and (list(folder.glob("*.safetensors")) or (folder / "model.safetensors.index.json")
                               .is_file()):
        return {k: float(v) for k, v in wt.checkpoint_bytes(folder).items()}, f"checkpoint headers in {folder}"
    text = _text(config)
    params = dict(_shape_params(json.dumps(text.to_dict(), sort_keys=True, default=str), config))
    bits = dict(profile.planner.bits) if profile.planner else {}
    # An MTP module is one more full-attention decoder layer past the last (vLLM puts it on the last stage):
    # counted as a copy of the last full-attention layer.
    linear = linear_layers(config)
    template = max(i for i in range(text.num_hidden_layers) if i not in linear)
    for i in range(_mtp_layers(profile, text)):
        params.update({name.replace(f"layers.{template}.", f"layers.{text.num_hidden_layers + i}."): count
                       for name, count in params.items() if wt.layer_of(name) == template})
    shown = ", ".join(f"{k} {v:g}" for k, v in sorted(bits.items())) or "all 16"
    return wt.sizes_from_shapes(params, bits, linear), f"config shapes x bits per tensor class ({shown})"


def drafter_bytes(profile: Profile, draft: Drafter | None, target: Any, pp: int, tp: int) -> float | None:
    """The drafter's weight bytes on the last stage: planner.drafter_gib when given, else its checkpoint headers,
    else its config's shapes x bits["drafter"] (16 unset); None when there is no drafter to size."""
    hints = profile.planner
    if hints is not None and hints.drafter_gib:
        return hints.drafter_gib * GIB
    if draft is None:
        return None
    if draft.folder is not None and list(draft.folder.glob("*.safetensors")):
        return sum(wt.checkpoint_bytes(draft.folder).values()) / tp
    bits = (hints.bits if hints else {}).get("drafter", wt.DEFAULT_BITS)
    return wt.drafter_params(draft.config, target.hidden_size, shared_embed=pp == 1) * bits / 8 / tp


def skipped_tensors(architecture: str, config: Any, names: list[str]) -> list[str]:
    """Tensors vLLM does not build: GLM-5.3's shared-top-k layers have no indexer (models/deepseek_v32)."""
    if architecture != "GlmMoeDsaForCausalLM":
        return []
    from rigstack.planner.kv import indexer_runs

    text = _text(config)
    return [name for name in names if ".indexer." in name and (layer := wt.layer_of(name)) is not None
            and layer < text.num_hidden_layers and not indexer_runs(text, layer)]


# --- the plan ---------------------------------------------------------------------------------------------------


def _flag(profile: Profile, name: str, default: Any) -> Any:
    value = profile.vllm.get(name)
    return default if value is None else value


def plan(request: Request, reserve: Reserve = RESERVE) -> Plan:
    profile = request.profile
    folder = request.model or model_dir(profile.model, build=False)
    config, architecture = load_config(profile, folder)
    text = _text(config)
    pp = request.pp or profile.parallel.pp
    tp = request.tp or profile.parallel.tp
    layers = text.num_hidden_layers
    partition = list(request.partition or (profile.parallel.partition if pp == profile.parallel.pp else None)
                     or vllm_partition(layers, pp))
    check_partition(partition, layers, pp)
    util = request.util if request.util is not None else float(_flag(profile, "gpu-memory-utilization", DEFAULT_UTIL))
    if not 0 < util <= 1:
        raise UserError(f"--util {util:g} is outside (0, 1]; vLLM takes gpu-memory-utilization as a fraction")
    max_len = request.max_model_len or int(_flag(profile, "max-model-len", getattr(text, "max_position_embeddings",
                                                                                     0)))
    seqs = request.max_num_seqs or int(_flag(profile, "max-num-seqs", 256))
    batched = int(_flag(profile, "max-num-batched-tokens", DEFAULT_BATCHED_TOKENS))
    spec = profile.speculative or {}
    cpu = profile.flavour == "cpu"
    draft = load_drafter_config(profile)
    from rigstack.planner.kv import (  # vLLM: late
        KvSetup, drafter_own_bytes, indexer_logits_bytes, size_pool, sparse_workspace_bytes)
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

    from rigstack.planner import scratch

    setup = KvSetup(
        architecture=architecture, max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=batched,
        block_size=profile.vllm.get("block-size") or (CPU_BLOCK_SIZE if cpu else None),
        kv_cache_dtype=str(_flag(profile, "kv-cache-dtype", "auto")),
        model_dtype=str(_flag(profile, "dtype", "bfloat16")).replace("auto", "bfloat16"), tp=tp, pp=pp,
        num_speculative_tokens=int(spec.get("num_speculative_tokens", 0)), speculative_method=spec.get("method"),
        enable_prefix_caching=bool(_flag(profile, "enable-prefix-caching", False)),
        kernel_block_sizes=tuple(profile.planner.kernel_block_sizes) if profile.planner else (16,), cpu=cpu,
        mtp_layers=_mtp_layers(profile, text), drafter=draft.config if draft else None,
        drafter_kv_cache_dtype=spec.get("kv_cache_dtype"), model_runner_v2=not cpu,
        # VllmConfig._set_async_scheduling's default for these configs: on, except PP on the V1 runner (CPU twin).
        async_scheduling=bool(_flag(profile, "async-scheduling", pp == 1 or not cpu)),
        kv_cache_layout=profile.env.get("VLLM_KV_CACHE_LAYOUT"))
    bounds = bounds_of(partition)
    notes: list[str] = []
    host = [0.0] * pp  # pinned host RAM per stage for offloaded experts
    if cpu:
        space = request.kv_space_gib if request.kv_space_gib is not None else profile.env.get("VLLM_CPU_KVCACHE_SPACE")
        if space is None:
            raise UserError(f"profile {profile.name}: a cpu profile needs VLLM_CPU_KVCACHE_SPACE in env (GiB)")
        # cpu_worker.determine_available_memory: the KV space is taken as given, as whole GiB.
        available = [int(float(space)) * GIB] * pp
        per_stage: list[dict[str, float]] = [{} for _ in bounds]
        reserves = [0.0] * pp
        source = f"VLLM_CPU_KVCACHE_SPACE={space} GiB per stage (cpu_worker takes it as the KV budget)"
        memory = None
    else:
        memory = profile.hardware.memory_gib
        if not memory:
            raise UserError(f"profile {profile.name}: hardware.memory_gib is not set; give the card's memory in GiB")
        sizes, source = weight_sizes(profile, config, folder)
        skip = skipped_tensors(architecture, config, list(sizes))
        per_stage = wt.stage_bytes(sizes, bounds, skip, tp, linear_layers(config))
        drafter = drafter_bytes(profile, draft, text, pp, tp)
        if spec and spec.get("method") not in (None, "mtp") and drafter is None:
            notes.append(f"drafter ({spec.get('method')}) weights and KV not modelled: no drafter config.json, "
                         "planner.drafter_config or planner.drafter_gib")
        if drafter:
            per_stage[-1]["drafter"] = drafter
        skipped = set(skip)
        experts = offload_split(profile, {k: v for k, v in sizes.items() if k not in skipped}, bounds, tp,
                                int(getattr(text, "n_routed_experts", 0) or 0))
        offload = 0.0
        if experts is not None:  # patch 0014: each MoE layer's cache and staging slots stay on the GPU
            for cls, part in zip(per_stage, experts):
                if part.moe_layers:
                    cls["routed_experts"] = part.gpu_bytes
            host = [part.host_bytes / GIB for part in experts]
            part = experts[0]
            notes.append(f"experts offloaded (patch 0014): {part.cache_per_layer} cached + {part.staging_per_layer} "
                         f"staging slots of {part.expert_mib:.1f} MiB a layer on the GPU, all "
                         f"{sum(host):.1f} GiB of routed experts pinned in host RAM")
        elif profile.offload:  # stock --cpu-offload-gb: whole layers' weights leave the GPU
            offload = profile.offload.host_gib * GIB / pp
            host = [profile.offload.host_gib / pp] * pp
            notes.append(f"{profile.offload.host_gib:g} GiB of experts offloaded to host RAM, spread over stages")
        hints = profile.planner.bits if profile.planner else {}
        moe_class = scratch.experts_class((profile.vllm.get("kernel-config") or {}).get("moe_backend"),
                                        hints.get("routed_experts", wt.DEFAULT_BITS))
        dtype = STR_DTYPE_TO_TORCH_DTYPE[setup.model_dtype]
        workspace = max(scratch.moe_workspace_bytes(moe_class, batched, text, tp, dtype),
                        sparse_workspace_bytes(setup, config, profile.vllm.get("attention-backend")))
        transient = indexer_logits_bytes(setup, config)
        reserves = [reserve.gib(workspace, transient + scratch.runner_buffer_bytes(i, pp, batched, seqs, text, dtype))
                    for i in range(pp)]
        requested = math.ceil(memory * GIB * util)  # v1/worker/utils.py: ceil(total x util)
        available = [max(0, int(requested - (sum(cls.values()) - offload) - r * GIB))
                     for cls, r in zip(per_stage, reserves)]
    if setup.drafter is not None and request.drafter_kv == "pool":
        notes.append(f"DFlash drafter KV in the pool: {setup.drafter.num_hidden_layers} layers on the last stage, "
                     f"config from {draft.source}")
    if request.drafter_kv == "own" and setup.drafter is not None:
        own = drafter_own_bytes(setup, config, bounds[-1][1])
        if not cpu:
            reserves[-1] += own / GIB
            available[-1] = max(0, available[-1] - own)
        notes.append(f"drafter KV held apart from the pool ({own / GIB:.2f} GiB on the last stage), as the seeds' "
                     "engines hold it; vLLM 0.32.0 puts it in the pool")
        setup = replace(setup, drafter=None)
    host_ram = None if cpu else profile.hardware.host_ram_gib
    host_fits = host_ram is None or sum(host) <= host_ram
    if request.drafter_kv == "sidecar" and setup.drafter is not None:
        setup = replace(setup, sidecar_block_size=int(profile.env.get(SIDECAR_ENV, 16)))
        notes.append(f"drafter KV as sidecar ids of {setup.sidecar_block_size} tokens drawn from the pool, one pool "
                     "block each, as seed 002's engine holds it; vLLM 0.32.0 groups the drafter's layers itself")
    kv = size_pool(setup, config, bounds, available)
    stages = []
    for i, (first, end) in enumerate(bounds):
        per_block = kv.bytes_per_block[i]
        stages.append(Stage(
            index=i, first_layer=first, layers=end - first,
            weights_gib=sum(per_stage[i].values()) / GIB,
            weights_by_class={k: v / GIB for k, v in per_stage[i].items()},
            reserve_gib=reserves[i], available_gib=available[i] / GIB,
            kv_gib=kv.pool_blocks * per_block / GIB, blocks=kv.num_blocks[i], bytes_per_block=per_block,
            tokens=int(kv.num_blocks[i] * kv.pool_tokens / kv.pool_blocks) if kv.pool_blocks else 0,
            host_gib=host[i]))
    binding = min(range(pp), key=lambda i: kv.num_blocks[i])
    backend = None
    if not cpu and profile.hardware.compute_capability and architecture in ("GlmMoeDsaForCausalLM",
                                                                            "Glm5NextForCausalLM"):
        from rigstack.planner.backend import select

        backend = select(profile.hardware.compute_capability, text.kv_lora_rank + text.qk_rope_head_dim,
                         setup.kv_cache_dtype, kv.block_size, text.num_attention_heads // tp, True, True)
    return Plan(
        profile=profile.name, architecture=architecture, flavour=profile.flavour, pp=pp, tp=tp, partition=partition,
        util=None if cpu else util, memory_gib=memory, max_model_len=max_len, max_num_seqs=seqs,
        kv_cache_dtype=setup.kv_cache_dtype, block_size=kv.block_size, groups=kv.groups, stages=stages,
        pool_blocks=kv.pool_blocks, pool_tokens=kv.pool_tokens, binding_stage=binding,
        sessions=kv.concurrency, starts=kv.starts and host_fits, weights_source=source, notes=notes,
        refusal=kv.refusal if host_fits else (f"host RAM: the offloaded experts take {sum(host):.1f} GiB pinned, "
                                              f"the rig has {host_ram:g} GiB (hardware.host_ram_gib)"),
        attention_backend=backend, host_gib=sum(host), host_ram_gib=host_ram, host_fits=host_fits)


def plan_for(profile: str, *, pp: int | None = None, tp: int | None = None, partition: str | list[int] | None = None,
             util: float | None = None, max_model_len: int | None = None, max_num_seqs: int | None = None,
             model: str | Path | None = None, kv_space_gib: float | None = None,
             search_partition: bool = False) -> dict[str, Any]:
    """plan() for a profile name or path, with the command line's overrides, as JSON-ready data; with
    search_partition, the searched partition's plan, with "search" comparing it to the given one."""
    from rigstack.profiles import load_profile

    if isinstance(partition, str):
        try:
            partition = [int(part) for part in partition.split(",")]
        except ValueError:
            raise UserError(f"--partition {partition!r}: give layer counts separated by commas, like 11,10,10") \
                from None
    request = Request(load_profile(profile), pp=pp, tp=tp, partition=tuple(partition) if partition else None,
                      util=util, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                      model=Path(model) if model else None, kv_space_gib=kv_space_gib)
    given = plan(request)
    result = given.to_json()
    if search_partition:
        found = search(request)
        result = found.to_json()
        result["search"] = {"given_partition": given.partition,
                            "given_pool_tokens": given.pool_tokens, "found_partition": found.partition,
                            "found_pool_tokens": found.pool_tokens}
    result["target_sessions"] = target_sessions(request.profile, result["max_num_seqs"])
    return result


def target_sessions(profile: Profile, max_num_seqs: int) -> float:
    hints = profile.planner
    return hints.target_sessions if hints and hints.target_sessions else float(max_num_seqs)


def search(request: Request, reserve: Reserve = RESERVE) -> Plan:
    """The partition that maximises the pool for the request's PP size. One plan with a stage per layer gives each
    layer's weight bytes and KV bytes per block (the block pool's bytes add up over a stage's layers); the largest
    block count every stage can reach is then found by bisection, each stage taking as many layers as still reach
    it (optimal for a bottleneck over contiguous ranges, since a stage's blocks only fall as it grows), and the
    result is planned in full. The stack asks nothing of stage boundaries beyond one layer per stage (the DFlash2
    aux relay, patch 0006, captures an aux layer on either side of a boundary)."""
    probe = plan(request, reserve)
    layers, pp = sum(probe.partition), probe.pp
    singles = plan(replace(request, pp=layers, partition=(1,) * layers), reserve).stages
    budget = singles[0].available_gib + singles[0].weights_gib  # GiB for weights and KV, the reserve taken off
    weight = [0.0, *accumulate(stage.weights_gib for stage in singles)]
    page = [0, *accumulate(stage.bytes_per_block for stage in singles)]

    def blocks(first: int, end: int) -> int:
        return max(0, int((budget - weight[end] + weight[first]) * GIB)) // (page[end] - page[first])

    def split(target: int) -> list[int] | None:
        parts, first = [], 0
        for stage in range(pp):
            end = first + 1
            if stage == pp - 1:
                end = layers
            else:
                while end < layers - (pp - 1 - stage) and blocks(first, end + 1) >= target:
                    end += 1
            if blocks(first, end) < target:
                return None
            parts.append(end - first)
            first = end
        return parts

    low, high = 0, max(stage.blocks for stage in singles)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if split(middle) else (low, middle - 1)
    return plan(replace(request, partition=tuple(split(low) or probe.partition)), reserve)
