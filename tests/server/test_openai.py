"""The OpenAI-compatible endpoints of a real server process, driven by the `openai` client.

The model is a tiny random Llama, so its text is noise: the tests check what does not depend
on it (shapes, usage, streaming = non-streaming under greedy decoding, constraints validating).
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.support.server_process import constrained_decoding_available

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
needs_constraints = pytest.mark.xfail(
    not constrained_decoding_available(),
    reason="this engine has no constrained decoding",
    strict=False,
)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def _chat(client, model, content="Tell me a story.", **kw):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
    return client.chat.completions.create(model=model, messages=messages, **kw)


def test_models_lists_the_served_model(client):
    models = client.models.list().data
    assert len(models) == 1 and models[0].object == "model"
    assert client.models.retrieve(models[0].id).id == models[0].id


def test_chat_completion_has_message_and_usage(client, model):
    out = _chat(client, model, max_tokens=7, **GREEDY)
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 7
    assert out.usage.prompt_tokens > 10
    assert out.usage.prompt_tokens_details.cached_tokens >= 0


def test_second_identical_prompt_is_served_from_the_cache(client, model):
    _chat(client, model, content="cache me please", max_tokens=2, **GREEDY)
    again = _chat(client, model, content="cache me please", max_tokens=2, **GREEDY)
    # every full page of the prompt but the last token's is cached
    assert again.usage.prompt_tokens_details.cached_tokens >= again.usage.prompt_tokens - 17


def test_chat_stream_reassembles_to_the_greedy_text(client, model):
    whole = _chat(client, model, content="stream this", max_tokens=12, **GREEDY)
    chunks = list(
        _chat(
            client,
            model,
            content="stream this",
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens_details is not None


def test_completion_stream_reassembles_to_the_greedy_text(client, model):
    kw = {"model": model, "prompt": "The quick brown fox", "max_tokens": 10, **GREEDY}
    whole = client.completions.create(**kw).choices[0].text
    pieces = [c.choices[0].text for c in client.completions.create(stream=True, **kw)]
    assert "".join(pieces) == whole


def test_completion_n_choices_and_echo(client, model):
    out = client.completions.create(
        model=model,
        prompt="Hello",
        max_tokens=4,
        n=3,
        echo=True,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.text.startswith("Hello") for c in out.choices)
    assert out.usage.completion_tokens == 12


def test_completion_prompt_batch_of_token_ids(client, model):
    out = client.completions.create(model=model, prompt=[[1, 2, 3], [4, 5]], max_tokens=3, **GREEDY)
    assert len(out.choices) == 2 and out.usage.prompt_tokens == 5


def test_stop_string_ends_the_text_before_it(client, model):
    whole = _chat(client, model, content="stop test", max_tokens=12, **GREEDY)
    text = whole.choices[0].message.content
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = _chat(client, model, content="stop test", max_tokens=12, stop=[stop], **GREEDY)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]


def test_chat_logprobs_and_top_logprobs(client, model):
    out = _chat(client, model, max_tokens=4, logprobs=True, top_logprobs=3, **GREEDY)
    content = out.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-4)


def test_completion_logprobs(client, model):
    out = client.completions.create(model=model, prompt="abc", max_tokens=3, logprobs=2, **GREEDY)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert "".join(lp.tokens) == out.choices[0].text


def test_tool_choice_none_answers_with_content(client, model):
    out = _chat(client, model, max_tokens=5, tools=[WEATHER_TOOL], tool_choice="none", **GREEDY)
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content


@needs_constraints
@pytest.mark.parametrize("seed", range(4))
def test_tool_choice_auto_is_a_valid_call_or_plain_text(client, model, seed):
    out = _chat(
        client,
        model,
        content="Weather in Oslo?",
        max_tokens=60,
        seed=seed,
        tools=[WEATHER_TOOL, TIME_TOOL],
    )
    message = out.choices[0].message
    if message.tool_calls:
        assert out.choices[0].finish_reason == "tool_calls"
        call = message.tool_calls[0].function
        schema = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[call.name]
        jsonschema.validate(json.loads(call.arguments), schema["function"]["parameters"])
    else:  # text may not start a call it does not finish
        assert not message.content.startswith("{")


def test_history_with_tool_calls_and_results_renders(client, model):
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
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
    out = client.chat.completions.create(
        model=model, messages=messages, max_tokens=3, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert out.usage.prompt_tokens > 20


@needs_constraints
def test_response_format_json_schema_validates(client, model):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    out = _chat(
        client, model, content="A person as JSON", max_tokens=60, temperature=0, response_format=fmt
    )
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)


@needs_constraints
def test_response_format_json_object_parses(client, model):
    out = _chat(
        client,
        model,
        content="JSON please",
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert out.choices[0].message.content.startswith("{")


@needs_constraints
@pytest.mark.parametrize(
    "tool_choice",
    [
        pytest.param("required", id="required"),
        pytest.param({"type": "function", "function": {"name": "get_time"}}, id="named"),
    ],
)
def test_forced_tool_call_parses_and_validates(client, model, tool_choice):
    out = _chat(
        client,
        model,
        content="Weather in Paris?",
        max_tokens=60,
        temperature=0,
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice=tool_choice,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER_TOOL, TIME_TOOL)}
    if isinstance(tool_choice, dict):
        assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), tools[call.function.name])
    assert call.id.startswith("call_") and call.type == "function"


@needs_constraints
def test_forced_tool_call_streams_as_openai_streams_it(client, model):
    chunks = list(
        _chat(
            client,
            model,
            content="Time?",
            max_tokens=40,
            temperature=0,
            tools=[TIME_TOOL],
            tool_choice="required",
            stream=True,
        )
    )
    deltas = [
        d for c in chunks if c.choices and c.choices[0].delta.tool_calls
        for d in c.choices[0].delta.tool_calls
    ]  # fmt: skip
    # the first delta names the call (id, type, name, arguments ""); later ones carry the
    # arguments in pieces, which concatenate to JSON of the tool's parameters
    first = deltas[0]
    assert first.id and first.type == "function" and first.function.name == "get_time"
    assert first.function.arguments == ""
    arguments = "".join(d.function.arguments or "" for d in deltas if d.index == first.index)
    assert json.loads(arguments)["zone"] in ("UTC", "CET")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_every_usage_carries_cached_tokens(server, model):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 2,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    last = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]][-1]
    assert "cached_tokens" in last["usage"]["prompt_tokens_details"]


def test_chat_stream_with_n_choices_reassembles_each(client, model):
    whole = _chat(
        client,
        model,
        content="two ways",
        max_tokens=6,
        n=2,
        seed=3,
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    chunks = list(
        _chat(
            client,
            model,
            content="two ways",
            max_tokens=6,
            n=2,
            seed=3,
            temperature=1.0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    texts = ["", ""]
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
    # seeded sampling: choice i of the stream is choice i of the plain request
    assert texts == [c.message.content for c in whole.choices]
    assert whole.usage.completion_tokens == 12
