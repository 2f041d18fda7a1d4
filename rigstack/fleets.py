"""Fleets: several profiles on one host behind one public port (seed 004's mixed server), one YAML per fleet in
fleets/. The schema and the loader; rigstack/fleetlaunch.py starts one, rigstack/gateway.py renders its gateway.

A fleet file names no `name:` (the file stem is the name):

    description: ...
    port: 8080                  # the public port: the gateway, routed by the request's model
    host: 0.0.0.0
    gateway: {num_retries: 1}   # optional (rigstack.gateway)
    members:                    # the profiles this host runs, each its own pool behind its own vllm-router
      - profile: rtxpro6000-tp2-replicas
        replicas: 2             # default: the profile's parallel.replicas
        gpu_sets: [[4, 5], [6, 7]]   # default: the profile's
        port: 8010              # the pool's first engine port (default: the profile's port:)
        router_port: 8091       # the pool's router (default: the profile's router.port; required without router:)
        metrics_port: 29001     # the pool router's Prometheus port (default: the profile's router.metrics_port)

API:
    load_fleet(name_or_path) -> Fleet: validated; fleet.pools are the members' profiles with the fleet's replicas,
        GPU sets and ports laid over. Errors name file and line: overlapping GPU sets across members, one model
        name from two members (a different checkpoint, or two pools for one name), ports that collide, a member
        that is itself a fleet or spans hosts.
    list_fleets() -> list[str]
    pool_gpus(profile) -> list[int]: every GPU a pool's replicas own (none on a cpu profile).
    engine_urls(fleet, model) -> tuple[str, ...]: the engines that serve a model name (the probes read their counters).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rigstack.errors import UserError
from rigstack.profiles import MAX_UNITS, Lines, Profile, Word, load_profile, read_yaml, resolve_path
from rigstack.profiles.values import Items, usable_values
from rigstack.render import replica_gpus
from rigstack.replicas import public_ports
from rigstack.serving.unit import probe_url
from rigstack.versions import REPO_ROOT

FLEETS_DIR = REPO_ROOT / "fleets"
_LOADER_KEYS = ("name", "source_file", "pools")
_FIX = "name a fleet's YAML file (fleets/ holds the shipped ones)"
Port = Annotated[int, Field(ge=1, le=65535)]


class _Frozen(BaseModel):
    # strict, as profiles are: `port: true` is not port 1, and "8080" or 8080.0 is not 8080.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)


class Member(_Frozen):
    """One profile of the fleet, as this host runs it."""

    profile: str  # a profile name (profiles/) or a YAML path
    replicas: int | None = Field(None, ge=1, le=MAX_UNITS)
    gpu_sets: Items[Items[Annotated[int, Field(ge=0)]]] | None = None
    port: Port | None = None  # the first engine's port; replica i listens on port + i
    router_port: Port | None = None
    metrics_port: Port | None = None


class Gateway(_Frozen):
    """LiteLLM's proxy on the public port (rigstack.gateway)."""

    num_retries: int = Field(1, ge=0, le=10)  # a request whose pool answered an error is sent once more
    timeout_s: int = Field(1800, ge=1, le=7 * 24 * 3600)  # per request, the whole answer
    api_key_env: Word | None = None  # clients must send this variable's value as the bearer key; unset: no key


class Fleet(_Frozen):
    name: str
    description: str
    seed: str | None = None
    host: Word = "0.0.0.0"
    port: Port
    gateway: Gateway = Gateway()
    members: Items[Member] = Field(min_length=1)
    source_file: str = ""
    pools: tuple[Profile, ...] = ()  # set by the loader: members[i] as it runs

    @property
    def served_names(self) -> list[str]:
        return [pool.model.served_name for pool in self.pools]


def list_fleets(folder: Path = FLEETS_DIR) -> list[str]:
    return sorted(path.stem for path in folder.glob("*.yaml"))


