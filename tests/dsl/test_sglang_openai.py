"""`sgl.OpenAI`: programs against an OpenAI-compatible server (our own `/v1` here)."""

from __future__ import annotations

import json
import re

import pytest

import sgl_dsl as sgl


@pytest.fixture(scope="module")
def model(server):
    return sgl.RuntimeEndpoint(server.url).model_info["served_model_name"]


@pytest.fixture(scope="module")
def chat(server, model):
    backend = sgl.OpenAI(model, base_url=server.url + "/v1", api_key="unused")
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def completion(server, model):
    backend = sgl.OpenAI(model, base_url=server.url + "/v1", is_chat_model=False)
    yield backend
    backend.shutdown()


SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


@sgl.function
def chat_program(s, question):
    s += sgl.system("You are terse.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=6, temperature=0))
    s += sgl.user("As JSON.")
    s += sgl.assistant(sgl.gen("record", max_tokens=24, json_schema=SCHEMA, temperature=0))
    s += sgl.user("Digits?")
    s += sgl.assistant(sgl.gen("digits", max_tokens=6, regex="[0-9]{3}", temperature=0))


def test_chat_model_roles_become_messages(chat):
    state = chat_program.run(question="Why?", backend=chat)
    roles = ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert [m["role"] for m in state.messages()] == roles
    meta = state.get_meta_info("record")
    if meta["finish_reason"] == "stop":
        assert isinstance(json.loads(state["record"])["n"], int)
    assert re.fullmatch("[0-9]{0,3}", state["digits"])
    assert chat.token_usage.prompt_tokens > 0


def test_chat_model_refusals_are_clear(chat):
    @sgl.function
    def continues(s):
        s += sgl.assistant("Half an answer" + sgl.gen("x", max_tokens=2))

    with pytest.raises(sgl.BackendError, match="right after sgl.assistant"):
        continues.run(backend=chat)

    @sgl.function
    def picks(s):
        s += sgl.user("Pick.")
        s += sgl.assistant(sgl.select("x", ["a", "b"]))

    # a chat model cannot score given text: select is a constrained choice there
    state = picks.run(backend=chat)
    assert state["x"] in ("a", "b")
    assert state.get_meta_info("x")["method"] == "constrained_choice"


def test_completion_model_selects_and_streams(completion):
    @sgl.function
    def prog(s):
        s += "Q: Is the sky blue?\nA:" + sgl.select("yes", [" yes", " no"])
        s += "\nWhy:" + sgl.gen("why", max_tokens=5, temperature=0)

    state = prog.run(backend=completion)
    assert state["yes"] in (" yes", " no")
    streamed = prog.run(backend=completion, stream=True)
    assert "".join(streamed.text_iter("why")) == state["why"]
