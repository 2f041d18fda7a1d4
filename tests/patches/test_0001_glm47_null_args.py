"""Patch 0001: the glm47 tool parser keeps a JSON null argument null, streaming and not, whatever the schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# GLM-4.7 / GLM-5.3 output as the model writes it: name, then key/value tag pairs, a newline between them.
CALL = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>unit</arg_key>\n<arg_value>null</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>null</arg_value>\n"
        "<arg_key>note</arg_key>\n<arg_value>null</arg_value>\n</tool_call>")
EXPECTED = {"city": "Paris", "unit": None, "days": None, "note": None}


def _tools(unit: dict[str, Any]) -> list[dict[str, Any]]:
    properties = {"city": {"type": "string"}, "unit": unit, "days": {"type": "integer"}}  # "note": no schema
    return [{"type": "function",
             "function": {"name": "get_weather", "parameters": {"type": "object", "properties": properties}}}]


# Schemas for the `unit` argument: upstream's schema coercion rescued only the ones that list null.
SCHEMAS = {
    "string": {"type": "string"},
    "enum": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "nullable": {"type": ["string", "null"]},
    "anyof": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _request(tools: list[dict[str, Any]] | None) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=tools)


def _tool_parser(name: str, tokenizer: Any, request: Any) -> Any:
    """The parser `--tool-call-parser NAME` gives the server."""
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.get_tool_parser(name)(tokenizer, request.tools)


def _stream(parser: Any, request: Any, pieces: list[tuple[str, list[int]]]) -> str:
    """Feed the output piece by piece as the server does; return the concatenated argument deltas."""
    arguments = ""
    previous_text, previous_ids = "", []
    for text, ids in pieces:
        current_text, current_ids = previous_text + text, previous_ids + ids
        delta = parser.extract_tool_calls_streaming(previous_text, current_text, text, previous_ids, current_ids,
                                                    ids, request)
        arguments += _arguments(delta)
        previous_text, previous_ids = current_text, current_ids
    return arguments + _arguments(parser.finish_streaming())


def _arguments(delta: Any) -> str:
    if delta is None or not delta.tool_calls:
        return ""
    return "".join(call.function.arguments or "" for call in delta.tool_calls if call.function)


def _by_token(tokenizer: Any, text: str) -> list[tuple[str, list[int]]]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    pieces, shown = [], ""
    for end in range(1, len(ids) + 1):
        now = tokenizer.decode(ids[:end])
        pieces.append((now[len(shown):], [ids[end - 1]]))
        shown = now
    return pieces


@pytest.mark.parametrize("parser_name", ["glm47", "glm45"])
@pytest.mark.parametrize("schema", sorted(SCHEMAS))
def test_non_streaming_null_stays_null(tokenizer: Any, parser_name: str, schema: str) -> None:
    request = _request(_tools(SCHEMAS[schema]))
    result = _tool_parser(parser_name, tokenizer, request).extract_tool_calls(CALL, request)
    assert result.tools_called
    assert [call.function.name for call in result.tool_calls] == ["get_weather"]
    assert json.loads(result.tool_calls[0].function.arguments) == EXPECTED


def test_non_streaming_null_without_tools(tokenizer: Any) -> None:
    request = _request(None)
    result = _tool_parser("glm47", tokenizer, request).extract_tool_calls(CALL, request)
    assert json.loads(result.tool_calls[0].function.arguments) == EXPECTED


@pytest.mark.parametrize("schema", sorted(SCHEMAS))
def test_streaming_by_token_null_stays_null(tokenizer: Any, schema: str) -> None:
    request = _request(_tools(SCHEMAS[schema]))
    streamed = _stream(_tool_parser("glm47", tokenizer, request), request, _by_token(tokenizer, CALL))
    assert json.loads(streamed) == EXPECTED


def test_streaming_by_character_null_stays_null(tokenizer: Any) -> None:
    # One character a step is the worst case for holding back a value that may still become null.
    request = _request(_tools(SCHEMAS["string"]))
    pieces = [(char, []) for char in CALL]
    streamed = _stream(_tool_parser("glm47", tokenizer, request), request, pieces)
    assert json.loads(streamed) == EXPECTED


def test_full_output_with_reasoning_null_stays_null(tokenizer: Any) -> None:
    # The combined reasoning + tool parser (both flags set) parses the whole output, <think> included.
    from vllm.parser.glm47_moe import Glm47MoeParser

    request = _request(_tools(SCHEMAS["string"]))
    output = "<think>The user wants the weather.</think>" + CALL
    result = Glm47MoeParser(tokenizer, request.tools).extract_tool_calls(output, request)
    assert json.loads(result.tool_calls[0].function.arguments) == EXPECTED


@pytest.mark.upstream_guard
@pytest.mark.parametrize("value", ["nullable", "null island", "Null", "none", ""])
def test_words_near_null_stay_strings(tokenizer: Any, value: str) -> None:
    # Only the bare word is null; streaming must not hold back or lose a value that merely starts like it.
    call = f"<tool_call>get_weather\n<arg_key>unit</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call>"
    request = _request(_tools(SCHEMAS["string"]))
    whole = _tool_parser("glm47", tokenizer, request).extract_tool_calls(call, request)
    assert json.loads(whole.tool_calls[0].function.arguments) == {"unit": value}
    streamed = _stream(_tool_parser("glm47", tokenizer, request), request, [(char, []) for char in call])
    assert json.loads(streamed) == {"unit": value}
