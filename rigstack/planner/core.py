"""The plan: per stage weights, non-KV reserve and KV bytes, then vLLM's own sizing of the pool (rigstack.planner.kv).

Runs in an interpreter that has vLLM (and transformers, which ships the model configs); see rigstack.planner.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rigstack.errors import UserError
from rigstack.planner import weights as wt
from rigstack.planner.config import Drafter, linear_layers, load_config, load_drafter_config, mtp_layers, text_config
from rigstack.planner.offload import split as offload_split
from rigstack.planner.sizes import drafter_bytes, target_sizes
from rigstack.profiles import Profile, model_dir

if TYPE_CHECKING:
    from rigstack.planner.kv import KvResult, KvSetup

GIB = 1024**3
# vLLM 0.34.0's defaults where a profile sets no flag. Batched tokens and sequences: EngineArgs's for an API server
# on a card under 70 GiB (as in 0.32.0; from 70 GiB, A100 aside, it takes 8192 and 1024, not modelled here).
DEFAULT_BATCHED_TOKENS = 2048
DEFAULT_MAX_NUM_SEQS = 256
# CacheConfig.resolved_gpu_memory_utilization: 1.0 under the extensible KV cache, on by default on CUDA since
# 0.34.0 (it sizes the cache from memory measured after warmup); 0.92 without it, as 0.32.0 had it.
DEFAULT_UTIL = 1.0
# platforms/cpu.py: a non-MLA model without --block-size gets 128-token blocks on CPU (0.34.0 picks it in
# update_block_size_for_backend, the CPU backend's preferred size for 128).
CPU_BLOCK_SIZE = 128


@dataclass(frozen=True)
class Reserve:
    """The non-KV memory of one stage beside its weights, in GiB: a fixed part (CUDA context, NCCL buffers, the
    CUDA-graph pool, which vLLM measures after capture) plus the profile run's scratch as vLLM's own shape
    functions size it (planner.scratch): the larger of the fused-MoE workspaces and the sparse-MLA workspaces,
    because vLLM's WorkspaceManager serves both from one shared allocation, plus the allocations beside it (the
    indexer's logits sentinel; the runner's buffers on that stage). fixed_gib is the one fitted constant, fitted on
    every measured published case jointly (planner.heldout); README, "Capacity planner", gives its held-out error."""

    fixed_gib: float = 1.573  # python -m rigstack plan-published --held-out

    def gib(self, workspace_bytes: int, buffer_bytes: int = 0) -> float:
        return self.fixed_gib + (workspace_bytes + buffer_bytes) / GIB


RESERVE = Reserve()


@dataclass
class Stage:
    """One PP stage, per card. weights + reserve + available = the card's budget (memory x util); of available,
    own_pool_gib goes to groups with a pool of their own (patch 0016), the rest to the shared pool's blocks."""

    index: int
    first_layer: int
    layers: int
    weights_gib: float  # on the card (offloaded experts are in host_gib)
    weights_by_class: dict[str, float]
    reserve_gib: float
    available_gib: float  # the KV budget, what vLLM's determine_available_memory returns for this stage
    bytes_per_block: int  # one pool block on this stage: every group's page of its layers here
    blocks: int  # what this stage's KV budget alone holds ((available - own_pool) // bytes_per_block)
    tokens: int  # tokens those blocks alone would hold
    pool_gib: float  # what vLLM allocates here: the pool's blocks (the minimum over stages) x bytes_per_block
    request_gib: float  # one max-model-len request's KV on this stage, as vLLM's startup check counts it
    holds_one: bool  # this stage's own startup check passes
    own_pool_gib: float = 0.0  # its sliding-window layers' pool of their own (VLLM_SWA_OWN_POOL, patch 0016)
    host_gib: float = 0.0  # pinned host RAM for this stage's offloaded experts (patch 0014; planner.offload)
    # The startup check's room: KV budget less its own pools and the null block, less one request (negative: short).
    margin_gib: float = 0.0


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
    budget_gib: float  # per card: memory x util (GPU), the KV space (CPU)
    max_model_len: int
    max_num_seqs: int
    kv_cache_dtype: str
    block_size: int
    groups: list[str]
    stages: list[Stage]
    pool_blocks: int
    pool_tokens: int
    binding_stage: int  # the stage with the fewest blocks, which sets the pool
    sessions: float
    starts: bool
    refusal: str | None
    refusal_stage: int | None  # the stage vLLM's refusal is about (the first whose check fails)
    short_stages: list[int]  # every stage whose own check fails
    weights_source: str
    notes: list[str] = field(default_factory=list)
    attention_backend: dict[str, Any] | None = None  # vLLM's CUDA selector for the rig (GPU profiles)
    host_gib: float = 0.0  # pinned host RAM the offloaded experts take, all stages (planner.offload)
    host_ram_gib: float | None = None  # the profile's hardware.host_ram_gib
    host_fits: bool = True
    prefix_caching: bool = False  # finished requests' blocks stay cached, so the whole pool can be in use

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
    memory_gib: float | None = None  # gpu flavour: a card's memory (the rig's NVML reading), else the profile's
    # "pool": a DFlash drafter's KV layers join the pool, grouped by vLLM's own grouping (what the pin does);
    # "own": held apart on the last stage (kv.drafter_own_bytes), seed 003's engine's accounting; "sidecar": seed
    # 002's, its ids drawn from the pool at the profile's VLLM_GLM5N_SIDECAR_BLOCK_SIZE (kv.sidecar_group).
    drafter_kv: DrafterKv = "pool"


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


