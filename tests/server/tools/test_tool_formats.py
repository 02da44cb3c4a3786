"""Tools through the model's own chat template and tool-call format, and reasoning apart,
through the `openai` client against real servers: a tiny random Qwen2 model served with a
Hermes-style template (the parser chosen from it) and with a `<think>`-opening one
(`--reasoning-parser deepseek-r1`). The model is random: the checks are on the prompt, on
shapes and on constrained output, which must parse and validate whatever the model writes."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.support.tool_schemas import SCHEMAS, TIME, USER, WEATHER
from tests.support.tool_servers import template_server, tokenizer_with

HISTORY = [
    {"role": "system", "content": "Be brief."},
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"},
]
ANSWER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["city", "n"],
}
ANSWER_FMT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>")


@pytest.fixture(scope="module")
def hermes():
    return template_server("hermes")  # no --tool-call-parser: hermes chosen from the template


@pytest.fixture(scope="module")
def client(hermes):
    return openai.OpenAI(base_url=f"{hermes.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def thinking():
    srv = template_server("think", "--reasoning-parser", "deepseek-r1")
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def _model(client) -> str:
    return client.models.list().data[0].id


def _check_calls(calls, names=None):
    assert calls, "no tool calls"
    assert len({c.id for c in calls}) == len(calls)
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in (names or SCHEMAS)
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        assert set(args) <= set(SCHEMAS[c.function.name]["properties"])


def _template_tokens(messages, tools) -> int:
    tok = tokenizer_with("hermes")
    messages = json.loads(json.dumps(messages))
    for m in messages:  # the template serialises the arguments itself: it is given objects
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    text = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return len(tok(text).input_ids)


@pytest.mark.parametrize("messages", [USER, HISTORY], ids=["question", "tool-history"])
def test_prompt_is_the_templates_own_rendering_with_the_tools(client, messages):
    out = client.chat.completions.create(
        model=_model(client), messages=messages, tools=[WEATHER, TIME], max_tokens=2
    )
    assert out.usage.prompt_tokens == _template_tokens(messages, [WEATHER, TIME])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_forced_calls_parse_and_validate_streamed_or_not(client, choice, stream):
    names = None if choice == "required" else {"get_time"}
    for seed in (0, 1):
        kw = dict(model=_model(client), messages=USER, tools=[WEATHER, TIME], tool_choice=choice,
                  max_tokens=60, seed=seed)  # fmt: skip
        if not stream:
            out = client.chat.completions.create(**kw)
            assert out.choices[0].finish_reason == "tool_calls"
            calls = out.choices[0].message.tool_calls
        else:
            calls, reasons = _streamed_calls(client.chat.completions.create(**kw, stream=True))
            assert reasons[-1] == "tool_calls"
        _check_calls(calls, names)
        if names:
            assert len(calls) == 1


class _Call:
    def __init__(self, id_: str, name: str):
        self.id, self.type = id_, "function"
        self.function = type("F", (), {"name": name, "arguments": ""})()


def _streamed_calls(stream):
    calls: dict[int, _Call] = {}
    reasons = []
    for chunk in stream:
        if not chunk.choices:
            continue
        reasons.append(chunk.choices[0].finish_reason)
        for d in chunk.choices[0].delta.tool_calls or []:
            if d.index not in calls:  # the name once, with the id
                assert d.id and d.function.name and d.function.arguments == ""
                calls[d.index] = _Call(d.id, d.function.name)
            else:  # then pieces of the arguments only
                assert d.id is None and d.function.name is None
                calls[d.index].function.arguments += d.function.arguments
        assert not any(t in (chunk.choices[0].delta.content or "") for t in TAGS)
    assert sorted(calls) == list(range(len(calls)))
    return [calls[i] for i in sorted(calls)], reasons


def test_auto_leaves_no_raw_tag_in_content_and_calls_validate(client):
    for seed in range(3):
        out = client.chat.completions.create(
            model=_model(client), messages=USER, tools=[WEATHER, TIME], max_tokens=40, seed=seed
        )
        message = out.choices[0].message
        assert not any(t in (message.content or "") for t in TAGS)
        if message.tool_calls:
            assert out.choices[0].finish_reason == "tool_calls"
            _check_calls(message.tool_calls)


def test_parallel_tool_calls_false_makes_at_most_one(client):
    for seed in range(2):
        out = client.chat.completions.create(
            model=_model(client), messages=USER, tools=[WEATHER, TIME], tool_choice="required",
            parallel_tool_calls=False, max_tokens=80, seed=seed,
        )  # fmt: skip
        assert len(out.choices[0].message.tool_calls) == 1


def test_parse_function_call_endpoint(hermes):
    text = 'Checking. <tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    r = httpx.post(
        f"{hermes.url}/parse_function_call",
        json={"text": text, "tools": [WEATHER, TIME], "tool_call_parser": "qwen25"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "normal_text": "Checking.",
        "calls": [{"tool_index": 1, "name": "get_time", "parameters": '{"zone": "UTC"}'}],
    }
    bad = httpx.post(
        f"{hermes.url}/parse_function_call", json={"text": text, "tool_call_parser": "nope"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_call_parser"


# ---- reasoning ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "budget", [{"max_reasoning_tokens": 6}, {"thinking_token_budget": 3}, {}]
)  # no budget: the reasoning may use half of max_tokens, then the format
def test_reasoning_apart_and_the_format_applies_after_it(thinking, budget):
    for seed in (0, 1):
        out = thinking.chat.completions.create(
            model=_model(thinking), messages=USER, response_format=ANSWER_FMT, max_tokens=80,
            seed=seed, extra_body=budget,
        )  # fmt: skip
        message = out.choices[0].message
        assert message.reasoning_content  # the budget forced its end
        assert "</think>" not in message.reasoning_content + message.content
        jsonschema.validate(json.loads(message.content), ANSWER)


def test_reasoning_streams_as_reasoning_content_deltas(thinking):
    stream = thinking.chat.completions.create(
        model=_model(thinking), messages=USER, response_format=ANSWER_FMT, max_tokens=80,
        seed=2, stream=True, extra_body={"max_reasoning_tokens": 5},
    )  # fmt: skip
    reasoning, content, order = "", "", []
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        piece = getattr(delta, "reasoning_content", None)
        if piece:
            reasoning += piece
            order.append("r")
        if delta.content:
            content += delta.content
            order.append("c")
    assert reasoning and order == sorted(order, reverse=True)  # all reasoning, then content
    jsonschema.validate(json.loads(content), ANSWER)


def test_enable_thinking_false_and_separate_reasoning_false(thinking):
    off = thinking.chat.completions.create(
        model=_model(thinking), messages=USER, response_format=ANSWER_FMT, max_tokens=80,
        seed=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    assert not getattr(off.choices[0].message, "reasoning_content", None)
    jsonschema.validate(json.loads(off.choices[0].message.content), ANSWER)
    raw = thinking.chat.completions.create(
        model=_model(thinking), messages=USER, response_format=ANSWER_FMT, max_tokens=80,
        seed=0, extra_body={"max_reasoning_tokens": 4, "separate_reasoning": False},
    )  # fmt: skip
    text = raw.choices[0].message.content
    assert "</think>" in text
    jsonschema.validate(json.loads(text.split("</think>", 1)[1]), ANSWER)


def test_tool_calls_after_the_reasoning(thinking):
    out = thinking.chat.completions.create(
        model=_model(thinking), messages=USER, tools=[WEATHER, TIME], tool_choice="required",
        max_tokens=80, seed=0, extra_body={"max_reasoning_tokens": 5},
    )  # fmt: skip
    assert out.choices[0].finish_reason == "tool_calls"
    assert out.choices[0].message.reasoning_content
    _check_calls(out.choices[0].message.tool_calls)


def test_separate_reasoning_endpoint(thinking):
    url = str(thinking.base_url).removesuffix("/v1/")
    r = httpx.post(f"{url}/separate_reasoning", json={"text": "hm, Paris</think>\n\nParis."})
    assert r.json() == {"text": "Paris.", "reasoning_text": "hm, Paris"}
