"""The OpenAI Agents SDK, unchanged, against the default-model server with each of its OpenAI
models: the Responses model (its default, `/v1/responses`) and the chat-completions model. An
agent with a nested `output_type`, alone and with a function tool it must call first, run and
streamed. Tracing is off: the SDK would export traces to OpenAI otherwise."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.extraction import AGE_TOOL_SCHEMA, PROMPT, Team, age_of, check_arguments

pytest.importorskip("agents")

from agents import (  # noqa: E402
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI  # noqa: E402

set_tracing_disabled(True)

MODELS = {"responses": OpenAIResponsesModel, "chat_completions": OpenAIChatCompletionsModel}
SETTINGS = {"max_tokens": 160, "temperature": 0}


@pytest.fixture(scope="module")
def url(default_server):
    return f"{default_server.url}/v1"


@pytest.fixture(scope="module")
def model_name(url):
    import httpx

    return httpx.get(f"{url}/models").json()["data"][0]["id"]


def _run(agent: Agent, streamed: bool):
    """The run's result; streamed runs are drained event by event first."""

    async def go():
        if not streamed:
            return await Runner.run(agent, PROMPT, max_turns=4)
        result = Runner.run_streamed(agent, PROMPT, max_turns=4)
        kinds = {event.type async for event in result.stream_events()}
        assert "raw_response_event" in kinds
        return result

    return asyncio.run(go())


def _agent(url, model_name, kind, **kw) -> Agent:
    # a client per run: its connections belong to the event loop that made them
    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    model = MODELS[kind](model=model_name, openai_client=client)
    return Agent(name="extractor", instructions="Extract the people.", model=model, **kw)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_output_type_parses_into_the_nested_model(url, model_name, kind, streamed):
    agent = _agent(
        url, model_name, kind, output_type=Team, model_settings=ModelSettings(**SETTINGS)
    )
    assert isinstance(_run(agent, streamed).final_output, Team)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_function_tool_is_called_then_the_output_parses(url, model_name, kind, streamed):
    calls = []

    # enabled until called once: the next turn has only the output type left to answer with
    @function_tool(is_enabled=lambda ctx, agent: not calls)
    def look_up_age(name: str) -> int:
        """The age of a person, by name."""
        calls.append(name)
        return age_of(name)

    # `required` forces the first turn's call; the SDK resets tool_choice after it
    settings = ModelSettings(tool_choice="required", **SETTINGS)
    agent = _agent(
        url, model_name, kind, output_type=Team, tools=[look_up_age], model_settings=settings
    )
    result = _run(agent, streamed)
    assert isinstance(result.final_output, Team)
    tool_calls = [item.raw_item for item in result.new_items if item.type == "tool_call_item"]
    assert len(tool_calls) == len(calls) == 1
    for call in tool_calls:
        name = call.name if hasattr(call, "name") else call["name"]
        arguments = call.arguments if hasattr(call, "arguments") else call["arguments"]
        assert name == "look_up_age"
        check_arguments(arguments, AGE_TOOL_SCHEMA)