# --- what the request resolves to -------------------------------------------------------------------------------


def _flag(profile: Profile, name: str, default: Any) -> Any:
    value = profile.vllm.get(name)
    return default if value is None else value


@dataclass(frozen=True)
class Target:
    """A request resolved against its profile and the model's config."""

    profile: Profile
    folder: Path | None
    config: Any
    architecture: str
    pp: int
    tp: int
    partition: list[int]
    util: float
    draft: Drafter | None
    setup: KvSetup
    memory_gib: float | None  # a card's memory: the request's, else the profile's smallest reading

    @property
    def text(self) -> Any:
        return text_config(self.config)

    @property
    def cpu(self) -> bool:
        return self.profile.flavour == "cpu"


def _layout(request: Request, layers: int, heads: int) -> tuple[int, int, list[int]]:
    profile = request.profile
    pp = request.pp or profile.parallel.pp
    tp = request.tp or profile.parallel.tp
    if heads % tp:  # vLLM's ModelConfig.verify_with_parallel_config refuses the boot the same way
        divisors = [n for n in range(1, min(heads, 64) + 1) if heads % n == 0]
        raise UserError(f"TP{tp} does not divide the model's {heads} attention heads (vLLM refuses it); give --tp "
                        f"one of {', '.join(map(str, divisors))}")
    given = request.partition or (profile.parallel.partition if pp == profile.parallel.pp else None)
    if given is None and pp > layers:
        raise UserError(f"PP{pp} has more stages than the model's {layers} layers; give --pp {layers} or fewer")
    partition = list(given or vllm_partition(layers, pp))
    check_partition(partition, layers, pp)
    return pp, tp, partition


