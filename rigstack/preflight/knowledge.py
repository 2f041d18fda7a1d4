"""What the pinned vLLM knows: its serve flags (its real argument parser, built without booting), its env var
names, and whether the patched modules import. One subprocess of the package's own interpreter learns all three
(10-20 s, most of it importing vLLM); the answer is cached under the rigstack cache, keyed by the package's files
(path, size, mtime of every .py: a 50 ms walk, where hashing the contents would cost 0.25 s on every run)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rigstack.atomic import write_atomic
from rigstack.cache import cache_dir
from rigstack.errors import UserError

SCRIPT_VERSION = 5  # bump when the script or its output changes: cached answers are then relearned
TIMEOUT_S = 180  # importing vLLM on a busy 2-core box takes 15-60 s

# Runs inside the package's interpreter: stdlib only, and vLLM.
_SCRIPT = r"""
import importlib, json, sys
out = {"flags": {}, "env": [], "imports": {}, "missing": {}, "version": None, "error": None, "lacks": None}
try:
    import vllm
except ModuleNotFoundError as error:
    # vLLM's own top level needs a module this interpreter lacks: it is not the one that serves the package.
    if error.name and error.name.split(".")[0] != "vllm":
        out["lacks"] = error.name
        out["error"] = (type(error).__name__ + ": " + str(error)).splitlines()[0][:300]
        sys.stdout.write("\n@@RIGSTACK@@" + json.dumps(out))
        sys.exit(0)
except BaseException:
    pass  # reported below, module by module
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
        out["imports"][name] = None
    except BaseException as error:  # an import can fail in any way, SystemExit included
        out["imports"][name] = (type(error).__name__ + ": " + str(error)).splitlines()[0][:300]
        if isinstance(error, ModuleNotFoundError) and error.name:
            out["missing"][name] = error.name
try:
    import vllm, vllm.envs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    out["version"] = getattr(vllm, "__version__", None)
    out["env"] = sorted(vllm.envs.environment_variables)
    for action in make_arg_parser(FlexibleArgumentParser())._actions:
        for option in action.option_strings:
            if option.startswith("--"):
                out["flags"][option[2:]] = {"takes_value": action.nargs != 0, "nargs": action.nargs or None,
                                            "choices": [str(c) for c in action.choices] if action.choices else None}
    # Since 0.34.0 the parser takes any --kv-cache-dtype (plugins may register more); CacheConfig refuses one
    # missing from KV_CACHE_DTYPES at boot, so that list is its choices.
    try:
        from vllm.config.cache import KV_CACHE_DTYPES
        flag = out["flags"].get("kv-cache-dtype")
        if flag and not flag["choices"]:
            flag["choices"] = [str(c) for c in KV_CACHE_DTYPES]
    except ImportError:
        pass
except BaseException as error:
    out["error"] = (type(error).__name__ + ": " + str(error)).splitlines()[0][:300]
sys.stdout.write("\n@@RIGSTACK@@" + json.dumps(out))
"""
_MARK = "@@RIGSTACK@@"


@dataclass(frozen=True)
class Flag:
    takes_value: bool
    choices: tuple[str, ...] | None = None
    nargs: int | str | None = None  # argparse's for a flag with a value: None (one), "?", "*", "+" or a count


@dataclass(frozen=True)
class Knowledge:
    flags: dict[str, Flag] = field(default_factory=dict)
    env: frozenset[str] = frozenset()
    imports: dict[str, str | None] = field(default_factory=dict)  # module -> None, or the error line
    missing: dict[str, str] = field(default_factory=dict)  # module -> the module it needs that is not installed
    version: str | None = None
    error: str | None = None  # why vLLM's flags could not be read
    cached: bool = False
    lacks: str | None = None  # the module the interpreter lacks to import vllm at all (not the serving one)
    python: str = ""  # the interpreter that was asked

    @property
    def broken(self) -> dict[str, str]:
        return {name: error for name, error in self.imports.items() if error}


def find_package() -> Path | None:
    """The vllm package this interpreter would import (found, not imported: importing takes seconds)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _venv_python(package: Path) -> Path | None:
    """The python of the venv (or image) whose site-packages holds the package."""
    site = package.parent
    if site.name in ("site-packages", "dist-packages"):
        root = site.parent.parent.parent
        for name in ("python", "python3"):
            if (root / "bin" / name).exists():
                return root / "bin" / name
    return None


