"""Quality probe: items with a checkable answer, scored n of m.

Exact arithmetic, valid JSON (free and schema-guided), and seed 004's five agent-protocol cases: ordinary text,
required parallel tool calls, automatic tool choice, a reasoning-plus-tool-result history, and a nullable argument
that must come back as JSON null (the bug seed 004 fixed: null arriving as the string "null"). These test that the
server preserves the protocol, not how clever the model is.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigstack.client import Reply, Server
from rigstack.probes import measure
from rigstack.probes.cli import Show, Target, default_out, fail_if_unmeasured, publish, requests_failed
from rigstack.probes.results import Metric, Result, failure_notes, provenance
from rigstack.probes.streak import STOP_AFTER, Streak, stopped_note

Check = Callable[[Reply], str | None]  # None = pass, else why it failed


def _weather_tool(nullable_unit: bool = True) -> dict[str, Any]:
    unit = {"type": ["string", "null"], "enum": ["celsius", "fahrenheit", None],
            "description": "unit, or null for the local default"} if nullable_unit else {"type": "string"}
    return {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": unit},
                       "required": ["city", "unit"]}}}


TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS = [_weather_tool(), TIME_TOOL]


@dataclass(frozen=True)
class Item:
    name: str
    group: str
    payload: dict[str, Any]
    check: Check


def _answer(reply: Reply) -> str:
    return reply.text.strip()


def _strip_fences(text: str) -> str:
    match = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    return (match.group(1) if match else text).strip()


def _expect_number(expected: int) -> Check:
    def check(reply: Reply) -> str | None:
        numbers = re.findall(r"-?\d+", _answer(reply).replace(",", ""))
        if not numbers:
            return "no number in the answer"
        return None if int(numbers[-1]) == expected else f"answered {numbers[-1]}, expected {expected}"
    return check


def _expect_json(keys: dict[str, type]) -> Check:
    def check(reply: Reply) -> str | None:
        try:
            value = json.loads(_strip_fences(_answer(reply)))
        except ValueError as error:
            return f"not JSON ({error})"
        if not isinstance(value, dict):
            return f"JSON {type(value).__name__}, expected an object"
        for key, kind in keys.items():
            if not isinstance(value.get(key), kind) or isinstance(value.get(key), bool) != (kind is bool):
                return f"key {key!r} missing or not {kind.__name__}"
        return None
    return check


def _arguments(call: dict[str, Any]) -> dict[str, Any] | str:
    """A tool call's arguments as a dict, or why they are not one."""
    try:
        value = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        return f"arguments are not JSON: {call['function']['arguments'][:60]!r}"
    return value if isinstance(value, dict) else "arguments are not a JSON object"


def _check_plain(reply: Reply) -> str | None:
    if reply.tool_calls:
        return f"called {reply.tool_calls[0]['function']['name']} on a plain chat turn"
    if not _answer(reply):
        return "empty content"
    return None if reply.finish_reason == "stop" else f"finish_reason {reply.finish_reason}, expected stop"


def _check_parallel(reply: Reply) -> str | None:
    cities = set()
    for call in reply.tool_calls:
        if call["function"]["name"] != "get_weather":
            return f"called {call['function']['name']}, expected get_weather"
        args = _arguments(call)
        if isinstance(args, str):
            return args
        cities.add(str(args.get("city", "")).lower())
    missing = {"paris", "tokyo"} - cities
    return f"{len(reply.tool_calls)} calls, missing {sorted(missing)}" if missing else None


def _check_auto(reply: Reply) -> str | None:
    if not reply.tool_calls:
        return "no tool call"
    call = reply.tool_calls[0]
    args = _arguments(call)
    if isinstance(args, str):
        return args
    if call["function"]["name"] != "get_time" or "berlin" not in str(args.get("city", "")).lower():
        return f"called {call['function']['name']}({args}), expected get_time(city=Berlin)"
    return None if reply.finish_reason == "tool_calls" else f"finish_reason {reply.finish_reason}"


def _check_history(reply: Reply) -> str | None:
    if reply.tool_calls:
        return "called a tool again instead of answering from the tool result"
    return None if "21" in _answer(reply) else "answer does not use the tool result (21)"


def _check_null(reply: Reply) -> str | None:
    calls = [call for call in reply.tool_calls if call["function"]["name"] == "get_weather"]
    if not calls:
        return "no get_weather call"
    args = _arguments(calls[0])
    if isinstance(args, str):
        return args
    if "unit" not in args:
        return "argument unit missing"
    if args["unit"] == "null":
        return 'null came back as the string "null"'
    return None if args["unit"] is None else f"unit = {args['unit']!r}, expected null"


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **extra}


