"""Agent pipelines on the real default model (SmolLM2-135M), where a random model cannot make
meaningful calls: LangChain tool calls from a question, a full round trip to a final answer,
structured output; the openai client's parse; strict mode spending fewer tokens than exact."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.heavy
pytest.importorskip("langchain_openai")

from langchain_core.messages import HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402


@tool
def get_weather(city: str) -> str:
    """Get the current weather of a city."""
    return f"It is 18 degrees and sunny in {city}."


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=120)
    role: Literal["engineer", "doctor", "teacher", "other"]


@pytest.fixture(scope="module")
def chat(default_server):
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused", max_retries=0)
    name = client.models.list().data[0].id
    return ChatOpenAI(
        model=name,
        base_url=f"{default_server.url}/v1",
        api_key="unused",
        temperature=0,
        max_tokens=60,
    )


def test_langchain_tool_round_trip_reaches_an_answer(chat):
    schema = convert_to_openai_tool(get_weather)["function"]["parameters"]
    history = [HumanMessage("What is the weather in Paris?")]
    call_msg = chat.bind_tools([get_weather], tool_choice="any").invoke(history)
    (call,) = call_msg.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], schema)
    assert set(call["args"]) == {"city"} and call["args"]["city"].strip()
    history += [call_msg, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answer = chat.bind_tools([get_weather], tool_choice="none").invoke(history)
    assert isinstance(answer.content, str) and answer.content.strip()


def test_langchain_structured_output_and_openai_parse(chat, default_server):
    prompt = "Alice is a 34 year old engineer. Extract the person."
    out = chat.with_structured_output(Person).invoke(prompt)
    assert isinstance(out, Person)
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused", max_retries=0)
    parsed = client.chat.completions.parse(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": prompt}],
        response_format=Person,
        max_tokens=60,
        temperature=0,
    )
    assert isinstance(parsed.choices[0].message.parsed, Person)


def test_strict_calls_carry_only_declared_arguments(default_server):
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused", max_retries=0)
    name = client.models.list().data[0].id
    tool = convert_to_openai_tool(get_weather)
    params = tool["function"]["parameters"]
    counts = {}
    for mode in ("strict", "exact"):
        out = client.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=[tool],
            tool_choice="required",
            max_tokens=80,
            temperature=0,
            extra_body={"json_schema_mode": mode},
        )
        counts[mode] = out.usage.completion_tokens
        if mode == "strict":
            (call,) = out.choices[0].message.tool_calls
            args = json.loads(call.function.arguments)
            jsonschema.validate(args, params)
            assert set(args) <= {"city"}
    assert counts["strict"] <= counts["exact"]
