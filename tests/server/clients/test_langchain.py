"""LangChain's `ChatOpenAI` against a real server (tiny random model): structured output by
each method, bound tools with each tool_choice, a tool round trip, streaming, batch. Every
structured result must parse into its model and every forced call must validate."""

from __future__ import annotations

from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.support.server_process import shared_server

pytest.importorskip("langchain_openai")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402


class Weather(BaseModel):
    """The weather somewhere."""

    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=7)


class Loose(BaseModel):
    """Any JSON object parses into this (json_mode only promises an object)."""

    note: str = "none"


@tool
def get_time(zone: Literal["UTC", "CET"]) -> str:
    """The time in a zone."""
    return f"12:00 {zone}"


@tool
def add(a: int = Field(ge=0, le=99), b: int = Field(ge=0, le=99)) -> int:
    """Add two small numbers."""
    return a + b


TOOLS = {"get_time": get_time, "add": add}
SCHEMAS = {n: convert_to_openai_tool(t)["function"]["parameters"] for n, t in TOOLS.items()}


@pytest.fixture(scope="module")
def chat():
    import httpx

    server = shared_server()
    name = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    return ChatOpenAI(
        model=name,
        base_url=f"{server.url}/v1",
        api_key="unused",
        temperature=0,
        max_tokens=80,
        max_retries=0,
    )


def _check(calls, names=None):
    assert calls
    for c in calls:
        assert c["name"] in (names or TOOLS) and c["id"]
        jsonschema.validate(c["args"], SCHEMAS[c["name"]])


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_parses_into_the_model(chat, method):
    out = chat.with_structured_output(Weather, method=method).invoke("Weather in Oslo?")
    assert isinstance(out, Weather)


def test_structured_output_json_mode(chat):
    out = chat.with_structured_output(Loose, method="json_mode").invoke("Reply in JSON.")
    assert isinstance(out, Loose)


def test_structured_output_include_raw(chat):
    out = chat.with_structured_output(Weather, include_raw=True).invoke("Weather?")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Weather)


@pytest.mark.parametrize("choice", ["get_time", "any", "auto"])
def test_bind_tools_with_each_tool_choice(chat, choice):
    msg = chat.bind_tools(list(TOOLS.values()), tool_choice=choice).invoke("What time is it?")
    assert isinstance(msg, AIMessage)
    if choice == "auto" and not msg.tool_calls:
        assert isinstance(msg.content, str)
        return
    _check(msg.tool_calls, names={"get_time"} if choice == "get_time" else None)


def test_tool_round_trip(chat):
    bound = chat.bind_tools([get_time], tool_choice="get_time")
    history = [HumanMessage("What time is it in Paris?")]
    call_msg = bound.invoke(history)
    _check(call_msg.tool_calls, names={"get_time"})
    history.append(call_msg)
    for call in call_msg.tool_calls:
        result = TOOLS[call["name"]].invoke(call["args"])
        history.append(ToolMessage(content=str(result), tool_call_id=call["id"]))
    answer = chat.bind_tools([get_time]).invoke(history)
    assert isinstance(answer, AIMessage)
    assert answer.tool_calls or isinstance(answer.content, str)


def test_stream_text_and_forced_tool_call(chat):
    pieces = list(chat.stream("Say hi."))
    assert pieces and all(isinstance(p.content, str) for p in pieces)
    total = None
    for chunk in chat.bind_tools([add], tool_choice="any").stream("Add 2 and 3."):
        total = chunk if total is None else total + chunk
    assert total.response_metadata.get("finish_reason") == "tool_calls"
    _check(total.tool_calls, names={"add"})


def test_batch(chat):
    structured = chat.with_structured_output(Weather)
    outs = structured.batch(["Oslo?", "Paris?", "Rome?"])
    assert len(outs) == 3 and all(isinstance(o, Weather) for o in outs)
