"""Hardware profiles: one YAML file per rig, validated into a frozen record; `extends:` overlays deep-merge.

The one YAML loader (safe, with line numbers), the one schema and the one loading function live here.
A profile file names no `name:` (the file stem is the name). `extends: OTHER` (a profile name looked up beside the
file, then in profiles/, or a path) deep-merges this file over OTHER: mappings merge key by key, lists and scalars
replace, and `null` removes a vLLM flag or env var the base sets.
Model paths are host paths, or `tiny:KIND` for the locally built tiny model (rigstack.tinymodel), resolved by
model_dir() when it is needed, never at load time.
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rigstack.errors import UserError
from rigstack.versions import REPO_ROOT

PROFILES_DIR = REPO_ROOT / "profiles"
DEFAULT_PROFILE = "cpu-tiny"
TINY_PREFIX = "tiny:"
# Flags the renderer writes from other fields; a profile setting them directly would fight it.
RENDERED_FLAGS = {
    "model": "model.path", "served-model-name": "model.served_name", "port": "port", "host": "host",
    "tensor-parallel-size": "parallel.tp", "pipeline-parallel-size": "parallel.pp", "config": "(nothing)",
}
_FLAG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOADER_KEYS = ("name", "source_files")
_NAMED_KEY = re.compile(r"^'([^']+)': ")  # set by the loader, never by a file
# Limits far beyond any rig, so that a hostile or mistyped file fails at once instead of exhausting the host.
MAX_DEPTH = 32  # nesting of mappings and lists
MAX_VALUES = 10_000  # values after YAML aliases are expanded (an alias bomb is small on disk, huge in memory)
MAX_INT = 2**53  # every larger integer stops being exact as a float, and no setting needs one
MAX_UNITS = 1024  # tp, pp and replicas each
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # tab and newline are fine; NUL cannot even reach exec()
# argparse reads a word starting with "-" as an option unless it looks like a negative number (its own pattern).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def option_like(word: str) -> bool:
    """True when an argument parser would take this word for an option rather than a value."""
    return word.startswith("-") and not _NEGATIVE_NUMBER.match(word)


def _plain_word(value: str) -> str:
    if option_like(value):
        raise ValueError(f"{value!r} starts with '-', so it would reach the command line as an option; "
                         "write the value without the dash")
    return value


def _non_finite(text: str) -> bool:
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


Word = Annotated[str, AfterValidator(_plain_word)]  # a string rendered as one argv word of vllm or docker


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Hardware(_Frozen):
    gpu_name: str | None = None  # regular expression, searched case-insensitively in NVML's device name
    compute_capability: float | None = None  # e.g. 8.0 for the 170HX: below 9.0 the stack's SM8x fallbacks are needed
    memory_gib: float | None = None  # per card, at least (what the driver reports, after any unlock)
    link: str | None = None  # e.g. "pcie-gen2-x4": shown, and a reminder of what the numbers assume
    p2p: bool | None = None  # False: the rig has no peer-to-peer path, so TP across cards is off the table
    driver_min: str | None = None
    host_ram_gib: float | None = None
    shm_gib: float | None = None


class Shape(_Frozen):
    """What the model's config.json must say (unset fields are not checked)."""

    architectures: tuple[str, ...] | None = None
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


class Parallel(_Frozen):
    tp: int = Field(1, ge=1, le=MAX_UNITS)
    pp: int = Field(1, ge=1, le=MAX_UNITS)
    replicas: int = Field(1, ge=1, le=MAX_UNITS)  # independent tp x pp units on distinct GPUs, ports port, port+1, ...
    partition: tuple[int, ...] | None = None  # layers per PP stage, rendered as VLLM_PP_LAYER_PARTITION
    # GPU indices per replica (seed 004: [[0, 1], [2, 3], ...]); replica i takes set i. Unset: consecutive runs.
    gpu_sets: tuple[tuple[Annotated[int, Field(ge=0)], ...], ...] | None = None

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
    kernel_block_sizes: tuple[int, ...] = (16,)  # the attention backends' kernel block sizes (hybrid alignment)
    target_sessions: float | None = Field(None, gt=0)  # full-length requests to hold (default: max-num-seqs)