def resolve_fleet(name_or_path: str) -> Path:
    """A fleet name (fleets/NAME.yaml) or a path to a YAML file."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if candidate.is_file():
            return candidate
        raise UserError(f"fleet file {name_or_path} not found; fleets/ holds the shipped fleets")
    path = FLEETS_DIR / f"{name_or_path}.yaml"
    if path.is_file():
        return path
    close = difflib.get_close_matches(name_or_path, list_fleets(), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UserError(f"no fleet named {name_or_path!r}; {hint}fleets/ holds them ({', '.join(list_fleets())})")


def pool_gpus(profile: Profile) -> list[int]:
    if profile.flavour == "cpu":
        return []
    return [gpu for replica in range(profile.parallel.replicas) for gpu in replica_gpus(profile, replica)]


def engine_urls(fleet: Fleet, model: str) -> tuple[str, ...]:
    for pool in fleet.pools:
        if pool.model.served_name == model:
            return tuple(probe_url(pool.host, pool.port + replica) for replica in range(pool.parallel.replicas))
    raise UserError(f"fleet {fleet.name} serves {', '.join(fleet.served_names)}, not {model!r}; pass --model with "
                    "one of those")


class _Where:
    """file:line of a fleet file's keys, for one-line errors."""

    def __init__(self, lines: Lines, file: str) -> None:
        self.lines, self.file = lines, file

    def __call__(self, *key: Any) -> str:
        found = next((self.lines[key[:n]] for n in range(len(key), 0, -1) if key[:n] in self.lines), (self.file, 1))
        return f"{found[0]}:{found[1]}: {'.'.join(map(str, key))}"

    def error(self, key: tuple[Any, ...], message: str) -> UserError:
        return UserError(f"{self(*key)}: {message}")


