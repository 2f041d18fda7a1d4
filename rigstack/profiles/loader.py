"""The one loading function: a profile name or path, its `extends:` chain deep-merged (mappings key by key, lists
and scalars replaced, `null` removing a vLLM flag or env var the base sets), validated into the schema
(rigstack.profiles.schema), with errors that name file, line and key and suggest the closest valid key.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rigstack.errors import UserError
from rigstack.invocation import command
from rigstack.profiles.schema import TINY_PREFIX, Profile, Weights
from rigstack.profileyaml import Lines, dotted, read_yaml
from rigstack.versions import REPO_ROOT

PROFILES_DIR = REPO_ROOT / "profiles"
DEFAULT_PROFILE = "cpu-tiny"
_LOADER_KEYS = ("name", "source_files")
_NAMED_KEY = re.compile(r"^'([^']+)': ")  # set by the loader, never by a file


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def leaves(data: dict[str, Any], path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
    """Every value of nested mappings that is not itself a mapping, by its key path."""
    found: dict[tuple[Any, ...], Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            found.update(leaves(value, path + (key,)))
        else:
            found[path + (key,)] = value
    return found


def _merge_lines(base: Lines, over: Lines, over_data: dict[str, Any]) -> Lines:
    replaced = list(leaves(over_data))
    kept = {p: where for p, where in base.items() if not any(p[:len(r)] == r for r in replaced)}
    return {**kept, **over}


def resolve_path(name_or_path: str, beside: Path | None = None) -> Path:
    """A profile name (looked up beside `beside`, then in profiles/) or a path to a YAML file. What exists by that
    name is returned whatever it is (read_yaml says why a directory or a device is no profile), so a name is never
    reported missing when it is there."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if os.path.lexists(candidate):
            return candidate
        raise UserError(f"profile file {name_or_path} not found; `{command('preflight profiles')}` lists profiles")
    for folder in filter(None, (beside, PROFILES_DIR)):
        path = folder / f"{name_or_path}.yaml"
        if os.path.lexists(path):
            return path
    names = list_profiles()
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UserError(f"no profile named {name_or_path!r}; {hint}`python preflight.py profiles` lists them")


def _extended(parent: str, path: Path, where: tuple[str, int]) -> Path:
    """The profile `extends:` names: a name, or a path relative to the profile's own folder; either must lie (after
    symlinks) in that folder or in profiles/, so a profile cannot make the loader read other files."""
    folder = path.parent
    is_path = parent.endswith((".yaml", ".yml")) or "/" in parent
    target = folder / parent if is_path else resolve_path(parent, beside=folder)
    real = Path(os.path.realpath(target))  # realpath, not resolve(): a symlink loop is read_yaml's to name
    if not any(real.is_relative_to(os.path.realpath(allowed)) for allowed in (folder, PROFILES_DIR)):
        raise UserError(f"{where[0]}:{where[1]}: extends: {parent} is outside {folder} and {PROFILES_DIR}; extends "
                        "names a profile in profiles/ or a file under the profile's own folder")
    return resolve_path(str(target)) if is_path else target


def _load_merged(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], Lines, tuple[str, ...]]:
    real = Path(os.path.realpath(path))  # resolve() raises on a symlink loop, which read_yaml names
    if real in chain:
        cycle = " -> ".join(p.stem for p in (*chain, real))
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
    base_path = _extended(parent, path, lines[("extends",)])
    base, base_lines, files = _load_merged(base_path, (*chain, real))
    return merge(base, data), _merge_lines(base_lines, lines, data), (*files, str(path))


# --- validation errors that name file, line and key ------------------------------------------------------------


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


# Strict typing's refusals, said with what was written instead (YAML reads `true`, `yes` and `1e3` as no number).
_TYPE_ERRORS = {"int_type", "float_type", "string_type", "list_type", "tuple_type", "dict_type"}
_TYPE_NAMES = {bool: "boolean", str: "text"}


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
    elif first["type"] in _TYPE_ERRORS and isinstance(first["input"], (bool, str)):
        message += f", not the {_TYPE_NAMES[type(first['input'])]} {json.dumps(first['input'])}"
    more = len(error.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{where[0]}:{where[1]}: {dotted(loc)}: {message}{tail}"


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
