"""pydantic-ai, unchanged, against the default-model server through its OpenAI chat model: each
`output_type` mode with a nested model (tool output, native `response_format`, prompted JSON), a
function tool the agent calls before it answers, and streamed structured output."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest

from tests.support.extraction import AGE_TOOL_SCHEMA, PROMPT, Person, Team, age_of, check_arguments

pytest.importorskip("pydantic_ai")

from pydantic_ai import (  # noqa: E402
    Agent,
    NativeOutput,
    PromptedOutput,
    ToolOutput,
    capture_run_messages,  # noqa: E402
)
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.exceptions import UnexpectedModelBehavior  # noqa: E402
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402
from pydantic_ai.settings import ModelSettings, ToolOrOutput  # noqa: E402

SETTINGS = ModelSettings(max_tokens=160, temperature=0)


@pytest.fixture(scope="module")
def chat_model(default_server):
    import httpx

    name = httpx.get(f"{default_server.url}/v1/models").json()["data"][0]["id"]
    provider = OpenAIProvider(base_url=f"{default_server.url}/v1", api_key="unused")
    return OpenAIChatModel(name, provider=provider)


@pytest.mark.parametrize(
    "output_type",
    [Team, ToolOutput(Team), NativeOutput(Team)],
    ids=["default", "tool", "native"],
)
def test_structured_output_parses_into_the_nested_model(chat_model, output_type):
    agent = Agent(chat_model, output_type=output_type, model_settings=SETTINGS, retries=0)
    assert isinstance(agent.run_sync(PROMPT).output, Team)


def test_prompted_output_gets_a_json_object(chat_model):
    """Prompted mode puts the schema in the prompt and asks only for `json_object`, so the
    server promises an object, not the schema (docs/compatibility.md: use native or tool)."""
    agent = Agent(
        chat_model, output_type=PromptedOutput(Person), model_settings=SETTINGS, retries=0
    )
    with capture_run_messages() as messages:
        try:
            out = agent.run_sync(PROMPT).output
        except UnexpectedModelBehavior:
            out = None
    assert out is None or isinstance(out, Person)
    (reply,) = [m for m in messages if isinstance(m, ModelResponse)]
    text = "".join(p.content for p in reply.parts if isinstance(p, TextPart))
    if reply.finish_reason != "length":
        assert isinstance(json.loads(text), dict)


@dataclass(init=False)
class LookUpFirst(AbstractCapability):
    """Forces the age tool on the first step and the output tool after it (what a user writes
    to make an agent use a tool before it answers)."""

    def get_model_settings(self):
        def per_step(ctx):
            first = ctx.run_step == 1
            return ModelSettings(tool_choice=["age_of"] if first else ToolOrOutput([]))

        return per_step


def test_agent_calls_a_tool_then_answers(chat_model):
    agent = Agent(
        chat_model,
        output_type=ToolOutput(Person),
        model_settings=SETTINGS,
        retries=0,
        capabilities=[LookUpFirst()],
    )
    calls = []

    @agent.tool_plain(name="age_of")
    def look_up(name: str) -> int:
        """The age of a person, by name."""
        calls.append(name)
        return age_of(name)

    result = agent.run_sync(PROMPT)
    assert isinstance(result.output, Person)
    parts = [
        p
        for m in result.all_messages()
        if isinstance(m, ModelResponse)
        for p in m.parts
        if isinstance(p, ToolCallPart)
    ]
    assert [p.tool_name for p in parts] == ["age_of", "final_result"]
    check_arguments(parts[0].args, AGE_TOOL_SCHEMA)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "output_type", [ToolOutput(Team), NativeOutput(Team)], ids=["tool", "native"]
)
def test_streamed_output_ends_in_the_nested_model(chat_model, output_type):
    agent = Agent(chat_model, output_type=output_type, model_settings=SETTINGS, retries=0)

    async def run():
        async with agent.run_stream(PROMPT) as result:
            snapshots = [o async for o in result.stream_output(debounce_by=None)]
            return snapshots, await result.get_output()

    snapshots, final = asyncio.run(run())
    assert len(snapshots) > 1 and isinstance(final, Team)
