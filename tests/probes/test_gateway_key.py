"""Issue 39 item 4: a fleet's gateway with `gateway.api_key_env` (LiteLLM with a master key) answers nothing without
the key, so the launcher's readiness probes must send it; before, they sent none and every keyed fleet was stopped
after 600 s. A real LiteLLM proxy in the gateway venv, over the fake OpenAI-shaped server as its one model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rigstack import gateway
from rigstack.client import Server
from rigstack.endpoint import Endpoint
from rigstack.serving.process import end
from rigstack.serving.ready import launch
from testing.net import free_port

KEY = "sk-rigstack-test-key"


@pytest.mark.server
def test_a_keyed_gateway_is_probed_with_its_key(tmp_path: Path, fake_server) -> None:
    litellm = gateway.gateway_venv() / "bin" / "litellm"
    if not litellm.is_file():
        pytest.skip(f"no gateway venv at {litellm.parent.parent} (`make gateway`)")
    upstream = fake_server("--ok", "1000")
    config = tmp_path / "litellm.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "fake", "litellm_params": {"model": "openai/fake", "api_base": f"{upstream}/v1",
                                                                 "api_key": gateway.NO_KEY}}],
        "general_settings": {"master_key": "os.environ/GATEWAY_TEST_KEY"}}))
    url = f"http://127.0.0.1:{free_port()}"
    argv = [str(litellm), "--config", str(config), "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1]]
    launched = launch(argv, {**gateway.ENV, "GATEWAY_TEST_KEY": KEY}, tmp_path / "run", url=url, served_name="fake",
                      timeout_s=600, api_key=KEY)
    try:
        assert set(launched.stage_s) == {"process alive", "/health 200", "/v1/models lists the model",
                                         "one-token completion"}
        assert Server(Endpoint(url, "fake", KEY), timeout_s=30).health(30)
        assert not Server(Endpoint(url, "fake"), timeout_s=30).health(30), "the gateway answered without its key"
    finally:
        end(launched.record, grace_s=10)