class Docker(_Frozen):
    shm_size: Word = "16g"
    ipc: Word = "host"
    memory: Word | None = None  # `docker run --memory`: a cap, so a container cannot take the host's RAM
    # A patched vllm package on the host whose changed files are mounted read-only over the image's package (seed
    # 002's way; rigstack.images.bind_mounts), instead of the files a rig image has laid.
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
    hosts: tuple[Host, ...] = ()  # two or more: one engine across hosts on Ray (rigstack.multinode)
    ray: RayCluster = RayCluster()
    image: Word | None = None
    docker: Docker = Docker()
    host: Word = "0.0.0.0"
    port: int = Field(8000, ge=1, le=65535)
    health_timeout_s: int = Field(600, ge=1, le=7 * 24 * 3600)
    source_files: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _usable_numbers(cls, data: Any) -> Any:
        """Infinities, NaN and huge integers fail here, named, rather than as an OverflowError in some check."""
        for path, value in _leaves(data):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"'{_dotted(path)}': {value} is not a finite number")
            if isinstance(value, int) and abs(value) > MAX_INT:
                raise ValueError(f"'{_dotted(path)}': a {len(str(abs(value)))}-digit number is out of range")
        return data

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for key, item in value.items():
            if isinstance(item, bool):
                raise ValueError(f"{key!r}: write the value as a quoted string (\"1\" or \"0\"), not {item}")
            if item is None:
                continue  # an overlay removing the base's variable
            out[key] = str(item) if isinstance(item, (int, float)) else item
        return out

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r}: not an environment variable name")
            if key == "VLLM_PP_LAYER_PARTITION":
                raise ValueError(f"{key!r}: set parallel.partition instead")
        return value

    @field_validator("vllm")
    @classmethod
    def _flags(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            if not isinstance(key, str) or not _FLAG.match(key):
                fixed = str(key).lstrip("-").replace("_", "-").lower()
                raise ValueError(f"{key!r}: write long flag names without dashes in front, like {fixed!r}")
            # argparse also takes an unambiguous prefix (--hos for --host), and the last value wins.
            rendered = next((flag for flag in RENDERED_FLAGS if flag.startswith(key)), None)
            if rendered:
                raise ValueError(f"{key!r}: --{rendered} is rendered from {RENDERED_FLAGS[rendered]}; set that "
                                 "instead")
            # A list renders as one argv word per item, so each item must be a plain value, never an option:
            # [bf16, "--port", "9999"] would otherwise add flags of its own to the server's command line.
            words = item if isinstance(item, list) else [item]
            plain = [word for word in words if isinstance(word, (str, int, float)) and not isinstance(word, bool)]
            if isinstance(item, list) and len(plain) != len(item):
                raise ValueError(f"{key!r}: a list of values holds plain strings or numbers only")
            for word in plain:
                if option_like(str(word)):
                    raise ValueError(f"{key!r}: value {str(word)!r} starts with '-', so vLLM would read it as a "
                                     "flag of its own; set each flag under its own key")
                if isinstance(word, str) and _non_finite(word):  # YAML reads 1e400 as text; vLLM as a number
                    raise ValueError(f"{key!r}: {word} is not a finite number")
        return {key: item for key, item in value.items() if item is not None}

    @model_validator(mode="after")
    def _partition_matches_pp(self) -> Profile:
        partition = self.parallel.partition
        if partition is not None and len(partition) != self.parallel.pp:
            raise ValueError(f"'parallel.partition': {len(partition)} stages but parallel.pp is "
                             f"{self.parallel.pp}; give one layer count per stage")
        if self.flavour == "cpu" and self.hardware.gpu_name is not None:
            raise ValueError("'hardware.gpu_name': a cpu profile matches no GPU; remove it")
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


def _leaves(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every scalar of nested mappings and lists, with the key path of the mapping entry that holds it."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(data, list):
        for item in data:
            yield from _leaves(item, path)
    else:
        yield path, data


# --- the one YAML loader ---------------------------------------------------------------------------------------

Lines = dict[tuple[Any, ...], tuple[str, int]]


def _check_events(text: str, file: str) -> None:
    """One streaming pass over the parser's events, before anything is built: nesting depth, the number of values
    once aliases are expanded (counted per anchor, so an alias bomb costs nothing to measure) and control
    characters. PyYAML's composer recurses per level and its constructor expands every alias, so both come after."""
    sizes: dict[str, int] = {}  # anchor -> values under it, expanded
    open_nodes: list[list[Any]] = []  # [anchor, values so far] per open mapping or list
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        line = event.start_mark.line + 1
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(open_nodes) >= MAX_DEPTH:
                raise UserError(f"{file}:{line}: nested more than {MAX_DEPTH} levels deep (profiles need four); "
                                "flatten it")
            open_nodes.append([event.anchor, 1])
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, count = open_nodes.pop()
        elif isinstance(event, yaml.ScalarEvent):
            bad = _CONTROL.search(event.value)
            if bad:
                raise UserError(f"{file}:{line}: a value holds the control character {bad.group()!r}; remove it")
            anchor, count = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            anchor, count = None, sizes.get(event.anchor, 1)
        else:
            continue
        if anchor is not None:
            sizes[anchor] = count
        if open_nodes:
            open_nodes[-1][1] += count
            if open_nodes[-1][1] > MAX_VALUES:
                raise UserError(f"{file}:{line}: more than {MAX_VALUES:,} values once YAML aliases are expanded; "
                                "write the values out, or share them with extends:")


def _walk(node: yaml.Node, path: tuple[Any, ...], file: str, lines: Lines) -> None:
    """Record where every key and item starts, and refuse duplicate keys (the safe loader keeps the last)."""
    lines[path] = (file, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise UserError(f"{file}:{key_node.start_mark.line + 1}: key {_dotted(path + (key,))} appears "
                                "twice; keep one")
            seen.add(key)
            _walk(value_node, path + (key,), file, lines)
            lines[path + (key,)] = (file, key_node.start_mark.line + 1)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, path + (index,), file, lines)


def read_yaml(path: Path) -> tuple[dict[str, Any], Lines]:
    """A YAML mapping (safe loader) and the file:line of every key path in it."""
    try:
        text = path.read_text()
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror}); check the path") from None
    loader = yaml.SafeLoader(text)
    try:
        _check_events(text, str(path))
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UserError(f"{where}: invalid YAML ({problem}); fix the syntax") from None
    except ValueError as error:  # a value the constructor cannot build: a 5,000-digit integer, a 13th month
        raise UserError(f"{path}: a value cannot be read ({str(error).split(';')[0]}); fix it") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise UserError(f"{path}:1: a profile is a mapping of keys, got {type(data).__name__}; see profiles/")
    lines: Lines = {}
    if node is not None:
        _walk(node, (), str(path), lines)
    return data, lines


