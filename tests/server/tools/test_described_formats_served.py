"""Described formats end to end: a server on a tiny random Qwen2 model with
`--tool-call-parser` set to an XML format (Qwen3-Coder's) and to a numbered block format (Kimi
K2's). The model is random, so its calls are what the strict tag lets it write: they must come
back as valid `tool_calls`, whole and streamed (jump-forward hands the stream many tokens at
once: the forced openings and closings)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.support.tool_schemas import SCHEMAS, TIME, USER, WEATHER
from tests.support.tool_servers import template_server


@pytest.fixture(scope="module", params=["qwen3_coder", "kimi_k2"])
def client(request):
    srv = template_server("hermes", "--tool-call-parser", request.param)
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def _ask(client, **kw):
    model = client.models.list().data[0].id
    body = {"messages": USER, "tools": [WEATHER, TIME], "max_tokens": 160, "seed": 0}
    return client.chat.completions.create(model=model, **{**body, **kw})


def _valid(name: str, arguments: str) -> None:
    args = json.loads(arguments)
    jsonschema.validate(args, SCHEMAS[name])
    assert set(args) <= set(SCHEMAS[name]["properties"])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_come_back_valid(client, parallel):
    out = _ask(client, tool_choice="required", parallel_tool_calls=parallel)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for c in choice.message.tool_calls:
        _valid(c.function.name, c.function.arguments)
    if not parallel:
        assert len(choice.message.tool_calls) == 1


def test_named_call_streamed_is_the_same_call(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    whole = _ask(client, tool_choice=choice).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    for chunk in _ask(client, tool_choice=choice, stream=True):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(d.index, {"name": d.function.name, "arguments": ""})
            entry["arguments"] += d.function.arguments or ""
    assert [c["name"] for c in calls.values()] == ["get_weather"] == [whole[0].function.name]
    _valid("get_weather", calls[0]["arguments"])
    assert json.loads(calls[0]["arguments"]) == json.loads(whole[0].function.arguments)