def resolve(request: Request) -> Target:
    profile = request.profile
    folder = request.model or model_dir(profile.model, build=False)
    config, architecture = load_config(profile, folder)
    text = text_config(config)
    pp, tp, partition = _layout(request, text.num_hidden_layers, text.num_attention_heads)
    util = request.util if request.util is not None else float(_flag(profile, "gpu-memory-utilization", DEFAULT_UTIL))
    if not 0 < util <= 1:
        raise UserError(f"--util {util:g} is outside (0, 1]; vLLM takes gpu-memory-utilization as a fraction")
    draft = load_drafter_config(profile)
    from rigstack.planner.kv import KvSetup  # vLLM: late

    spec, cpu = profile.speculative or {}, profile.flavour == "cpu"
    setup = KvSetup(
        architecture=architecture,
        max_model_len=request.max_model_len or int(_flag(profile, "max-model-len",
                                                          getattr(text, "max_position_embeddings", 0))),
        max_num_seqs=request.max_num_seqs or int(_flag(profile, "max-num-seqs", DEFAULT_MAX_NUM_SEQS)),
        max_num_batched_tokens=int(_flag(profile, "max-num-batched-tokens", DEFAULT_BATCHED_TOKENS)),
        block_size=profile.vllm.get("block-size") or (CPU_BLOCK_SIZE if cpu else None),
        kv_cache_dtype=str(_flag(profile, "kv-cache-dtype", "auto")),
        model_dtype=str(_flag(profile, "dtype", "bfloat16")).replace("auto", "bfloat16"), tp=tp, pp=pp,
        num_speculative_tokens=int(spec.get("num_speculative_tokens", 0)), speculative_method=spec.get("method"),
        enable_prefix_caching=bool(_flag(profile, "enable-prefix-caching", False)),
        kernel_block_sizes=tuple(profile.planner.kernel_block_sizes) if profile.planner else (16,), cpu=cpu,
        mtp_layers=mtp_layers(profile, text), drafter=draft.config if draft else None,
        drafter_kv_cache_dtype=spec.get("kv_cache_dtype"), util=None if cpu else util,
        # On by default (0.34.0's VllmConfig: the executors the rigs use support it; 0.32.0's V1 runner also took it
        # off under PP); the CPU platform turns it off whatever is asked (platforms/cpu.py).
        async_scheduling=not cpu and bool(_flag(profile, "async-scheduling", True)),
        env=tuple(sorted(profile.env.items())))
    return Target(profile, folder, config, architecture, pp, tp, partition, util, draft, setup,
                  request.memory_gib or profile.hardware.card_gib)


# --- each stage's budget ----------------------------------------------------------------------------------------


@dataclass
class Budget:
    """Per stage: weights on the card by class (bytes), reserve (GiB), KV budget (bytes), pinned host RAM (GiB)."""

    weights: list[dict[str, float]]
    reserves: list[float]
    available: list[int]
    host: list[float]
    source: str
    budget_gib: float
    notes: list[str] = field(default_factory=list)


def _cpu_budget(target: Target, request: Request) -> Budget:
    profile = target.profile
    space = request.kv_space_gib if request.kv_space_gib is not None else profile.env.get("VLLM_CPU_KVCACHE_SPACE")
    if space is None:
        raise UserError(f"profile {profile.name}: a cpu profile needs VLLM_CPU_KVCACHE_SPACE in env (GiB)")
    # cpu_worker.determine_available_memory: the KV space is taken as given, as whole GiB.
    pp = target.pp
    return Budget([{} for _ in range(pp)], [0.0] * pp, [int(float(space)) * GIB] * pp, [0.0] * pp,
                  f"VLLM_CPU_KVCACHE_SPACE={space} GiB per stage (cpu_worker takes it as the KV budget)",
                  float(int(float(space))))


def _offload(target: Target, loaded: dict[str, float], budget: Budget) -> None:
    """Patch 0014's hot-set offload (each MoE layer's cache and staging slots stay on the card, every routed expert
    is pinned in host RAM), or stock --cpu-offload-gb (whole layers' weights leave the card, spread over stages)."""
    profile, bounds = target.profile, bounds_of(target.partition)
    experts = offload_split(profile, loaded, bounds, target.tp, int(getattr(target.text, "n_routed_experts", 0) or 0))
    if experts is not None:
        for cls, part in zip(budget.weights, experts):
            if part.moe_layers:
                cls["routed_experts"] = part.gpu_bytes
        budget.host = [part.host_bytes / GIB for part in experts]
        part = experts[0]
        prefetched = f" + {part.prefetch_per_layer} prefetch" if part.prefetch_per_layer else ""
        staging = (f"{part.staging_per_layer} staging slots shared by the stage's layers (0019)"
                   if part.shared_staging else f"{part.staging_per_layer} staging slots a layer")
        budget.notes.append(f"experts offloaded (patch 0014): {part.cache_per_layer} cached{prefetched} a layer and "
                            f"{staging}, of {part.expert_mib:.1f} MiB, on the GPU, all {sum(budget.host):.1f} GiB of "
                            "routed experts pinned in host RAM")
    elif profile.offload:
        share = profile.offload.host_gib / target.pp
        for cls in budget.weights:
            cls["offloaded"] = -share * GIB
        budget.host = [share] * target.pp
        budget.notes.append(f"{profile.offload.host_gib:g} GiB of experts offloaded to host RAM, spread over stages")


