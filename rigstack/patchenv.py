"""The environment variables a patch's code reads, found in its added lines (so preflight knows every variable the
stack reads, not only the ones its Switch: header names).

A read is `os.environ.get(X`, `os.environ[X`, `os.getenv(X` or `X in os.environ`, where X is a string literal, a
module constant assigned one (`ENV_CACHE = "VLLM_EXPERT_OFFLOAD_CACHE"`), or the parameter of a helper that reads
it (`def _env_int(name, ...)` reading `os.environ.get(name` makes `_env_int(ENV_CACHE` a read too).
"""

from __future__ import annotations

import re

_NAME = r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+"
_CONSTANT = re.compile(rf"^\s*([A-Z][A-Z0-9_]*)\s*=\s*[\"']({_NAME})[\"']\s*$")
_ARG = r"([\"'][^\"']*[\"']|\w+)"
_READS = (re.compile(rf"\bos\.(?:environ\.get|getenv)\(\s*{_ARG}"), re.compile(rf"\bos\.environ\[\s*{_ARG}"),
          re.compile(rf"{_ARG}\s+(?:not\s+)?in\s+os\.environ\b"))
_DEF = re.compile(r"^\s*def\s+(\w+)\(")


def added_python(diff: str) -> list[str]:
    """The added lines of the diff's Python files, without their '+' mark."""
    lines, python = [], False
    for line in diff.splitlines():
        if line.startswith("+++ "):
            python = line.rstrip().endswith(".py")
        elif python and line.startswith("+"):
            lines.append(line[1:])
    return lines


def reader_helpers(diff: str) -> frozenset[str]:
    """The functions the diff adds that read the env var their parameter names (`def _env_int(name, ...)`)."""
    return _scan(added_python(diff), {})[1]


def env_reads(diff: str, helpers: frozenset[str] = frozenset()) -> frozenset[str]:
    """Every env var name the diff's added Python code reads (see the module docstring for what counts); `helpers`
    are reader functions another patch of the stack adds (0019 calls 0014's `_env_int`)."""
    lines = added_python(diff)
    constants = {m.group(1): m.group(2) for line in lines if (m := _CONSTANT.match(line))}
    found, readers = _scan(lines, constants)
    for reader in readers | helpers:
        call = re.compile(rf"\b{reader}\(\s*{_ARG}")
        found |= {name for line in lines for arg in call.findall(line)
                  if (name := _resolve(arg, constants)) is not None}
    return frozenset(found)


def _scan(lines: list[str], constants: dict[str, str]) -> tuple[set[str], frozenset[str]]:
    """The names read directly, and the functions whose parameter is what they read."""
    found: set[str] = set()
    readers: set[str] = set()
    function = None
    for line in lines:
        if defined := _DEF.match(line):
            function = defined.group(1)
        for pattern in _READS:
            for arg in pattern.findall(line):
                if (name := _resolve(arg, constants)) is not None:
                    found.add(name)
                elif arg.islower() and function:  # a parameter: the function is a reader helper
                    readers.add(function)
    return found, frozenset(readers)


def _resolve(arg: str, constants: dict[str, str]) -> str | None:
    literal = arg.strip("\"'")
    if arg[0] in "\"'":
        return literal if re.fullmatch(_NAME, literal) else None
    return constants.get(arg)
