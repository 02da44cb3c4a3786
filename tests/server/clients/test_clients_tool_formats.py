"""Agent frameworks against a server whose chat template renders tools in the Hermes format
(tiny random Qwen2 model; calls parsed by the parser chosen from the template): LangChain's
`bind_tools` with each tool_choice and a tool round trip, LangGraph's prebuilt ReAct agent
running a tool, LiteLLM's `completion` forced and streamed. Every call must validate."""

from __future__ import annotations

import json
import os
from typing import Literal

import jsonschema
import pytest
from pydantic import Field

from tests.support.tool_servers import template_server

pytest.importorskip("langchain_openai")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402


@tool
def get_time(zone: Literal["UTC", "CET"]) -> str:
    """The time in a zone."""
    return f"12:00 {zone}"


@tool
def add(a: int = Field(ge=0, le=99), b: int = Field(ge=0, le=99)) -> int:
    """Add two small numbers."""
    return a + b


@tool(return_direct=True)
def lookup_time(zone: Literal["UTC", "CET"]) -> str:
    """Look the time up (its result is the agent's answer)."""
    return f"it is 12:00 in {zone}"


TOOLS = {"get_time": get_time, "add": add, "lookup_time": lookup_time}
SCHEMAS = {n: convert_to_openai_tool(t)["function"]["parameters"] for n, t in TOOLS.items()}


@pytest.fixture(scope="module")
def server():
    return template_server("hermes")


@pytest.fixture(scope="module")
def chat(server):
    import httpx

    name = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    return ChatOpenAI(model=name, base_url=f"{server.url}/v1", api_key="unused", temperature=0,
                      max_tokens=60, max_retries=0)  # fmt: skip


def _check(calls, names):
    assert calls
    for c in calls:
        assert c["name"] in names and c["id"]
        jsonschema.validate(c["args"], SCHEMAS[c["name"]])


@pytest.mark.parametrize("choice", ["get_time", "any", "auto"])
def test_langchain_bind_tools_with_each_tool_choice(chat, choice):
    msg = chat.bind_tools([get_time, add], tool_choice=choice).invoke("What time is it?")
    assert isinstance(msg, AIMessage)
    if choice == "auto" and not msg.tool_calls:
        assert "<tool_call>" not in msg.content
        return
    _check(msg.tool_calls, {"get_time"} if choice == "get_time" else {"get_time", "add"})


def test_langchain_tool_round_trip(chat):
    history = [HumanMessage("What time is it in Paris?")]
    call_msg = chat.bind_tools([get_time], tool_choice="get_time").invoke(history)
    _check(call_msg.tool_calls, {"get_time"})
    history.append(call_msg)
    for call in call_msg.tool_calls:
        result = TOOLS[call["name"]].invoke(call["args"])
        history.append(ToolMessage(content=str(result), tool_call_id=call["id"]))
    answer = chat.bind_tools([get_time]).invoke(history)  # the history through the template
    assert isinstance(answer, AIMessage)
    assert answer.tool_calls or "<tool_call>" not in answer.content


def test_langchain_streamed_forced_call(chat):
    total = None
    bound = chat.bind_tools([add], tool_choice="any", parallel_tool_calls=False)
    for chunk in bound.stream("Add 2 and 3."):
        total = chunk if total is None else total + chunk
    assert total.response_metadata.get("finish_reason") == "tool_calls"
    _check(total.tool_calls, {"add"})


def test_langgraph_react_agent_runs_a_tool(chat):
    prebuilt = pytest.importorskip("langgraph.prebuilt")
    # a forced call to a return_direct tool: the agent calls it, runs it and ends with its result
    model = chat.bind_tools([lookup_time], tool_choice="lookup_time")
    agent = prebuilt.create_react_agent(model, [lookup_time])
    out = agent.invoke({"messages": [HumanMessage("What time is it?")]}, {"recursion_limit": 6})
    kinds = [type(m).__name__ for m in out["messages"]]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage"]
    (call,) = out["messages"][1].tool_calls
    _check([call], {"lookup_time"})
    assert out["messages"][2].content == lookup_time.invoke(call["args"])


@pytest.fixture(scope="module")
def litellm_kw(server):
    import httpx

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost map download
    pytest.importorskip("litellm")
    name = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    return {"model": f"openai/{name}", "api_base": f"{server.url}/v1", "api_key": "unused",
            "temperature": 0, "max_tokens": 60, "num_retries": 0}  # fmt: skip


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("stream", [False, True])
def test_litellm_forced_call(litellm_kw, stream):
    import litellm

    tools = [convert_to_openai_tool(get_time)]
    kw = dict(messages=[{"role": "user", "content": "Time?"}], tools=tools,
              tool_choice="required", **litellm_kw)  # fmt: skip
    if not stream:
        out = litellm.completion(**kw)
        assert out.choices[0].finish_reason == "tool_calls"
        calls = out.choices[0].message.tool_calls
        args = [json.loads(c.function.arguments) for c in calls]
    else:
        chunks = list(litellm.completion(stream=True, **kw))
        built = litellm.stream_chunk_builder(chunks)
        calls = built.choices[0].message.tool_calls
        args = [json.loads(c.function.arguments) for c in calls]
    assert calls and all(c.function.name == "get_time" for c in calls)
    for a in args:
        jsonschema.validate(a, SCHEMAS["get_time"])
