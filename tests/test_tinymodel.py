"""The tiny model: cached by content, bit-identical when rebuilt, the right shapes, and a chat template whose tool
calls the real glm47 parser of the installed vLLM reads back."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from rigstack import tinymodel
from rigstack.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "rain"},
]
CALL = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>" \
       "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"


def _digests(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def test_the_model_is_cached_by_content_and_found_without_building(tiny_model: Path) -> None:
    assert tinymodel.build_tiny_model("dense") == tiny_model == tinymodel.tiny_model_dir("dense")
    assert tiny_model.parent.name == "models" and tiny_model.name.startswith("dense-")
    assert tinymodel.tiny_model_dir("dense", seed=1) != tiny_model
    assert not [p for p in tiny_model.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
    # Finding the folder must stay cheap (preflight has 2 s): no torch import.
    probe = subprocess.run([sys.executable, "-c", "import sys; from rigstack.tinymodel import tiny_model_dir; "
                            "print(tiny_model_dir('moe')); print('torch' in sys.modules)"],
                           cwd=ROOT, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == [str(tinymodel.tiny_model_dir("moe")), "False"]


def test_a_rebuild_in_another_cache_is_bit_identical(tiny_model: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGSTACK_CACHE", str(tmp_path))
    rebuilt = tinymodel.build_tiny_model("dense")
    assert rebuilt.is_relative_to(tmp_path) and rebuilt.name == tiny_model.name
    assert _digests(rebuilt) == _digests(tiny_model)


def test_shapes_fit_the_profiles_and_the_tests(tiny_model: Path, tiny_moe_model: Path, tokenizer: Any) -> None:
    dense = json.loads((tiny_model / "config.json").read_text())
    moe = json.loads((tiny_moe_model / "config.json").read_text())
    assert dense["architectures"] == ["Qwen3ForCausalLM"] and moe["architectures"] == ["Qwen3MoeForCausalLM"]
    for config in (dense, moe):
        assert config["num_hidden_layers"] == 4  # PP=2 splits 2+2 (or 3+1)
        assert config["head_dim"] == 64 and config["hidden_size"] == 256
        assert config["vocab_size"] == len(tokenizer) == 4106
    from transformers import AutoConfig

    loaded = AutoConfig.from_pretrained(tiny_moe_model)  # what vLLM reads: num_experts through transformers
    assert (loaded.num_experts, loaded.num_experts_per_tok) == (8, 2)
    generation = json.loads((tiny_model / "generation_config.json").read_text())
    assert generation["eos_token_id"][0] == tokenizer.convert_tokens_to_ids(tinymodel.EOS)


def test_tags_are_single_tokens_that_survive_decoding(tokenizer: Any) -> None:
    for tag in (*tinymodel.TOOL_TOKENS, *tinymodel.TURN_TOKENS):
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1, tag
    ids = tokenizer.encode(CALL, add_special_tokens=False)
    # The tool tags are not "special": the server's detokeniser (skip_special_tokens) keeps them for the parser.
    assert tokenizer.decode(ids, skip_special_tokens=True) == CALL
    text = "The model serves 4 experts per layer, über-fast."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_the_chat_template_renders_every_role_and_the_tools(tokenizer: Any) -> None:
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("[gMASK]<sop><|system|>\n# Tools")
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text
    assert "<|system|>\nAnswer briefly.<|user|>\nWeather in Paris?<|assistant|>\n" + CALL in text
    assert text.endswith("<|observation|>\n<tool_response>rain</tool_response><|assistant|>")
    plain = tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True,
                                          enable_thinking=False)
    assert "# Tools" not in plain and plain.endswith("<|assistant|><think></think>")


def test_the_glm47_parser_reads_the_templates_tool_call(tokenizer: Any) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    request = ChatCompletionRequest(model="tiny", messages=CONVERSATION[:2], tools=TOOLS)
    parser = ToolParserManager.get_tool_parser("glm47")(tokenizer, request.tools)
    extracted = parser.extract_tool_calls(CALL, request)
    assert extracted.tools_called
    (call,) = extracted.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] == "Paris"


def test_unknown_kinds_are_refused_with_the_choices() -> None:
    with pytest.raises(UserError, match="unknown tiny model kind 'huge'; use one of: dense, moe"):
        tinymodel.build_tiny_model("huge")


def test_the_cli_prints_the_folder(tiny_moe_model: Path) -> None:
    ok = subprocess.run([sys.executable, "scripts/make_tiny_model.py", "--kind", "moe"], cwd=ROOT,
                        capture_output=True, text=True, env=os.environ)
    assert ok.returncode == 0 and ok.stdout.strip() == str(tiny_moe_model)
    bad = subprocess.run([sys.executable, "scripts/make_tiny_model.py", "--kind", "huge"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown tiny model kind" in bad.stderr


def test_the_folder_is_keyed_by_the_serving_interpreters_libraries(tiny_model: Path, tmp_path: Path) -> None:
    """The tool's own venv has none of the build libraries: the folder is found from the serving interpreter's
    path, and an environment without them gets a one-line reason, never PackageNotFoundError."""
    assert tinymodel.tiny_model_dir("dense", path=sys.path) == tiny_model
    with pytest.raises(UserError, match=r"the tiny model is built by transformers, tokenizers, torch .* and the "
                                        r"serving interpreter has no transformers, tokenizers, torch; run it with"):
        tinymodel.tiny_model_dir("dense", path=[str(tmp_path)])
    for name in ("transformers", "tokenizers"):  # their metadata only: an environment without torch
        site = Path(metadata.distribution(name).locate_file(""))
        info = next(site.glob(f"{name}-*.dist-info"))
        (tmp_path / info.name).symlink_to(info)
    with pytest.raises(UserError, match="has no torch;"):
        tinymodel.tiny_model_dir("dense", path=[str(tmp_path)])
