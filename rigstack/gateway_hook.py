"""Runs inside LiteLLM's proxy (its own venv, rigstack.gateway), not in rigstack: a request for a model the fleet
does not serve gets the OpenAI-style 404 that vLLM itself answers, naming every served model, where LiteLLM would
answer 400 "Invalid model name" naming none. LiteLLM loads it from beside its config (litellm_settings.callbacks).
"""

from __future__ import annotations

from typing import Any

from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy._types import ProxyException


class UnknownModel(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any],
                                  call_type: str) -> dict[str, Any]:
        from litellm.proxy.proxy_server import llm_router  # set once the proxy has read its config

        names = llm_router.get_model_names() if llm_router is not None else []
        model = data.get("model")
        if model not in names:
            raise ProxyException(message=f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}.",
                                 type="NotFoundError", param="model", code=404)
        return data


hook = UnknownModel()