def _reserves(target: Target, reserve: Reserve) -> list[float]:
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

    from rigstack.planner import scratch
    from rigstack.planner.kv import rig_env

    profile, setup, text, pp = target.profile, target.setup, target.text, target.pp
    bits = profile.planner.bits if profile.planner else {}
    moe_class = scratch.experts_class((profile.vllm.get("kernel-config") or {}).get("moe_backend"),
                                      bits.get("routed_experts", wt.DEFAULT_BITS))
    dtype = STR_DTYPE_TO_TORCH_DTYPE[setup.model_dtype]
    batched, seqs = setup.max_num_batched_tokens, setup.max_num_seqs
    workspace = max(scratch.moe_workspace_bytes(moe_class, batched, text, target.tp, dtype),
                    scratch.sparse_workspace_bytes(setup, target.config, profile.vllm.get("attention-backend")))
    with rig_env(setup):
        transient = scratch.indexer_logits_bytes(setup, target.config)
    return [reserve.gib(workspace, transient + scratch.runner_buffer_bytes(i, pp, batched, seqs, text, dtype))
            for i in range(pp)]


def _gpu_budget(target: Target, reserve: Reserve) -> Budget:
    profile = target.profile
    memory = target.memory_gib
    if not memory:
        raise UserError(f"profile {profile.name}: hardware.memory_mib is not set; give the card's memory as the "
                        "driver reports it (nvidia-smi --query-gpu=memory.total, MiB)")
    sizes = target_sizes(profile, target.config, target.architecture, target.folder)
    weights = wt.stage_bytes(sizes.loaded, bounds_of(target.partition), (), target.tp, linear_layers(target.config))
    budget = Budget(weights, _reserves(target, reserve), [], [0.0] * target.pp, sizes.source, memory * target.util)
    drafter = drafter_bytes(profile, target.draft, target.text.hidden_size, target.pp, target.tp)
    method = (profile.speculative or {}).get("method")
    if method not in (None, "mtp") and drafter is None:
        budget.notes.append(f"drafter ({method}) weights and KV not modelled: no drafter config.json, "
                            "planner.drafter_config or planner.drafter_gib")
    if drafter:
        weights[-1]["drafter"] = drafter
    _offload(target, sizes.loaded, budget)
    requested = math.ceil(memory * GIB * target.util)  # v1/worker/utils.py: ceil(total x util)
    budget.available = [max(0, int(requested - sum(cls.values()) - r * GIB))
                        for cls, r in zip(weights, budget.reserves)]
    return budget


def _drafter_accounting(request: Request, target: Target, budget: Budget) -> KvSetup:
    """The KvSetup vLLM's sizing gets for the request's drafter_kv (see Request), with its note."""
    from rigstack.planner.kv import drafter_own_bytes

    setup, draft = target.setup, target.draft
    if setup.drafter is None or draft is None:
        return setup
    if request.drafter_kv == "pool":
        budget.notes.append(f"DFlash drafter KV in the pool: {setup.drafter.num_hidden_layers} layers on the last "
                            f"stage, config from {draft.source}")
        return setup
    if request.drafter_kv == "own":
        own = drafter_own_bytes(setup, target.config, bounds_of(target.partition)[-1][1])
        if not target.cpu:
            budget.reserves[-1] += own / GIB
            budget.available[-1] = max(0, budget.available[-1] - own)
        budget.notes.append(f"drafter KV held apart from the pool ({own / GIB:.2f} GiB on the last stage), as the "
                            "seeds' engines hold it; vLLM 0.34.0 puts it in the pool")
        return replace(setup, drafter=None)
    sidecar = replace(setup, sidecar_block_size=int(target.profile.env.get(SIDECAR_ENV, 16)))
    budget.notes.append(f"drafter KV as sidecar ids of {sidecar.sidecar_block_size} tokens drawn from the pool, one "
                        "pool block each, as seed 002's engine holds it; vLLM 0.34.0 groups the drafter's layers "
                        "itself")
    return sidecar


