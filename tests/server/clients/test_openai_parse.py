"""The `openai` package's parse helpers, unchanged, against the default-model server with nested
models: `chat.completions.parse` with a `response_format` and with a strict function tool,
`chat.completions.stream` with a `response_format`, and `responses.parse` with a `text_format`
and with a function tool."""

from __future__ import annotations

import openai
import pytest

from tests.support.extraction import PROMPT, Team

MESSAGES = [{"role": "user", "content": PROMPT}]
TOOL = openai.pydantic_function_tool(Team, name="record_team")


@pytest.fixture(scope="module")
def client(default_server):
    return openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_chat_parse_with_a_response_format(client, model):
    out = client.chat.completions.parse(
        model=model, messages=MESSAGES, response_format=Team, max_tokens=160, temperature=0
    )
    assert isinstance(out.choices[0].message.parsed, Team)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "record_team"}}]
)
def test_chat_parse_with_a_nested_function_tool(client, model, choice):
    out = client.chat.completions.parse(
        model=model,
        messages=MESSAGES,
        tools=[TOOL],
        tool_choice=choice,
        max_tokens=160,
        temperature=0,
    )
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "record_team"
    assert isinstance(call.function.parsed_arguments, Team)


def test_chat_stream_helper_with_a_response_format(client, model):
    with client.chat.completions.stream(
        model=model, messages=MESSAGES, response_format=Team, max_tokens=160, temperature=0
    ) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    assert "content.delta" in kinds
    assert isinstance(final.choices[0].message.parsed, Team)


def test_responses_parse_with_a_text_format(client, model):
    out = client.responses.parse(
        model=model, input=PROMPT, text_format=Team, max_output_tokens=160, temperature=0
    )
    assert isinstance(out.output_parsed, Team)


def test_responses_parse_with_a_nested_function_tool(client, model):
    tool = {"type": "function", **TOOL["function"]}
    out = client.responses.parse(
        model=model,
        input=PROMPT,
        tools=[tool],
        tool_choice="required",
        max_output_tokens=160,
        temperature=0,
    )
    calls = [item for item in out.output if item.type == "function_call"]
    assert calls and all(c.name == "record_team" for c in calls)
    for call in calls:
        Team.model_validate_json(call.arguments)