def _schema_error(error: ValidationError, where: _Where) -> UserError:
    first = error.errors()[0]
    loc = tuple(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        cls = Member if loc[:1] == ("members",) else Gateway if loc[:1] == ("gateway",) else Fleet
        keys = [name for name in cls.model_fields if name not in _LOADER_KEYS]
        close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
        message = f"unknown key; did you mean {close[0]!r}?" if close else f"unknown key; valid keys: {', '.join(keys)}"
    return where.error(loc, f"{message}; fix the fleet")


def _is_fleet(name: str) -> bool:
    """A member naming a fleet: a fleets/ name that is no profile, or a YAML file with members:."""
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") or "/" in name:
        return candidate.is_file() and "members" in read_yaml(candidate, "fleet", _FIX)[0]
    return (FLEETS_DIR / f"{name}.yaml").is_file() and not (REPO_ROOT / "profiles" / f"{name}.yaml").is_file()


def _base_profile(member: Member, index: int, beside: Path, where: _Where) -> Profile:
    key = ("members", index, "profile")
    if _is_fleet(member.profile):
        raise where.error(key, f"{member.profile} is a fleet, not a profile; fleets do not nest: list its members "
                               "here")
    name = member.profile
    local = beside / f"{name}.yaml"
    if "/" not in name and not name.endswith((".yaml", ".yml")) and local.is_file():
        name = str(local)  # a profile beside the fleet file comes first, as extends: finds one
    try:
        profile = load_profile(resolve_path(name))
    except UserError as error:
        raise where.error(key, str(error)) from None
    if profile.hosts:
        raise where.error(key, f"profile {profile.name} spans hosts (hosts:); a fleet runs on one host")
    return profile


def _pool(member: Member, base: Profile, index: int, where: _Where) -> Profile:
    """The member's profile with the fleet's replicas, GPU sets and ports, validated again as a whole."""
    data = base.model_dump()
    parallel = dict(data["parallel"])
    if member.replicas is not None:
        parallel["replicas"] = member.replicas
    if member.gpu_sets is not None:
        parallel["gpu_sets"] = member.gpu_sets
    router = dict(data["router"] or {})
    for field, value in (("port", member.router_port), ("metrics_port", member.metrics_port)):
        if value is not None:
            router[field] = value
    if "port" not in router:
        raise where.error(("members", index), f"profile {base.name} has no router:, and each member runs behind "
                                              "its own vllm-router; give router_port")
    hardware = dict(data["hardware"])
    if hardware["host_ram_gib"] is not None:  # a profile gives the RAM of its own replicas; the fleet may run more
        hardware["host_ram_gib"] *= parallel["replicas"] / base.parallel.replicas
    data.update(parallel=parallel, router=router, hardware=hardware,
                port=member.port if member.port is not None else base.port)
    try:
        return Profile.model_validate(data)
    except ValidationError as error:
        message = error.errors()[0]["msg"].removeprefix("Value error, ")
        field = next((key for prefix, key in _PROFILE_KEYS.items() if message.startswith(prefix)), None)
        key = ("members", index, field) if field else ("members", index)
        raise where.error(key, f"{message} (profile {base.name} with the fleet's settings); fix the fleet") from None


# A profile validator's message names the profile key; the fleet's line is that of the member key that set it.
_PROFILE_KEYS = {"'port'": "port", "'gpu_sets'": "gpu_sets", "'router.port'": "router_port",
                 "'router.metrics_port'": "metrics_port"}


def _check_gpus(pools: list[Profile], where: _Where) -> None:
    owner: dict[int, int] = {}
    for index, pool in enumerate(pools):
        for gpu in pool_gpus(pool):
            if gpu in owner:
                raise where.error(("members", index, "gpu_sets"), f"GPU {gpu} is also in members.{owner[gpu]}'s sets "
                                  f"({pools[owner[gpu]].name}); give each member its own GPUs")
            owner[gpu] = index


def _check_names(pools: list[Profile], where: _Where) -> None:
    """One model name is one pool: two checkpoints under one name would answer differently by chance, and two pools
    of one checkpoint would split its prefix cache (raise the member's replicas instead)."""
    seen: dict[str, int] = {}
    for index, pool in enumerate(pools):
        name = pool.model.served_name
        if name in seen:
            other = pools[seen[name]].model
            if (other.path, other.revision) != (pool.model.path, pool.model.revision):
                problem = (f"serves {name!r} from {pool.model.path}, members.{seen[name]} from {other.path}; one "
                           "name must mean one checkpoint: change one model.served_name")
            else:
                problem = (f"serves {name!r} as members.{seen[name]} does; one model name is one pool: raise that "
                           "member's replicas instead")
            raise where.error(("members", index, "profile"), problem)
        seen[name] = index


def _check_ports(fleet: Fleet, pools: list[Profile], where: _Where) -> None:
    owner: dict[int, str] = {fleet.port: "the gateway (port)"}
    for index, pool in enumerate(pools):
        ports = public_ports(pool)
        labels = [f"members.{index} replica {i}" for i in range(pool.parallel.replicas)] + \
            [f"members.{index} router", f"members.{index} router metrics"]
        for port, label in zip(ports, labels):
            if port in owner:
                key = "port" if "replica" in label else "metrics_port" if "metrics" in label else "router_port"
                raise where.error(("members", index, key), f"port {port} of {label} is also {owner[port]}'s; give "
                                  "every engine, router and the gateway its own port")
            owner[port] = label


def load_fleet(name_or_path: str | Path) -> Fleet:
    """A validated fleet, its members resolved to the profiles they run."""
    path = resolve_fleet(str(name_or_path))
    data, lines = read_yaml(path, "fleet", _FIX)
    where = _Where(lines, str(path))
    for key in _LOADER_KEYS:
        if key in data:
            raise where.error((key,), "set by the loader (the name is the file name); remove it")
    data.update(name=path.stem, source_file=str(path))
    try:
        fleet = Fleet.model_validate(usable_values(data))
    except ValidationError as error:
        raise _schema_error(error, where) from None
    except ValueError as error:  # usable_values: a non-finite or huge number, a line break in a value
        raise UserError(f"{where.file}: {error}; fix the fleet") from None
    pools = [_pool(member, _base_profile(member, index, path.parent, where), index, where)
             for index, member in enumerate(fleet.members)]
    _check_gpus(pools, where)
    _check_names(pools, where)
    _check_ports(fleet, pools, where)
    return fleet.model_copy(update={"pools": tuple(pools)})