# --- extends and merging ---------------------------------------------------------------------------------------


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _leaf_paths(data: dict[str, Any], path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = []
    for key, value in data.items():
        if isinstance(value, dict):
            paths.extend(_leaf_paths(value, path + (key,)))
        else:
            paths.append(path + (key,))
    return paths


def _merge_lines(base: Lines, over: Lines, over_data: dict[str, Any]) -> Lines:
    replaced = _leaf_paths(over_data)
    kept = {p: where for p, where in base.items() if not any(p[:len(r)] == r for r in replaced)}
    return {**kept, **over}


def resolve_path(name_or_path: str, beside: Path | None = None) -> Path:
    """A profile name (looked up beside `beside`, then in profiles/) or a path to a YAML file."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if candidate.is_file():
            return candidate
        raise UserError(f"profile file {name_or_path} not found; `python preflight.py profiles` lists profiles")
    for folder in filter(None, (beside, PROFILES_DIR)):
        path = folder / f"{name_or_path}.yaml"
        if path.is_file():
            return path
    names = list_profiles()
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UserError(f"no profile named {name_or_path!r}; {hint}`python preflight.py profiles` lists them")


def _load_merged(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], Lines, tuple[str, ...]]:
    if path.resolve() in chain:
        cycle = " -> ".join(p.stem for p in (*chain, path.resolve()))
        raise UserError(f"{path}: extends loops ({cycle}); break the cycle")
    data, lines = read_yaml(path)
    for key in _LOADER_KEYS:
        if key in data:
            raise UserError(f"{lines[(key,)][0]}:{lines[(key,)][1]}: key {key!r} is set by the loader "
                            f"(the name is the file name); remove it")
    parent = data.pop("extends", None)
    if parent is None:
        return data, lines, (str(path),)
    if not isinstance(parent, str):
        file, line = lines[("extends",)]
        raise UserError(f"{file}:{line}: extends must be one profile name; fix the value")
    base_path = resolve_path(parent, beside=path.parent)
    base, base_lines, files = _load_merged(base_path, (*chain, path.resolve()))
    return _merge(base, data), _merge_lines(base_lines, lines, data), (*files, str(path))


# --- validation errors that name file, line and key ------------------------------------------------------------


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _model_class(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for arg in typing.get_args(annotation):
            found = _model_class(arg)
            if found:
                return found
    return None


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The valid keys of the mapping at `loc`, for a close-match suggestion."""
    cls: type[BaseModel] | None = Profile
    for part in loc:
        field = cls.model_fields.get(part) if cls else None
        cls = _model_class(field.annotation) if field else None
    if cls is None:
        return []
    return [name for name in cls.model_fields if name not in _LOADER_KEYS]


def _explain(error: ValidationError, lines: Lines, files: tuple[str, ...]) -> str:
    first = error.errors()[0]
    loc = tuple(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    # Validators of mappings (env, vllm) name the bad key first, as 'KEY': ..., and the profile-wide ones a key
    # path, as 'a.b': ...; point at that key's line.
    named = _NAMED_KEY.match(message)
    if named:
        inner = (named.group(1),) if loc else tuple(named.group(1).split("."))
        if loc + inner in lines:
            loc, message = loc + inner, message[named.end():]
    where = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), (files[-1], 1))
    if first["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _fields_at(loc[:-1]), n=1)
        message = f"unknown key; did you mean {close[0]!r}?" if close else (
            f"unknown key; valid keys here: {', '.join(_fields_at(loc[:-1]))}")
    more = len(error.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{where[0]}:{where[1]}: {_dotted(loc)}: {message}{tail}"


# --- the one loading function ----------------------------------------------------------------------------------


def load_profile(name_or_path: str | Path) -> Profile:
    """A validated, merged, frozen profile from a name in profiles/ or a YAML path."""
    path = resolve_path(str(name_or_path))
    data, lines, files = _load_merged(path)
    data["name"] = path.stem
    data["source_files"] = files
    try:
        return Profile.model_validate(data)
    except ValidationError as error:
        raise UserError(f"{_explain(error, lines, files)}; fix the profile") from None


def list_profiles(folder: Path = PROFILES_DIR) -> list[str]:
    return sorted(path.stem for path in folder.glob("*.yaml"))


def model_dir(weights: Weights, build: bool = True, path: Sequence[str] | None = None) -> Path:
    """Where the weights are on this host. tiny:KIND is the locally built tiny model: built on first use, or with
    build=False only located (preflight reports a missing one instead of spending minutes building it), keyed by
    the libraries on `path` (the serving interpreter's sys.path; default this one's)."""
    if weights.path.startswith(TINY_PREFIX):
        from rigstack import tinymodel

        kind = weights.path.removeprefix(TINY_PREFIX)
        return tinymodel.build_tiny_model(kind) if build else tinymodel.tiny_model_dir(kind, path=path)
    return Path(weights.path)


def resolved_dict(profile: Profile) -> dict[str, Any]:
    """The merged profile as plain data (for `show --resolved`)."""
    return profile.model_dump(mode="json", exclude_none=True)
