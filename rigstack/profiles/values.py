"""What a profile value may be, checked at load: every string but the free text may reach an argv word of vllm or
docker, an environment value or a one-line report, so no value may read as an option, break a line, or be a number
no command line can carry; env names must be names, and vLLM flags the renderer writes are refused.

These checks are the profile schema's validators (rigstack.profiles.schema); each raises ValueError with the key
first, which the loader turns into file:line: key: message.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BeforeValidator

from rigstack.profileyaml import dotted

# Flags the renderer writes from other fields; a profile setting them directly would fight it.
RENDERED_FLAGS = {
    "model": "model.path", "served-model-name": "model.served_name", "port": "port", "host": "host",
    "tensor-parallel-size": "parallel.tp", "pipeline-parallel-size": "parallel.pp", "config": "(nothing)",
}
_FLAG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: "$" would let a trailing newline through
# Limits far beyond any rig, so that a hostile or mistyped file fails at once instead of exhausting the host.
MAX_INT = 2**53  # every larger integer stops being exact as a float, and no setting needs one
MAX_UNITS = 1024  # tp, pp and replicas each
# The profile's only free text; every other string may reach an argv word, an env value or a one-line report, and
# the YAML loader has already refused every other control character.
FREE_TEXT = {("description",)}
_BREAK = re.compile(r"[\n\t\r]")
_BREAKS = {"\n": "line break", "\t": "tab", "\r": "carriage return"}
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


def _from_list(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


_T = TypeVar("_T")
# YAML has lists, not tuples: strict mode takes a tuple only, so a list is the one thing turned into one.
Items = Annotated[tuple[_T, ...], BeforeValidator(_from_list)]


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


def usable_values(data: Any) -> Any:
    """Infinities, NaN and huge integers fail here, named, rather than as an OverflowError in some check; a line
    break or tab outside the free text fails too, as it would split a command-line word or an env value."""
    for path, value in _leaves(data):
        if isinstance(value, str) and path not in FREE_TEXT and (bad := _BREAK.search(value)):
            raise ValueError(f"'{dotted(path)}': the value holds a {_BREAKS[bad.group()]}; only "
                             f"{' and '.join(map(dotted, FREE_TEXT))} may (other values reach command lines, "
                             "environments and one-line reports): remove it")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"'{dotted(path)}': {value} is not a finite number")
        if isinstance(value, int) and abs(value) > MAX_INT:
            raise ValueError(f"'{dotted(path)}': a {len(str(abs(value)))}-digit number is out of range")
    return data


def env_strings(value: Any) -> Any:
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


def env_names(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        if not _ENV_NAME.fullmatch(key):
            raise ValueError(f"{key!r}: not an environment variable name")
        if key == "VLLM_PP_LAYER_PARTITION":
            raise ValueError(f"{key!r}: set parallel.partition instead")
    return value


# Flags that size the KV pool and the batch: the planner and preflight's kv-room compute with them, so each is a
# whole number of at least 1 here (vLLM also takes "32k" and, for max-model-len, -1 or "auto": a length it picks
# at boot, which nothing can check before it).
COUNT_FLAGS = ("max-model-len", "max-num-seqs", "max-num-batched-tokens", "block-size")


def plain_flags(value: dict[str, Any]) -> dict[str, Any]:
    for key, item in value.items():
        if not isinstance(key, str) or not _FLAG.fullmatch(key):
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
        if key in COUNT_FLAGS and item is not None and (isinstance(item, bool) or not isinstance(item, int)
                                                        or item < 1):
            raise ValueError(f"{key!r}: {item!r} is not a whole number of at least 1; write it out (32768, not "
                             "32k; rigstack plans and checks the KV room at a length it knows, so not auto or -1)")
    return {key: item for key, item in value.items() if item is not None}
