"""Tools inside programs: `gen(tools=...)` and `sgl.tool_loop` (sgl_dsl/tools.py).

The in-process tests run a tiny random Llama with SmolLM2's tokenizer and template (no tool
format of its own: the server's `json` call format), so every call it writes comes from the
strict constraint, not from a model that knows the tools. The server tests send the same
programs through `/v1/chat/completions` with `tools` (RuntimeEndpoint and OpenAI)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

import httpx
import pytest
from pydantic import BaseModel, Field

import sgl_dsl as sgl
from sgl_dsl.backend.base import GenOutput
from sgl_dsl.tools import ToolCall, tool_spec
from tests.support.dsl_backends import FakeBackend

# ---- tools ----

seen: list[dict[str, Any]] = []


def get_weather(
    city: Annotated[str, Field(max_length=12)], unit: Literal["C", "F"] = "C"
) -> dict[str, Any]:
    """The current temperature in a city."""
    seen.append({"city": city, "unit": unit})
    return {"city": city, "temperature": 21, "unit": unit}


def add(a: Annotated[int, Field(ge=0, le=999)], b: Annotated[int, Field(ge=0, le=999)]) -> int:
    """Add two small non-negative integers."""
    seen.append({"a": a, "b": b})
    return a + b


class FinalAnswer(BaseModel):
    """Give the final answer to the user."""

    text: str = Field(max_length=40)
    confident: bool


# ---- schemas from signatures and models ----


def test_function_schema_comes_from_signature_and_docstring():
    spec = tool_spec(get_weather, "t")
    entry = spec.openai()["function"]
    assert entry["name"] == "get_weather"
    assert entry["description"] == "The current temperature in a city."
    params = entry["parameters"]
    assert params["required"] == ["city"]
    assert params["properties"]["city"]["type"] == "string"
    assert params["properties"]["unit"]["enum"] == ["C", "F"]
    assert params["additionalProperties"] is False
    bounds = tool_spec(add, "t").parameters["properties"]["a"]
    assert (bounds["minimum"], bounds["maximum"]) == (0, 999)


def test_model_tool_schema_and_description():
    spec = tool_spec(FinalAnswer, "t")
    assert spec.name == "FinalAnswer" and spec.fn is None
    assert spec.description == "Give the final answer to the user."
    assert set(spec.parameters["properties"]) == {"text", "confident"}


def _varargs(*names: str) -> str:
    return ""


def _untyped(x) -> str:  # noqa: ANN001
    return ""


def _unique(tags: set[int]) -> str:
    return ""


@pytest.mark.parametrize(
    ("tool", "match"),
    [
        (_varargs, "_varargs: parameter 'names'"),
        (_untyped, "_untyped: parameter 'x' has no type annotation"),
        (_unique, "tool _unique cannot be constrained"),
        (42, "neither a function nor a pydantic model"),
    ],
)
def test_unusable_tools_are_type_errors_naming_them(tool, match):
    with pytest.raises(TypeError, match=match):
        sgl.gen("calls", tools=[tool])


def test_gen_tools_refusals_name_the_keyword():
    with pytest.raises(sgl.ProgramError, match="tools cannot be combined with regex"):
        sgl.gen("c", tools=[add], regex="[0-9]+")
    with pytest.raises(sgl.ProgramError, match="n is not supported with tools"):
        sgl.gen("c", tools=[add], n=2)
    with pytest.raises(sgl.ProgramError, match="tool_choice needs tools"):
        sgl.gen("c", tool_choice="required")
    with pytest.raises(sgl.ProgramError, match="tool_choice 'mul' is not"):
        sgl.gen("c", tools=[add], tool_choice="mul")
    with pytest.raises(sgl.ProgramError, match="two tools are named"):
        sgl.gen("c", tools=[add, add])
    with pytest.raises(sgl.ProgramError, match="max_turns must be"):
        sgl.tool_loop([add], max_turns=0)


def test_tool_choice_forms():
    assert sgl.gen("c", tools=[add]).params["tool_choice"] == "auto"
    named = {"type": "function", "function": {"name": "add"}}
    assert sgl.gen("c", tools=[add, get_weather], tool_choice=add).params["tool_choice"] == named
    assert sgl.gen("c", tools=[add], tool_choice="add").params["tool_choice"] == named
    assert sgl.gen("c", tools=[add], tool_choice=named).params["tool_choice"] == named


def test_trace_prints_the_tools():
    @sgl.function
    def prog(s):
        s += sgl.user("hi")
        s += sgl.assistant(sgl.gen("c", tools=[add, get_weather], max_tokens=8))
        s += sgl.tool_loop([add], max_turns=3)

    shown = str(prog.trace())
    assert "gen c(max_tokens=8, tool_choice='auto', tools[add, get_weather])" in shown
    assert "tool_loop answer(tools[add], max_turns=3)" in shown


# ---- the in-process engine ----


@sgl.function
def ask_add(s, question, choice):
    s += sgl.system("You can add numbers with tools.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("calls", tools=[add, get_weather], tool_choice=choice))


def _check_calls(calls: list[ToolCall]) -> None:
    assert calls and all(isinstance(c, ToolCall) for c in calls)
    for c in calls:
        if c.name == "add":
            assert set(c.arguments) == {"a", "b"}
            assert all(isinstance(v, int) and 0 <= v <= 999 for v in c.arguments.values())
        else:
            assert c.name == "get_weather" and isinstance(c.arguments["city"], str)
            assert c.arguments["unit"] in ("C", "F")
        assert json.loads(c.raw_arguments) is not None


def test_required_calls_are_typed_and_in_the_messages(runtime):
    state = ask_add.run(
        question="What is 2 + 3?", choice="required", backend=runtime, temperature=0,
        max_new_tokens=160,
    )  # fmt: skip
    calls = state["calls"]
    _check_calls(calls)
    last = state.messages()[-1]
    assert last["role"] == "assistant"
    assert [c["function"]["name"] for c in last["tool_calls"]] == [c.name for c in calls]
    assert state.get_meta_info("calls")["completion_tokens"] > 0


def test_named_choice_calls_that_tool_only(runtime):
    state = ask_add.run(
        question="Weather in Paris?", choice=get_weather, backend=runtime, temperature=0,
        max_new_tokens=160,
    )  # fmt: skip
    calls = state["calls"]
    _check_calls(calls)
    assert [c.name for c in calls] == ["get_weather"]


def test_choice_none_answers_in_text(runtime):
    state = ask_add.run(
        question="Hello", choice="none", backend=runtime, temperature=0, max_new_tokens=6
    )
    assert isinstance(state["calls"], str)
    assert "tool_calls" not in state.messages()[-1]


def test_a_tool_gen_must_open_its_assistant_turn(runtime):
    @sgl.function
    def bad(s):
        s += sgl.user("hi")
        s += sgl.assistant("Sure: " + sgl.gen("c", tools=[add]))

    with pytest.raises(sgl.ProgramError, match="right after sgl.assistant"):
        bad.run(backend=runtime)


@sgl.function
def agent(s, question):
    s += sgl.system("Use the tools, then answer.")
    s += sgl.user(question)
    s += sgl.tool_loop(
        [add, get_weather], max_turns=2, tool_choice="required", on_max_turns="answer",
        max_tokens=160, temperature=0,
    )  # fmt: skip


def test_tool_loop_runs_the_functions_and_answers(runtime):
    seen.clear()
    state = agent.run(question="What is 2 + 3?", backend=runtime)
    calls = state["tool_calls"]
    _check_calls(calls)
    assert len(seen) == len(calls)  # each call ran once, with its validated arguments
    for call, args in zip(calls, seen, strict=True):
        assert call.arguments == args
        assert call.ran and call.result == (add(**args) if call.name == "add" else call.result)
    assert isinstance(state["answer"], str)
    roles = [m["role"] for m in state.messages()]
    assert roles[:3] == ["system", "user", "assistant"]
    assert roles.count("tool") == len(calls) and roles[-1] == "assistant"
    tool_ids = [m["tool_call_id"] for m in state.messages() if m["role"] == "tool"]
    assert tool_ids == [c.id for c in calls]
    assert "Tool result (" in state.text()


def test_tool_loop_async_matches(runtime):
    seen.clear()
    state = asyncio.run(agent.run_async(question="What is 2 + 3?", backend=runtime))
    assert len(seen) == len(state["tool_calls"]) >= 1
    assert isinstance(state["answer"], str)


def test_model_tool_ends_the_loop_with_its_instance(runtime):
    @sgl.function
    def final(s):
        s += sgl.user("Say hi.")
        s += sgl.tool_loop([FinalAnswer], max_turns=1, tool_choice="required", max_tokens=160)

    state = final.run(backend=runtime, temperature=0)
    assert isinstance(state["answer"], FinalAnswer)
    assert len(state["answer"].text) <= 40
    assert [c.name for c in state["tool_calls"]] == ["FinalAnswer"]


# ---- control flow on a scripted backend ----


class ScriptedTools(FakeBackend):
    """Answers every gen with tools with one call to `add` (a model that never stops)."""

    def __init__(self) -> None:
        super().__init__({})
        self.requests: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

    def chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> GenOutput:
        self.requests.append((messages, params))
        if params["tool_choice"] == "none":
            return GenOutput("done", "stop", content="done", tool_calls=[])
        call = {"id": f"c{len(self.requests)}", "type": "function",
                "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}  # fmt: skip
        return GenOutput('{"name": "add"}', "stop", content=None, tool_calls=[call])


def test_max_turns_is_a_clear_error_with_the_calls_kept():
    backend = ScriptedTools()

    @sgl.function
    def loop(s):
        s += sgl.user("go")
        s += sgl.tool_loop([add], max_turns=3)

    with pytest.raises(sgl.ProgramError, match="max_turns=3"):
        loop.run(backend=backend)
    assert len(backend.requests) == 3
    # each later turn carries the calls and their results
    messages = backend.requests[-1][0]  # (the fake's template adds a default system turn)
    assert [m["role"] for m in messages] == ["system", "user", *(["assistant", "tool"] * 2)]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "3"}


def test_on_max_turns_answer_forces_text_last():
    backend = ScriptedTools()

    @sgl.function
    def loop(s):
        s += sgl.user("go")
        s += sgl.tool_loop([add], max_turns=3, on_max_turns="answer")

    state = loop.run(backend=backend)
    assert [p["tool_choice"] for _, p in backend.requests] == ["auto", "auto", "none"]
    assert state["answer"] == "done" and len(state["tool_calls"]) == 2


def test_a_backend_without_tools_is_named():
    @sgl.function
    def prog(s):
        s += sgl.user("go")
        s += sgl.assistant(sgl.gen("c", tools=[add]))

    with pytest.raises(sgl.BackendError, match="FakeBackend backend cannot run a gen with tools"):
        prog.run(backend=FakeBackend({}))


# ---- HTTP backends: the request they send ----

MODEL_INFO = {"model_path": "m", "served_model_name": "m", "has_chat_template": False}


def _chat_reply(calls: list[dict[str, Any]]) -> dict[str, Any]:
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    return {"id": "x", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7}}  # fmt: skip


def _recorder(bodies: list[tuple[str, dict]]) -> httpx.MockTransport:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 4, "b": 5}'}}  # fmt: skip

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/get_model_info"):
            return httpx.Response(200, json=MODEL_INFO)
        bodies.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json=_chat_reply([call]))

    return httpx.MockTransport(handle)


@pytest.mark.parametrize("kind", ["endpoint", "openai"])
def test_http_backends_send_tools_to_the_chat_api(kind):
    bodies: list[tuple[str, dict]] = []
    if kind == "endpoint":
        backend = sgl.RuntimeEndpoint("http://x", transport=_recorder(bodies))
    else:
        backend = sgl.OpenAI("m", base_url="http://x/v1", transport=_recorder(bodies))
    state = ask_add.run(question="2+3?", choice=add, backend=backend, max_new_tokens=30)
    path, body = bodies[-1]
    assert path.endswith("/chat/completions")
    assert [t["function"]["name"] for t in body["tools"]] == ["add", "get_weather"]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert body["messages"][-1] == {"role": "user", "content": "2+3?"}
    assert body["max_tokens"] == 30
    [call] = state["calls"]
    assert (call.name, call.arguments, call.id) == ("add", {"a": 4, "b": 5}, "call_1")
    assert '{"name": "add", "arguments": {"a": 4, "b": 5}}' in state.text()


def test_openai_dialect_refuses_engine_extras_with_tools():
    backend = sgl.OpenAI("m", base_url="http://x/v1", server="openai", transport=_recorder([]))
    with pytest.raises(sgl.BackendError, match="cannot send top_k"):
        ask_add.run(question="q", choice="auto", backend=backend, top_k=5)


def test_an_invalid_call_from_a_server_names_tool_and_variable():
    def handle(request: httpx.Request) -> httpx.Response:
        call = {"id": "c", "type": "function",
                "function": {"name": "add", "arguments": '{"a": -1, "b": 5}'}}  # fmt: skip
        return httpx.Response(200, json=_chat_reply([call]))

    backend = sgl.OpenAI("m", base_url="http://x/v1", transport=httpx.MockTransport(handle))
    with pytest.raises(sgl.ProgramError, match="'calls'.*tool add do not validate"):
        ask_add.run(question="q", choice="auto", backend=backend)


# ---- through our server ----


@pytest.fixture(scope="module")
def endpoint(server):
    backend = sgl.RuntimeEndpoint(server.url)
    yield backend
    backend.shutdown()


def test_endpoint_tool_loop_through_the_server(endpoint):
    seen.clear()
    state = agent.run(question="What is 2 + 3?", backend=endpoint)
    calls = state["tool_calls"]
    _check_calls(calls)
    assert len(seen) == len(calls)
    assert isinstance(state["answer"], str)


def test_openai_backend_tools_through_the_server(endpoint, server):
    model = endpoint.model_info["served_model_name"]
    backend = sgl.OpenAI(model, base_url=server.url + "/v1")
    try:
        state = ask_add.run(
            question="2+3?", choice="required", backend=backend, temperature=0, max_new_tokens=160
        )
        _check_calls(state["calls"])
        assert backend.token_usage.completion_tokens > 0
    finally:
        backend.shutdown()


def test_tool_loop_agent_example_program(runtime):
    from examples import tool_loop_agent

    state = tool_loop_agent.agent.run(question="What is 17 times 23?", backend=runtime)
    calls = state["tool_calls"]
    assert calls and all(c.ran for c in calls)
    for c in calls:
        fn = {f.__name__: f for f in tool_loop_agent.TOOLS}[c.name]
        assert c.result == fn(**c.arguments)
    assert isinstance(state["answer"], str)


def test_endpoint_tool_loop_async(endpoint):
    seen.clear()
    state = asyncio.run(agent.run_async(question="What is 2 + 3?", backend=endpoint))
    _check_calls(state["tool_calls"])
    assert len(seen) == len(state["tool_calls"])


# ---- each model family's own call format (the chat template picks it) ----------------------------

# template (examples/chat_templates/) -> text its call format writes
FORMATS = {
    "hermes": "<tool_call>",
    "mistral": "[TOOL_CALLS]",
    "pythonic": "[add(",
    "llama3_json": '"name"',
    "deepseekv3": "tool▁call",
}


@pytest.mark.parametrize("template", sorted(FORMATS))
def test_calls_come_in_the_templates_own_format(runtime, template):
    from sgl_dsl.backend.runtime import Runtime
    from tests.support.tool_servers import template_text

    engine = runtime.engine
    saved = engine.tokenizer.chat_template
    engine.tokenizer.chat_template = template_text(template)
    try:
        backend = Runtime.from_engine(engine)  # its role markers from this template
        state = ask_add.run(
            question="What is 2 + 3?", choice=add, backend=backend, temperature=0,
            max_new_tokens=160,
        )  # fmt: skip
    finally:
        engine.tokenizer.chat_template = saved
    [call] = state["calls"]
    assert call.name == "add" and set(call.arguments) == {"a", "b"}
    assert FORMATS[template] in state.text().split("What is 2 + 3?")[-1]  # the model's answer


async def async_add(a: int, b: int) -> int:
    """Add, awaiting."""
    await asyncio.sleep(0)
    return a + b


def broken_add(a: int, b: int) -> int:
    """Always fails."""
    raise RuntimeError("adder offline")


def _one_loop(tool: Any) -> Any:
    @sgl.function
    def loop(s):
        s += sgl.user("go")
        s += sgl.tool_loop([tool], max_turns=2, on_max_turns="answer")

    return loop


class ScriptedAnyTool(ScriptedTools):
    """ScriptedTools calling whichever tool the gen declares."""

    def chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> GenOutput:
        out = super().chat(messages, params)
        for c in out.tool_calls or []:
            c["function"]["name"] = params["tools"][0]["function"]["name"]
        return out


def test_async_tools_are_awaited_in_both_runs():
    state = _one_loop(async_add).run(backend=ScriptedAnyTool())
    assert [c.result for c in state["tool_calls"]] == [3]
    state = asyncio.run(_one_loop(async_add).run_async(backend=ScriptedAnyTool()))
    assert [c.result for c in state["tool_calls"]] == [3]


def test_a_tool_that_raises_is_named():
    with pytest.raises(sgl.ProgramError, match="tool broken_add raised.*adder offline"):
        _one_loop(broken_add).run(backend=ScriptedAnyTool())
