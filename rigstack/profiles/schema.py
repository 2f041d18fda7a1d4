"""The profile schema: one frozen, strict pydantic record per rig (what hardware, model, parallelism, KV, router,
hosts, image and vLLM flags it has), its values checked by rigstack.profiles.values as it is built.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rigstack.profiles.values import (MAX_UNITS, Items, Word, env_names, env_strings, usable_values,
                                      plain_flags)

TINY_PREFIX = "tiny:"


class _Frozen(BaseModel):
    # strict: values must be the types the fields name (`port: true` is not port 1, "8000" is not 8000).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)


class Hardware(_Frozen):
    gpu_name: str | None = None  # regular expression, searched case-insensitively in NVML's device name
    compute_capability: float | None = None  # e.g. 8.0 for the 170HX: below 9.0 the stack's SM8x fallbacks are needed
    memory_gib: float | None = None  # per card, at least (what the driver reports, after any unlock)
    # Or, as the driver reports it: `nvidia-smi --query-gpu=memory.total` in MiB. Two readings where the owner's
    # words could mean either (a "64 GB" card: 65,536 or 61,035 MiB); the smaller is what plans and checks use.
    memory_mib: Annotated[int, Field(gt=0)] | Items[Annotated[int, Field(gt=0)]] | None = None
    memory_said: str | None = None  # the owner's own words for it ("64 GB per card"), for people

    @model_validator(mode="after")
    def _one_memory(self) -> Hardware:
        if self.memory_gib is not None and self.memory_mib is not None:
            raise ValueError("give memory_mib (the driver's MiB) or memory_gib, not both")
        return self

    @property
    def card_gib(self) -> float | None:
        """A card's memory, GiB: the smallest reading."""
        readings = self.readings_gib
        return min(readings) if readings else None

    @property
    def readings_gib(self) -> tuple[float, ...]:
        if self.memory_mib:
            readings = (self.memory_mib,) if isinstance(self.memory_mib, int) else self.memory_mib
            return tuple(mib / 1024 for mib in readings)
        return (self.memory_gib,) if self.memory_gib else ()
    link: str | None = None  # e.g. "pcie-gen2-x4": shown, and a reminder of what the numbers assume
    p2p: bool | None = None  # False: the rig has no peer-to-peer path, so TP across cards is off the table
    driver_min: str | None = None
    host_ram_gib: float | None = None
    shm_gib: float | None = None


class Shape(_Frozen):
    """What the model's config.json must say (unset fields are not checked)."""

    architectures: Items[str] | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    vocab_size: int | None = None
    index_topk: int | None = None


class Licence(_Frozen):
    name: str
    commercial: bool = True
    ack_env: str | None = None  # an env var that must be "1" before these weights are used


class Weights(_Frozen):
    path: str  # a host path, or tiny:KIND
    revision: str | None = None
    source: str | None = None  # where the weights come from (hub id), for people
    shape: Shape = Shape()
    size_gib: float | None = None  # total of the weight files, for the size and disk checks
    licence: Licence | None = None

    @field_validator("path")
    @classmethod
    def _absolute_or_tiny(cls, value: str) -> str:
        if not (value.startswith(TINY_PREFIX) or value.startswith("/")):
            raise ValueError("must be an absolute host path or tiny:KIND")
        return value


class Model(Weights):
    served_name: Word
    # The weights one rank holds once loaded, as the owner measured them, at the profile's parallel.tp and one PP
    # stage (seed 004: "Each GPU rank loaded 81.44 GB of target weights"); the planner takes it over size_gib.
    rank_gib: float | None = Field(None, gt=0)


class Parallel(_Frozen):
    tp: int = Field(1, ge=1, le=MAX_UNITS)
    pp: int = Field(1, ge=1, le=MAX_UNITS)
    replicas: int = Field(1, ge=1, le=MAX_UNITS)  # independent tp x pp units on distinct GPUs, ports port, port+1, ...
    partition: Items[int] | None = None  # layers per PP stage, rendered as VLLM_PP_LAYER_PARTITION
    # GPU indices per replica (seed 004: [[0, 1], [2, 3], ...]); replica i takes set i. Unset: consecutive runs.
    gpu_sets: Items[Items[Annotated[int, Field(ge=0)]]] | None = None

    @model_validator(mode="after")
    def _gpu_sets_fit(self) -> Parallel:
        """Bad sets fail at load, before anything starts: each replica needs its own, whole set."""
        if self.gpu_sets is None:
            return self
        if len(self.gpu_sets) < self.replicas:
            raise ValueError(f"'gpu_sets': {self.replicas} replicas but only {len(self.gpu_sets)} GPU set(s); "
                             "lower parallel.replicas or list more sets")
        owner: dict[int, int] = {}
        for index, gpus in enumerate(self.gpu_sets):
            if len(gpus) != self.gpus_per_replica:
                raise ValueError(f"'gpu_sets': set {index} {list(gpus)} has {len(gpus)} GPU(s), a replica of tp "
                                 f"{self.tp} x pp {self.pp} needs {self.gpus_per_replica}")
            for gpu in gpus:
                if gpu in owner:
                    raise ValueError(f"'gpu_sets': GPU {gpu} is in set {owner[gpu]} and set {index}; give each "
                                     "replica its own GPUs")
                owner[gpu] = index
        return self

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas


