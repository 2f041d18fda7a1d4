"""The quality checkers on answers a good and a broken server would give (seed 004's cases)."""

from __future__ import annotations

import json

import pytest

from rigstack.client import Reply
from rigstack.probes.qual import ITEMS, score


def _call(name: str, **args: object) -> dict:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


GOOD = {
    "arith_1": Reply(0, ok=True, text="140,273"),
    "arith_2": Reply(0, ok=True, text="The sum is 141975."),
    "arith_3": Reply(0, ok=True, text="999004"),
    "arith_4": Reply(0, ok=True, text="88"),
    "json_free": Reply(0, ok=True, text='```json\n{"city": "Paris", "population": 2100000}\n```'),
    "json_schema": Reply(0, ok=True, text='{"city": "Tokyo", "population": 14000000}'),
    "plain_text": Reply(0, ok=True, text="Hello!", finish_reason="stop"),
    "parallel_required": Reply(0, ok=True, tool_calls=[_call("get_weather", city="Paris", unit=None),
                                                       _call("get_weather", city="Tokyo", unit="celsius")]),
    "auto_choice": Reply(0, ok=True, tool_calls=[_call("get_time", city="Berlin")], finish_reason="tool_calls"),
    "reasoning_history": Reply(0, ok=True, text="It is 21 °C and sunny in Paris.", finish_reason="stop"),
    "nullable_null": Reply(0, ok=True, tool_calls=[_call("get_weather", city="London", unit=None)]),
}
BAD = {
    "arith_1": (Reply(0, ok=True, text="140272"), "answered 140272, expected 140273"),
    "json_free": (Reply(0, ok=True, text="{'city': 'Paris'}"), "not JSON"),
    "json_schema": (Reply(0, ok=True, text='{"city": "Tokyo", "population": "14M"}'),
                    "key 'population' missing or not int"),
    "plain_text": (Reply(0, ok=True, tool_calls=[_call("get_time", city="x")]), "called get_time on a plain"),
    "parallel_required": (Reply(0, ok=True, tool_calls=[_call("get_weather", city="Paris", unit=None)]),
                          "1 calls, missing ['tokyo']"),
    "auto_choice": (Reply(0, ok=True, text="I cannot tell the time."), "no tool call"),
    "reasoning_history": (Reply(0, ok=False, error="HTTP 400: bad history"), "HTTP 400: bad history"),
    "nullable_null": (Reply(0, ok=True, tool_calls=[_call("get_weather", city="London", unit="null")]),
                      'null came back as the string "null"'),
}


def test_every_item_passes_a_good_answer() -> None:
    rows = score(ITEMS, [GOOD[item.name] for item in ITEMS])
    assert [row["why"] for row in rows if not row["pass"]] == []
    assert {item.group for item in ITEMS} == {"arithmetic", "json", "agent"}
    assert sum(item.group == "agent" for item in ITEMS) == 5


@pytest.mark.parametrize("name", sorted(BAD))
def test_broken_answers_fail_with_the_reason(name: str) -> None:
    item = next(item for item in ITEMS if item.name == name)
    reply, why = BAD[name]
    row = score((item,), [reply])[0]
    assert not row["pass"] and row["why"].startswith(why)
