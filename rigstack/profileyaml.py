"""The one YAML loader of profiles: safe, bounded, JSON-shaped values only, with the file:line of every key.

A profile is read as bytes with a size bound before anything parses it (PyYAML spends seconds per megabyte even on
comments), must be UTF-8, and may hold only what the schema can mean: text, numbers, true/false, null, lists and
mappings. YAML's other types (`!!binary`, `!!set`, `!!omap`, `!!timestamp`, a local `!tag`) are refused by line,
and an unquoted date stays the text it was written as (YAML 1.2's core schema has no timestamps), so no value
reaches a command line as a Python repr.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from rigstack.errors import UserError
from rigstack.files import read_utf8
from rigstack.invocation import command

# Limits far beyond any rig, so that a hostile or mistyped file fails at once instead of exhausting the host.
MAX_BYTES = 256 * 1024  # the largest shipped profile is about 4 KiB
MAX_DEPTH = 32  # nesting of mappings and lists
MAX_VALUES = 10_000  # values after YAML aliases are expanded (an alias bomb is small on disk, huge in memory)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # tab and newline are checked per key by the schema
_CORE = "tag:yaml.org,2002:"
# The tags a profile value may carry; "!" is YAML's non-specific tag (a quoted scalar read as text).
_TAGS = {"!", *(f"{_CORE}{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq"))}
_FIX = f"name a profile's YAML file (`{command('preflight profiles')}` lists them)"

Lines = dict[tuple[Any, ...], tuple[str, int]]


class _Loader(yaml.SafeLoader):
    """The safe loader without implicit timestamps: `revision: 2026-01-02` is that text, not a date."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != f"{_CORE}timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _refuse_tag(event: yaml.NodeEvent, file: str, line: int) -> None:
    tag = getattr(event, "tag", None)
    if tag is not None and tag not in _TAGS:
        shown = "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag
        raise UserError(f"{file}:{line}: a {shown} value; a profile holds text, numbers, true/false, lists and "
                        "mappings only: write it as one of those")


def _check_events(text: str, file: str) -> None:
    """One streaming pass over the parser's events, before anything is built: nesting depth, the number of values
    once aliases are expanded (counted per anchor, so an alias bomb costs nothing to measure), tags and control
    characters. PyYAML's composer recurses per level and its constructor expands every alias, so both come after."""
    sizes: dict[str, int] = {}  # anchor -> values under it, expanded
    open_nodes: list[list[Any]] = []  # [anchor, values so far] per open mapping or list
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        line = event.start_mark.line + 1
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            _refuse_tag(event, file, line)
            if len(open_nodes) >= MAX_DEPTH:
                raise UserError(f"{file}:{line}: nested more than {MAX_DEPTH} levels deep (profiles need four); "
                                "flatten it")
            open_nodes.append([event.anchor, 1])
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, count = open_nodes.pop()
        elif isinstance(event, yaml.ScalarEvent):
            _refuse_tag(event, file, line)
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
                raise UserError(f"{file}:{key_node.start_mark.line + 1}: key {dotted(path + (key,))} appears "
                                "twice; keep one")
            seen.add(key)
            _walk(value_node, path + (key,), file, lines)
            lines[path + (key,)] = (file, key_node.start_mark.line + 1)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, path + (index,), file, lines)


def read_yaml(path: Path, what: str = "profile", fix: str = _FIX) -> tuple[dict[str, Any], Lines]:
    """A YAML mapping and the file:line of every key path in it; `what` and `fix` name the file's kind in the
    errors of reading it (a fleet file reads the same way)."""
    text = read_utf8(path, what, MAX_BYTES, fix)
    loader = _Loader(text)
    try:
        _check_events(text, str(path))
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UserError(f"{where}: invalid YAML ({problem}); fix the syntax") from None
    except ValueError as error:  # a value the constructor cannot build: a 5,000-digit integer
        raise UserError(f"{path}: a value cannot be read ({str(error).split(';')[0]}); fix it") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise UserError(f"{path}:1: a {what} is a mapping of keys, got {type(data).__name__}; {fix}")
    lines: Lines = {}
    if node is not None:
        _walk(node, (), str(path), lines)
    return data, lines