class KvCache(_Frozen):
    """A first estimate of KV bytes; a full planner comes later."""

    # None: 2 x num_key_value_heads x head_dim x 2 bytes from the model's config.json.
    bytes_per_token_per_layer: int | None = None
    extra_bytes_per_token_per_layer: int = 0  # e.g. FP8 indexer keys beside packed fp8_ds_mla (seed 003: 132)
    layers: int | None = None  # layers that hold KV; None: all of num_hidden_layers
    reserve_gib_per_gpu: float = 2.0  # activations, CUDA graphs, NCCL buffers


class Offload(_Frozen):
    host_gib: float  # expert weights kept in host RAM
    hot_experts_per_layer: int | None = None  # seed 000: 54 as shipped, 66 at peak; for the offload patch
    grouped_prefill_min_tokens: int | None = None  # seed 000: prefill in groups of 64 experts from 48 tokens
    hot_set: str | None = None  # the hot-set file (scripts/expert_trace.py writes it); set: patch 0014's offload


class PlannerHints(_Frozen):
    """What the capacity planner (rigstack.planner) needs that a checkpoint would otherwise give."""

    # The model's config.json keys (model_type, architectures and whatever differs from transformers' defaults for
    # that class), used when the model folder is not on this machine.
    config: dict[str, Any] = {}
    # Bits per parameter, scales included, per tensor class (routed_experts, shared_experts, attention, dense_mlp,
    # embed, head, router, other), used when no checkpoint is present; unset classes count 16.
    bits: dict[str, float] = {}
    drafter_gib: float = Field(0.0, ge=0)  # a separate drafter's weights, on the last stage
    # The DFlash drafter's config.json keys, used when the drafter folder is not on this machine (its KV layers
    # and, without drafter_gib, its weights from the shapes).
    drafter_config: dict[str, Any] = {}
    kernel_block_sizes: Items[int] = (16,)  # the attention backends' kernel block sizes (hybrid alignment)
    target_sessions: float | None = Field(None, gt=0)  # full-length requests to hold (default: max-num-seqs)


class Docker(_Frozen):
    shm_size: Word = "16g"
    ipc: Word = "host"
    memory: Word | None = None  # `docker run --memory`: a cap, so a container cannot take the host's RAM
    # A patched vllm package on the host whose changed files are mounted read-only over the image's package (seed
    # 002's way; rigstack.rigimages.bind_mounts), instead of the files a rig image has laid.
    bind_package: str | None = None


class Router(_Frozen):
    """vllm-router in front of the replicas (rigstack.replicas), on the public port."""

    policy: Literal["cache_aware", "round_robin", "consistent_hash", "power_of_two", "random"] = "cache_aware"
    port: int = Field(ge=1, le=65535)  # the public port; the replicas keep port, port+1, ...
    metrics_port: int = Field(29000, ge=1, le=65535)  # the router's own Prometheus port (it always opens one)
    health_check_interval_s: int = Field(5, ge=1, le=3600)  # how soon a dead replica leaves rotation
    health_failure_threshold: int = Field(2, ge=1, le=100)
    health_success_threshold: int = Field(1, ge=1, le=100)
    # cache_aware balances by in-flight requests only once (max - min) > this (router default 64): with a few
    # running requests per replica, as seed 004's four, the default never balances.
    balance_abs_threshold: int = Field(64, ge=0, le=1_000_000)


class RayCluster(_Frozen):
    """The ports of a Ray cluster across hosts (rigstack.multinode); fixed, so a firewall can open them."""

    port: int = Field(6379, ge=1, le=65535)  # the head's GCS
    node_manager_port: int = Field(6380, ge=1, le=65535)
    object_manager_port: int = Field(6381, ge=1, le=65535)
    min_worker_port: int = Field(10002, ge=1, le=65535)
    max_worker_port: int = Field(10200, ge=1, le=65535)