# --- the plan ---------------------------------------------------------------------------------------------------


def _stages(target: Target, budget: Budget, kv: KvResult) -> list[Stage]:
    stages = []
    for i, (first, end) in enumerate(bounds_of(target.partition)):
        per_block = kv.bytes_per_block[i]
        stages.append(Stage(
            index=i, first_layer=first, layers=end - first,
            weights_gib=sum(budget.weights[i].values()) / GIB,
            weights_by_class={k: v / GIB for k, v in budget.weights[i].items()},
            reserve_gib=budget.reserves[i], available_gib=budget.available[i] / GIB, bytes_per_block=per_block,
            blocks=kv.num_blocks[i],
            tokens=int(kv.num_blocks[i] * kv.pool_tokens / kv.pool_blocks) if kv.pool_blocks else 0,
            pool_gib=kv.pool_blocks * per_block / GIB, request_gib=kv.needed[i] / GIB, holds_one=i not in kv.short,
            own_pool_gib=kv.own_pool[i] / GIB, host_gib=budget.host[i],
            margin_gib=kv.margins[i] / GIB))
    return stages


def _backend(target: Target, block_size: int) -> dict[str, Any] | None:
    hardware, text = target.profile.hardware, target.text
    if target.cpu or not hardware.compute_capability or target.architecture not in ("GlmMoeDsaForCausalLM",
                                                                                   "Glm5NextForCausalLM"):
        return None
    from rigstack.planner.backend import select

    return select(hardware.compute_capability, text.kv_lora_rank + text.qk_rope_head_dim,
                  target.setup.kv_cache_dtype, block_size, text.num_attention_heads // target.tp, True, True,
                  _flag(target.profile, "attention-backend", None))


def plan(request: Request, reserve: Reserve = RESERVE) -> Plan:
    from rigstack.planner.kv import size_pool  # vLLM: late

    target = resolve(request)
    profile = target.profile
    budget = _cpu_budget(target, request) if target.cpu else _gpu_budget(target, reserve)
    setup = _drafter_accounting(request, target, budget)
    kv = size_pool(setup, target.config, bounds_of(target.partition), budget.available)
    host_ram = None if target.cpu else profile.hardware.host_ram_gib
    host_fits = host_ram is None or sum(budget.host) <= host_ram
    refusal, refusal_stage = kv.refusal, kv.refusal_stage
    if not host_fits:
        refusal, refusal_stage = (f"host RAM: the offloaded experts take {sum(budget.host):.1f} GiB pinned, the rig "
                                  f"has {host_ram:g} GiB (hardware.host_ram_gib)"), None
    return Plan(
        profile=profile.name, architecture=target.architecture, flavour=profile.flavour, pp=target.pp, tp=target.tp,
        partition=target.partition, util=None if target.cpu else target.util,
        memory_gib=None if target.cpu else target.memory_gib, budget_gib=budget.budget_gib,
        max_model_len=setup.max_model_len, max_num_seqs=setup.max_num_seqs, kv_cache_dtype=setup.kv_cache_dtype,
        block_size=kv.block_size, groups=kv.groups, stages=_stages(target, budget, kv), pool_blocks=kv.pool_blocks,
        pool_tokens=kv.pool_tokens, binding_stage=min(range(target.pp), key=kv.num_blocks.__getitem__),
        sessions=kv.concurrency, starts=kv.starts and host_fits, refusal=refusal, refusal_stage=refusal_stage,
        short_stages=kv.short, weights_source=budget.source, notes=budget.notes,
        attention_backend=_backend(target, kv.block_size), host_gib=sum(budget.host), host_ram_gib=host_ram,
        host_fits=host_fits, prefix_caching=setup.enable_prefix_caching)
