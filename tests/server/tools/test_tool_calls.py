"""Tool calls, strict JSON-Schema generation and `response_format` through the `openai` client
against a real server (tiny random model: the checks are on shapes and on constrained output,
which must parse and validate whatever the model's text)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.server_process import SMALL_ENGINE, ServerProcess, tiny_model_dir
from tests.support.tool_schemas import SCHEMAS, TIME, USER, WEATHER

# LangChain-style schemas: no additionalProperties


class City(BaseModel):
    name: str = Field(max_length=10)
    population: int = Field(ge=0, le=10**8)


def _check_calls(calls, names=None):
    assert calls, "no tool calls"
    assert len({c.id for c in calls}) == len(calls)
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in (names or SCHEMAS)
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        assert set(args) <= set(SCHEMAS[c.function.name]["properties"])  # strict: no extras


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_calls_validate_and_parallel_false_makes_one(client, model, parallel, seed):
    out = client.chat.completions.create(
        model=model,
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=parallel,
        max_tokens=120,
        seed=seed,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    _check_calls(choice.message.tool_calls)
    if not parallel:
        assert len(choice.message.tool_calls) == 1


def test_named_choice_calls_that_function(client, model):
    out = client.chat.completions.create(
        model=model,
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
    )
    calls = out.choices[0].message.tool_calls
    _check_calls(calls, names={"get_weather"})


@pytest.mark.parametrize("seed", [0, 1])
def test_auto_is_valid_calls_or_text(client, model, seed):
    out = client.chat.completions.create(
        model=model, messages=USER, tools=[WEATHER, TIME], max_tokens=40, seed=seed
    )
    message = out.choices[0].message
    if message.tool_calls:
        assert out.choices[0].finish_reason == "tool_calls"
        _check_calls(message.tool_calls)
    else:
        assert not message.content.startswith(("{", "["))


def test_none_gives_text(client, model):
    out = client.chat.completions.create(
        model=model, messages=USER, tools=[WEATHER], tool_choice="none", max_tokens=5
    )
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content


@pytest.mark.parametrize("seed", [0, 3])
def test_streamed_calls_as_openai_streams_them(client, model, seed):
    stream = client.chat.completions.create(
        model=model,
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=120,
        seed=seed,
        stream=True,
    )
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in stream:
        if not chunk.choices:
            continue
        reasons.append(chunk.choices[0].finish_reason)
        for d in chunk.choices[0].delta.tool_calls or []:
            if d.index not in calls:  # the first delta of a call: id, type, name
                assert d.id and d.type == "function" and d.function.name
                assert d.function.arguments == ""
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:  # later ones: pieces of the arguments only
                assert d.id is None and d.function.name is None
                calls[d.index]["arguments"] += d.function.arguments
    assert reasons[-1] == "tool_calls" and calls
    assert sorted(calls) == list(range(len(calls)))
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_tool_round_trip_history_renders(client, model):
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "get_time"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    ]
    out = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER, TIME], max_tokens=4
    )
    assert out.usage.prompt_tokens > 40 and out.choices[0].message is not None


@pytest.mark.parametrize("strict", [True, False, None])
def test_response_format_json_schema_strict_or_not_validates(client, model, strict):
    schema = City.model_json_schema()
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    if strict is not None:
        fmt["json_schema"]["strict"] = strict
    out = client.chat.completions.create(
        model=model, messages=USER, max_tokens=60, temperature=0, response_format=fmt
    )
    City.model_validate_json(out.choices[0].message.content)
    assert set(json.loads(out.choices[0].message.content)) <= {"name", "population"}


def test_json_object_parses(client, model):
    out = client.chat.completions.create(
        model=model,
        messages=USER,
        max_tokens=100,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_openai_parse_returns_the_pydantic_object(client, model):
    for parse in (client.beta.chat.completions.parse, client.chat.completions.parse):
        out = parse(model=model, messages=USER, max_tokens=60, response_format=City)
        assert isinstance(out.choices[0].message.parsed, City)


def test_openai_parse_with_a_strict_function_tool(client, model):
    tool = openai.pydantic_function_tool(City, name="record_city")
    out = client.chat.completions.parse(
        model=model,
        messages=USER,
        max_tokens=60,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "record_city"}},
    )
    (call,) = out.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, City)


# ---- bad input: 400 naming the field --------------------------------------------------------
def _post(server, **body):
    body = {"messages": USER, "max_tokens": 4, **body}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)


NO_NAME = {"type": "function", "function": {"parameters": {"type": "object"}}}
BAD_NAME = {"type": "function", "function": {"name": "has space"}}
STRING_PARAMS = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
UNSUPPORTED = {  # a remote $ref: never fetched
    "type": "function",
    "function": {"name": "f", "parameters": {"$ref": "https://example.com/s.json"}},
}


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": [NO_NAME]}, "tools.0.function.name"),
        ({"tools": [WEATHER, BAD_NAME]}, "tools.1.function.name"),
        ({"tools": [STRING_PARAMS]}, "tools.0.function.parameters"),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [UNSUPPORTED], "tool_choice": "required"}, "tools.0.function.parameters"),
        ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
        ),
        (
            {"messages": [*USER, {"role": "tool", "content": "4 degrees"}]},
            "messages.1.tool_call_id",
        ),
        (
            {"messages": [*USER, {"role": "tool", "tool_call_id": "nope", "content": "4"}]},
            "messages.1.tool_call_id",
        ),
    ],
)
def test_malformed_tools_and_tool_messages_are_400_naming_the_field(server, body, param):
    r = _post(server, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["message"]


OPEN = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a"],
}
OPEN_FMT = {"type": "json_schema", "json_schema": {"name": "a", "schema": OPEN}}


def _answers(server, **kw) -> list[str]:
    out = []
    for seed in range(4):
        r = _post(server, response_format=OPEN_FMT, max_tokens=60, seed=seed, **kw)
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["message"]["content"])
    return out


def _only_declared(answers: list[str]) -> bool:
    return all(set(json.loads(a)) == {"a"} for a in answers)


def _wandered(answers: list[str]) -> bool:
    return any(a.startswith('{"a":') and ',"' in a for a in answers)  # a second key began


def test_json_schema_mode_per_request(server):
    assert _only_declared(_answers(server))  # strict: the declared property only
    assert _wandered(_answers(server, json_schema_mode="exact"))  # a random model wanders
    bad = _post(server, response_format=OPEN_FMT, json_schema_mode="lenient")
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "json_schema_mode"


def test_server_flag_turns_exact_semantics_on():
    srv = ServerProcess(tiny_model_dir(), *SMALL_ENGINE, "--json-schema-mode", "exact")
    try:
        assert _wandered(_answers(srv))
        assert _only_declared(_answers(srv, json_schema_mode="strict"))
        native = httpx.post(
            f"{srv.url}/generate",
            json={
                "text": "x",
                "sampling_params": {"json_schema": json.dumps(OPEN), "max_new_tokens": 120},
            },
            timeout=60,
        )
        assert native.status_code == 200
    finally:
        srv.stop()


def test_completions_take_the_mode_too(server):
    for mode in ("strict", "exact"):
        body = {"prompt": "x", "max_tokens": 60, "json_schema": OPEN, "json_schema_mode": mode}
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        if mode == "strict":
            assert set(json.loads(r.json()["choices"][0]["text"])) == {"a"}