class Host(_Frozen):
    """One machine of a multi-host profile; the first is the Ray head and runs `vllm serve`."""

    address: Word  # the address the others reach it at
    gpus: int = Field(ge=1, le=MAX_UNITS)  # GPUs (or, on cpu profiles, pipeline stages) this host holds
    ssh: Word | None = None  # ssh destination when it differs from the address (user@name)
    # The serving venv's interpreter there (its ray beside it); default: the one the launch runs in, found as
    # rigstack.interpreter finds it (every host then holds that venv at the same path).
    python: Word | None = None


class Profile(_Frozen):
    name: str
    description: str
    seed: str | None = None
    flavour: Literal["gpu", "cpu"] = "gpu"
    hardware: Hardware = Hardware()
    model: Model
    drafter: Weights | None = None
    parallel: Parallel = Parallel()
    kv: KvCache = KvCache()
    offload: Offload | None = None
    planner: PlannerHints | None = None
    env: dict[str, str] = {}
    vllm: dict[str, Any] = {}  # long flag name without dashes in front -> value (see rigstack.render)
    router: Router | None = None
    hosts: Items[Host] = ()  # two or more: one engine across hosts on Ray (rigstack.multinode)
    ray: RayCluster = RayCluster()
    image: Word | None = None
    docker: Docker = Docker()
    host: Word = "0.0.0.0"
    port: int = Field(8000, ge=1, le=65535)
    health_timeout_s: int = Field(600, ge=1, le=7 * 24 * 3600)
    source_files: Items[str] = ()

    @model_validator(mode="before")
    @classmethod
    def _usable_values(cls, data: Any) -> Any:
        return usable_values(data)

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        return env_strings(value)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return env_names(value)

    @field_validator("vllm")
    @classmethod
    def _flags(cls, value: dict[str, Any]) -> dict[str, Any]:
        return plain_flags(value)

    @model_validator(mode="after")
    def _partition_matches_pp(self) -> Profile:
        partition = self.parallel.partition
        if partition is not None and len(partition) != self.parallel.pp:
            raise ValueError(f"'parallel.partition': {len(partition)} stages but parallel.pp is "
                             f"{self.parallel.pp}; give one layer count per stage")
        if self.flavour == "cpu" and self.hardware.gpu_name is not None:
            raise ValueError("'hardware.gpu_name': a cpu profile matches no GPU; remove it")
        if self.port + self.parallel.replicas - 1 > 65535:
            raise ValueError(f"'port': replica {self.parallel.replicas - 1} would listen on port "
                             f"{self.port + self.parallel.replicas - 1}, past 65535; lower port: or parallel.replicas")
        if self.router is not None and self.router.port in range(self.port, self.port + self.parallel.replicas):
            raise ValueError(f"'router.port': {self.router.port} is also a replica's port ({self.port} to "
                             f"{self.port + self.parallel.replicas - 1}); move port: or router.port")
        if self.hosts:
            self._check_hosts()
        return self

    def _check_hosts(self) -> None:
        addresses = [host.address for host in self.hosts]
        twice = next((address for address in addresses if addresses.count(address) > 1), None)
        if twice:
            raise ValueError(f"'hosts': {twice} is listed twice; each host once")
        if len(self.hosts) < 2:
            raise ValueError("'hosts': one host needs no Ray cluster; remove hosts: or list two or more")
        if self.parallel.replicas != 1 or self.router is not None:
            raise ValueError("'hosts': one engine spans the hosts; replicas and router do not combine with hosts:")
        total = sum(host.gpus for host in self.hosts)
        if total != self.parallel.gpus_per_replica:
            raise ValueError(f"'hosts': the hosts hold {total} GPU(s) but tp {self.parallel.tp} x pp "
                             f"{self.parallel.pp} needs {self.parallel.gpus_per_replica}; make them agree")

    @property
    def gpus_needed(self) -> int:
        """GPUs this host must have: the head's share across hosts; with gpu_sets, up to the highest index used."""
        if self.flavour == "cpu":
            return 0
        if self.hosts:
            return self.hosts[0].gpus
        if self.parallel.gpu_sets:
            return 1 + max(gpu for gpus in self.parallel.gpu_sets[:self.parallel.replicas] for gpu in gpus)
        return self.parallel.gpus

    @property
    def speculative(self) -> dict[str, Any] | None:
        spec = self.vllm.get("speculative-config")
        return spec if isinstance(spec, dict) else None

    @property
    def partition_env(self) -> str | None:
        partition = self.parallel.partition
        return ",".join(str(n) for n in partition) if partition else None