ARITHMETIC = ((4837, 29, "*"), (98765, 43210, "+"), (1000003, 999, "-"), (7744, 88, "/"))
ITEMS: tuple[Item, ...] = (
    *(Item(f"arith_{i}", "arithmetic", _chat(f"Compute {a} {op} {b}. Reply with the number only."),
           _expect_number({"*": a * b, "+": a + b, "-": a - b, "/": a // b}[op]))
      for i, (a, b, op) in enumerate(ARITHMETIC, start=1)),
    Item("json_free", "json", _chat('Reply with only a JSON object with keys "city" (a string) and "population" '
                                    '(an integer) for Paris.'), _expect_json({"city": str, "population": int})),
    Item("json_schema", "json", _chat("Describe Tokyo as JSON.", response_format={
        "type": "json_schema", "json_schema": {"name": "city", "schema": {
            "type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
            "required": ["city", "population"]}}}), _expect_json({"city": str, "population": int})),
    Item("plain_text", "agent", _chat("Say hello in one short sentence.", tools=TOOLS, tool_choice="auto"),
         _check_plain),
    Item("parallel_required", "agent", _chat("What is the weather in Paris and in Tokyo? Call get_weather once for "
                                             "each city.", tools=TOOLS, tool_choice="required",
                                             parallel_tool_calls=True), _check_parallel),
    Item("auto_choice", "agent", _chat("What time is it in Berlin right now?", tools=TOOLS, tool_choice="auto"),
         _check_auto),
    Item("reasoning_history", "agent", {"tools": TOOLS, "messages": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "The user wants Paris weather; call get_weather.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp_c": 21, "sky": "sunny"})},
    ]}, _check_history),
    Item("nullable_null", "agent", _chat("Get the weather in London. I have no unit preference, so pass unit as "
                                         "null.", tools=TOOLS, tool_choice="auto"), _check_null),
)


NOT_SENT = "not sent: the requests before it failed"


async def _ask_all(server: Server, items: tuple[Item, ...], max_tokens: int, stop_after: int) -> list[Reply]:
    """The items' replies in order; after `stop_after` failures in a row the rest are not sent (fewer replies)."""
    replies, streak = [], Streak(stop_after)
    async with server.session(connections=1) as session:
        for item in items:
            if streak.over:
                break
            replies.append(await server.request(session, "/v1/chat/completions",
                                                {"temperature": 0.0, "max_tokens": max_tokens, **item.payload}))
            streak.record(replies[-1].ok)
    return replies


def score(items: tuple[Item, ...], replies: list[Reply]) -> list[dict[str, Any]]:
    """One row per item; an item past the replies was not sent."""
    rows = []
    for index, item in enumerate(items):
        reply = replies[index] if index < len(replies) else Reply(sent=0.0, error=NOT_SENT)
        why = reply.error if not reply.ok else item.check(reply)
        rows.append({"item": item.name, "group": item.group, "answered": reply.ok, "pass": why is None,
                     "why": why or "",
                     "answer": (reply.text or reply.reasoning)[:120],
                     "tool_calls": json.dumps([call["function"] for call in reply.tool_calls])[:200]})
    return rows


def run_qual(server: Server, groups: list[str], max_tokens: int, profile: str | None,
             package: Path | None, stop_after: int = STOP_AFTER) -> Result:
    card = server.check_model()
    items = tuple(item for item in ITEMS if not groups or item.group in groups)
    measure.check_fits(server, card, max_tokens, [item.payload for item in items])
    replies = asyncio.run(_ask_all(server, items, max_tokens, stop_after))
    rows = score(items, replies)
    passed = sum(row["pass"] for row in rows)
    metrics = {"passed": Metric(value=passed, better="higher"), "items": Metric(value=len(rows), better="equal")}
    for group in sorted({item.group for item in items}):
        metrics[f"{group}.passed"] = Metric(value=sum(r["pass"] for r in rows if r["group"] == group),
                                            better="higher")
    params = {"temperature": 0.0, "max_tokens": max_tokens, "groups": groups or "all",
              "stop_after_failures": stop_after}
    notes = [f"{passed} of {len(rows)} items passed", *failure_notes(r.error for r in replies if not r.ok)]
    if len(replies) < len(items):
        notes.append(stopped_note("the quality items", stop_after, len(items) - len(replies), len(items)))
    return Result(kind="qual", provenance=provenance(server, profile, package, params), metrics=metrics, rows=rows,
                  notes=notes)


def main(target: Target, groups: list[str], max_tokens: int, out: Path | None, show: Show) -> int:
    out = default_out("qual", out)
    server = target.server()
    result = run_qual(server, groups, max_tokens, target.profile, target.package, target.stop_after)
    show(publish(result, out, server))
    failed = [row for row in result.rows if not row["answered"]]
    if failed and len(failed) < len(result.rows):  # each item is one measurement: an unanswered one measured nothing
        names = ", ".join(row["item"] for row in failed)
        raise requests_failed(f"{len(failed)} of the {len(result.rows)} quality items got no answer ({names})",
                              failed[0]["why"])
    return fail_if_unmeasured(["the quality items"] if failed else [], failed[0]["why"] if failed else None)