def _named(python: str) -> Path:
    """--python as given: a path, or a command name looked up on PATH like a shell would."""
    return Path(python if os.sep in python else shutil.which(python) or python).absolute()


def interpreter(package: Path, python: str | None = None) -> tuple[str, dict[str, str]]:
    """The Python that serves the package: `python` when given, else the one that owns it (a venv's or the image's),
    else this one; with the package's folder put first on its path unless that python owns the package."""
    owner = _venv_python(package)
    chosen = _named(python) if python else owner or Path(sys.executable)
    if chosen == owner:
        return str(chosen), {}
    site = str(package.parent)
    return str(chosen), {"PYTHONPATH": os.pathsep.join(filter(None, (site, os.environ.get("PYTHONPATH"))))}


def search_path(package: Path | None, python: str | None = None) -> list[str] | None:
    """The module search path of the interpreter that serves the package (where its libraries are); None for this
    interpreter's own. Another interpreter is asked (about 20 ms: it imports nothing)."""
    if package is None and python is None:
        return None
    chosen, env = interpreter(package, python) if package else (str(_named(python)), {})
    first = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if chosen == sys.executable:
        return [*first, *sys.path] if first else None
    try:
        done = subprocess.run([chosen, "-c", "import json, sys; print(json.dumps(sys.path))"], capture_output=True,
                              text=True, timeout=60, env={**os.environ, **env}, check=True)
        return json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        raise UserError(f"cannot run the interpreter {chosen} ({error}); pass --python PATH of a working one") from None


def quick_fingerprint(package: Path) -> str:
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(package):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py") or name.endswith(".json"):
                stat = os.stat(os.path.join(folder, name))
                digest.update(f"{os.path.relpath(folder, package)}/{name}:{stat.st_size}:{stat.st_mtime_ns}\n"
                              .encode())
    return digest.hexdigest()


def module_names(touched_files: list[str]) -> list[str]:
    """Package-relative .py paths -> importable module names ("parser/glm47_moe.py" -> "vllm.parser.glm47_moe")."""
    names = []
    for path in touched_files:
        if path.endswith(".py"):
            parts = ["vllm", *path[:-3].split("/")]
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return sorted(set(names))


def _cache_file(package: Path, python: str, modules: list[str]) -> Path:
    key = hashlib.sha256(json.dumps([SCRIPT_VERSION, str(package.resolve()), python, modules,
                                     quick_fingerprint(package)]).encode()).hexdigest()[:24]
    return cache_dir() / "preflight" / f"vllm-{key}.json"


def _parse(data: dict, cached: bool, python: str) -> Knowledge:
    flags = {name: Flag(info["takes_value"], tuple(info["choices"]) if info["choices"] else None, info["nargs"])
             for name, info in data["flags"].items()}
    return Knowledge(flags, frozenset(data["env"]), data["imports"], data["missing"], data["version"], data["error"],
                     cached, data["lacks"], python)


def load(package: Path | None, modules: list[str] | None = None, python: str | None = None) -> Knowledge:
    """What the vllm package knows, learned by the interpreter that serves it (`python`, else its owner)."""
    if package is None:
        return Knowledge(error="no vllm package found; pass --package PATH")
    modules = sorted(modules or [])
    python, extra_env = interpreter(package, python)
    cache = _cache_file(package, python, modules)
    if cache.is_file():
        try:
            return _parse(json.loads(cache.read_text()), cached=True, python=python)
        except (ValueError, KeyError):
            pass  # a damaged cache entry is rebuilt below
    env = {**os.environ, **extra_env, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run([python, "-c", _SCRIPT, json.dumps(modules)], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env, cwd=cache_dir() if cache_dir().is_dir() else None)
    except subprocess.TimeoutExpired:
        return Knowledge(error=f"{python} took over {TIMEOUT_S} s to import vllm", python=python)
    except OSError as error:
        return Knowledge(error=f"cannot run {python} ({error.strerror})", python=python)
    if _MARK not in done.stdout:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return Knowledge(error=f"{python} exited {done.returncode}: {tail}", python=python)
    data = json.loads(done.stdout.rsplit(_MARK, 1)[1])
    knowledge = _parse(data, cached=False, python=python)
    if knowledge.error is None and set(knowledge.broken) <= set(knowledge.missing):
        # Only a clean answer is kept (bar dependencies absent from this environment, which a rerun will not
        # conjure up): any other failure may come from the environment and is retried next run.
        write_atomic(cache, json.dumps(data))
    return knowledge
