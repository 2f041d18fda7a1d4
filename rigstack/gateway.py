"""The fleet's gateway: LiteLLM's proxy on the public port, one model group per member whose one deployment is that
member's vllm-router pool. LiteLLM routes by the request's model and lists every served name at /v1/models (the
OpenAI list); each pool's router keeps its policy (cache_aware) and its health checks. README, "One endpoint for a
mixed server", has the measured comparison with vllm-router's own IGW mode that chose this.

LiteLLM runs from its own venv: its proxy extra pins rich<14 (the tool pins rich 15) and, in vLLM's venv, would
downgrade openai 3.57 -> 2.54 and huggingface_hub 2.4 -> 1.33 under vLLM. `make apply` builds it
(requirements-gateway.txt); RIGSTACK_GATEWAY_VENV names another.

API:
    gateway_venv() -> Path; installed_version(venv) -> str | None: the litellm version that venv holds.
    litellm_config(fleet) -> dict: the proxy's config (yaml.safe_dump it).
    gateway_unit(fleet, run_dir) -> Unit: the proxy process, in run_dir/gateway.
    write_files(fleet, run_dir) -> None: its config and the unknown-model hook (rigstack/gateway_hook.py) there.
    setup_command(fleet, run_dir) -> str: the same as a shell command, for the dry run.
"""

from __future__ import annotations

import os
import shlex
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from rigstack.atomic import write_atomic
from rigstack.fleets import Fleet
from rigstack.serving.unit import Unit, probe_url
from rigstack.versions import REPO_ROOT

LITELLM_VERSION = "1.106.12"  # 1.110's proxy extra needs litellm-proxy, which the registry does not serve
GATEWAY_DIR = "gateway"
CONFIG_NAME = "litellm.yaml"
HOOK_SOURCE = Path(__file__).with_name("gateway_hook.py")
HOOK_MODULE = "rigstack_gateway_hook"  # LiteLLM imports callbacks from files beside its config
# No download of the model price list at start (no hub is reachable on the rigs' side networks either), no admin UI.
ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "DISABLE_ADMIN_UI": "True"}
NO_KEY = "none"  # what LiteLLM sends the pools as a bearer key; the engines take no key


def gateway_venv() -> Path:
    explicit = os.environ.get("RIGSTACK_GATEWAY_VENV")
    return Path(explicit) if explicit else REPO_ROOT / ".venv-gateway"


def installed_version(venv: Path) -> str | None:
    """The litellm distribution in that venv, read from its metadata (nothing is run)."""
    sites = [str(path) for path in venv.glob("lib/python*/site-packages")]
    return next((dist.version for dist in metadata.distributions(name="litellm", path=sites)), None)


def pool_url(pool: Any) -> str:
    assert pool.router is not None  # every member has one (rigstack.fleets)
    return probe_url(pool.host, pool.router.port)


def litellm_config(fleet: Fleet) -> dict[str, Any]:
    timeout = fleet.gateway.timeout_s
    models = [{"model_name": pool.model.served_name,
               # openai/: LiteLLM's hosted_vllm/ provider refuses token-id prompts, which cache_aware matches on
               "litellm_params": {"model": f"openai/{pool.model.served_name}", "api_base": f"{pool_url(pool)}/v1",
                                  "api_key": NO_KEY, "timeout": timeout}}
              for pool in fleet.pools]
    key = fleet.gateway.api_key_env
    general: dict[str, Any] = {"master_key": f"os.environ/{key}"} if key else \
        {"dangerously_permit_weak_or_unset_master_key": True}  # as the single-profile router: no key
    return {"model_list": models,
            "litellm_settings": {"callbacks": f"{HOOK_MODULE}.hook", "request_timeout": timeout},
            "router_settings": {"num_retries": fleet.gateway.num_retries, "timeout": timeout},
            "general_settings": general}


def gateway_unit(fleet: Fleet, run_dir: Path) -> Unit:
    folder = run_dir / GATEWAY_DIR
    argv = [str(gateway_venv() / "bin" / "litellm"), "--config", str(folder / CONFIG_NAME),
            "--host", fleet.host, "--port", str(fleet.port)]
    return Unit(folder, argv, dict(ENV), probe_url(fleet.host, fleet.port))


def _config_text(fleet: Fleet) -> str:
    return yaml.safe_dump(litellm_config(fleet), sort_keys=False)


def write_files(fleet: Fleet, run_dir: Path) -> None:
    folder = run_dir / GATEWAY_DIR
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HOOK_SOURCE, folder / f"{HOOK_MODULE}.py")
    write_atomic(folder / CONFIG_NAME, _config_text(fleet))


def setup_command(fleet: Fleet, run_dir: Path) -> str:
    """write_files as one shell command: the folder, the hook, the config as a here-document."""
    folder = run_dir / GATEWAY_DIR
    hook = shlex.quote(str(folder / f"{HOOK_MODULE}.py"))
    return (f"mkdir -p {shlex.quote(str(folder))} && cp {shlex.quote(str(HOOK_SOURCE))} {hook} && "
            f"cat > {shlex.quote(str(folder / CONFIG_NAME))} <<'EOF'\n{_config_text(fleet)}EOF")
