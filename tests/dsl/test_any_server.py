"""Any server: a program's constraints in each server's own fields (`server=` on `sgl.OpenAI`
and `sgl.RuntimeEndpoint`), refused by name where a server cannot take one, and `select` as a
constrained choice where the server cannot score text.

The request bodies are recorded through `httpx.MockTransport`; the end-to-end tests send every
dialect to our own server, which accepts OpenAI's, vLLM's (both generations) and SGLang's
fields."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

import sgl_dsl as sgl

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}
GBNF = 'root ::= "yes" | "no"'
TAG = {"type": "structural_tag", "format": {"type": "const_string", "value": "ok"}}


class Recorder:
    """A MockTransport answering every request with `answer`, keeping (path, body) pairs."""

    def __init__(self, answer: str = "x") -> None:
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        self.answer = answer

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/get_model_info"):
            return httpx.Response(200, json={"model_path": "m", "has_chat_template": False})
        body = json.loads(request.content)
        self.bodies.append((path, body))
        if path.endswith("/generate"):
            meta = {"finish_reason": {"type": "stop"}, "prompt_tokens": 1, "cached_tokens": 0,
                    "completion_tokens": 1}  # fmt: skip
            return httpx.Response(200, json={"text": self.answer, "meta_info": meta})
        if path.endswith("/chat/completions"):
            choice = {"index": 0, "message": {"content": self.answer}, "finish_reason": "stop"}
        else:
            choice = {"index": 0, "text": self.answer, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [choice], "usage": {}})

    @property
    def last(self) -> dict[str, Any]:
        return self.bodies[-1][1]


def openai(server: str | None, chat: bool = True, answer: str = "x") -> tuple[Any, Recorder]:
    rec = Recorder(answer)
    backend = sgl.OpenAI(
        "m", base_url="http://x/v1", is_chat_model=chat, server=server,
        transport=httpx.MockTransport(rec),
    )  # fmt: skip
    return backend, rec


@sgl.function
def one_gen(s, kw):
    s += sgl.user("Q")
    s += sgl.assistant(sgl.gen("out", **{"max_tokens": 8, **kw}))


@sgl.function
def plain_gen(s, kw):
    s += "Q: " + sgl.gen("out", **{"max_tokens": 8, **kw})


def _sent(server: str, kw: dict[str, Any], chat: bool = True) -> dict[str, Any]:
    backend, rec = openai(server, chat)
    (one_gen if chat else plain_gen).run(kw=kw, backend=backend)
    body = rec.last
    for key in ("model", "stream", "max_tokens", "messages", "prompt"):
        body.pop(key, None)
    return body


CHAT_CASES = [
    # (constraint keywords, {server: the fields it must send})
    (
        {"json_schema": SCHEMA},
        {
            "openai": {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": SCHEMA, "strict": True},
                }
            },
            "vllm": {"structured_outputs": {"json": SCHEMA}},
            "vllm-guided": {"guided_json": SCHEMA},
            "sglang": {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": SCHEMA},
                }
            },
        },
    ),
    (
        {"regex": "[0-9]+"},
        {
            "vllm": {"structured_outputs": {"regex": "[0-9]+"}},
            "vllm-guided": {"guided_regex": "[0-9]+"},
            "sglang": {"regex": "[0-9]+"},
        },
    ),
    (
        {"choices": ["red", "blue"], "temperature": 0.7},
        {
            "vllm": {"structured_outputs": {"choice": ["red", "blue"]}, "temperature": 0.7},
            "vllm-guided": {"guided_choice": ["red", "blue"], "temperature": 0.7},
        },
    ),
    (
        {"ebnf": GBNF},
        {
            "vllm": {"structured_outputs": {"grammar": GBNF}},
            "vllm-guided": {"guided_grammar": GBNF},
            "sglang": {"ebnf": GBNF},
        },
    ),
    (
        {"structural_tag": TAG},
        {
            "vllm": {
                "structured_outputs": {"structural_tag": json.dumps(TAG, separators=(",", ":"))}
            },
            "vllm-guided": {"response_format": TAG},
            "sglang": {"response_format": TAG},
        },
    ),
]


@pytest.mark.parametrize(("kw", "expected"), CHAT_CASES, ids=lambda v: str(v)[:20])
def test_chat_constraints_go_in_each_servers_fields(kw, expected):
    for server, fields in expected.items():
        assert _sent(server, kw) == fields, server


def test_choices_and_dtype_as_regex_for_sglang():
    body = _sent("sglang", {"choices": ["red", "blue"], "temperature": 0.7})
    assert re.fullmatch(body["regex"], "red") and not re.fullmatch(body["regex"], "green")
    body = _sent("vllm", {"dtype": int})
    assert re.fullmatch(body["structured_outputs"]["regex"], "-12")


def test_completion_models_fields():
    assert _sent("sglang", {"json_schema": SCHEMA}, chat=False) == {
        "json_schema": json.dumps(SCHEMA, separators=(",", ":"))
    }
    assert _sent("vllm", {"json_schema": SCHEMA}, chat=False) == {
        "structured_outputs": {"json": SCHEMA}
    }
    assert _sent("vllm-guided", {"regex": "a+"}, chat=False) == {"guided_regex": "a+"}
    assert _sent("sglang", {"structural_tag": TAG}, chat=False) == {"response_format": TAG}


def test_runtime_dialect_sends_json_schema_mode():
    body = _sent("runtime", {"json_schema": SCHEMA, "json_schema_mode": "exact"})
    assert body["json_schema_mode"] == "exact" and "response_format" in body


@pytest.mark.parametrize(
    ("server", "kw", "chat", "match"),
    [
        ("openai", {"regex": "[0-9]+"}, True, r"server='openai'.*cannot constrain to regex"),
        ("openai", {"dtype": int}, True, "cannot constrain to dtype"),
        ("openai", {"ebnf": GBNF}, True, "cannot constrain to ebnf"),
        ("openai", {"structural_tag": TAG}, True, "cannot constrain to structural_tag"),
        ("openai", {"json_schema": SCHEMA}, False, "json_schema on a completion model"),
        ("openai", {"top_k": 5}, True, "OpenAI's API has no top_k"),
        ("sglang", {"grammar": 'start: "a"'}, True, "lark grammars"),
        ("vllm", {"grammar": 'start: "a"'}, True, "lark grammars"),
        ("vllm", {"json_schema": SCHEMA, "json_schema_mode": "exact"}, True, "json_schema_mode"),
    ],
)
def test_what_a_server_cannot_take_is_refused_by_name(server, kw, chat, match):
    backend, rec = openai(server, chat)
    with pytest.raises(sgl.BackendError, match=match):
        (one_gen if chat else plain_gen).run(kw=kw, backend=backend)
    assert rec.bodies == []  # nothing was sent


def _answering(routes: dict[str, Any]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        body = routes.get(request.url.path)
        return httpx.Response(404) if body is None else httpx.Response(200, json=body)

    return httpx.MockTransport(handle)


@pytest.mark.parametrize(
    ("routes", "expected"),
    [
        ({"/get_model_info": {"model_path": "m", "has_chat_template": True}}, "runtime"),
        ({"/get_model_info": {"model_path": "m", "is_generation": True}}, "sglang"),
        ({"/version": {"version": "0.12.1"}}, "vllm"),
        ({"/version": {"version": "0.9.2"}}, "vllm-guided"),
        ({}, "openai"),  # a server that does not say: OpenAI's fields only
    ],
)
def test_unset_server_is_asked_of_the_server(routes, expected):
    backend = sgl.OpenAI("m", base_url="http://x/v1", transport=_answering(routes))
    assert backend.server == expected


def test_default_server_follows_the_url():
    assert sgl.OpenAI("m", base_url="https://api.openai.com/v1").server == "openai"
    assert sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1").server == "openai"  # no answer
    with pytest.raises(sgl.BackendError, match="server is one of"):
        sgl.OpenAI("m", base_url="http://x/v1", server="tgi")
    with pytest.raises(sgl.BackendError, match="server is one of"):
        sgl.RuntimeEndpoint("http://x", server="vllm")


# ---- select on a chat model: a constrained choice ----


@sgl.function
def pick(s):
    s += sgl.user("Color?")
    s += sgl.assistant(sgl.select("color", ["red", "blue"]))


def test_select_on_vllm_chat_is_a_guided_choice():
    backend, rec = openai("vllm", answer="blue")
    state = pick.run(backend=backend)
    assert state["color"] == "blue"
    assert rec.last["structured_outputs"] == {"choice": ["red", "blue"]}
    assert rec.last["temperature"] == 0.0
    assert state.get_meta_info("color")["method"] == "constrained_choice"


def test_select_on_openai_chat_is_a_strict_enum_read_back():
    backend, rec = openai("openai", answer='{"choice": "red"}')
    state = pick.run(backend=backend)
    assert state["color"] == "red"
    schema = rec.last["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["choice"]["enum"] == ["red", "blue"]


def test_select_needing_scores_is_refused_on_a_chat_model():
    @sgl.function
    def pick_unconditional(s):
        s += sgl.user("Color?")
        s += sgl.assistant(
            sgl.select("c", ["red", "blue"], choices_method=sgl.unconditional_likelihood_normalized)
        )

    backend, _ = openai("vllm")
    with pytest.raises(sgl.ProgramError, match="unconditional_likelihood_normalized"):
        pick_unconditional.run(backend=backend)


def test_a_choice_answered_outside_the_choices_is_an_error():
    backend, _ = openai("vllm", answer="green")
    with pytest.raises(sgl.ProgramError, match="not one of the choices"):
        pick.run(backend=backend)


# ---- RuntimeEndpoint: our server or SGLang's ----


def endpoint(server: str) -> tuple[Any, Recorder]:
    rec = Recorder("7")
    return sgl.RuntimeEndpoint("http://x", server=server, transport=httpx.MockTransport(rec)), rec


@pytest.mark.parametrize(
    ("kw", "field", "value"),
    [
        ({"regex": "[0-9]"}, "regex", "[0-9]"),
        ({"json_schema": SCHEMA}, "json_schema", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"ebnf": GBNF}, "ebnf", GBNF),
        ({"structural_tag": TAG}, "structural_tag", json.dumps(TAG, separators=(",", ":"))),
    ],
)
def test_sglang_generate_fields(kw, field, value):
    backend, rec = endpoint("sglang")
    plain_gen.run(kw={**kw, "seed": 3}, backend=backend)
    sampling = rec.last["sampling_params"]
    assert sampling[field] == value
    assert sampling["sampling_seed"] == 3 and "seed" not in sampling


def test_sglang_generate_refusals():
    backend, rec = endpoint("sglang")
    with pytest.raises(sgl.BackendError, match="no lark grammar"):
        plain_gen.run(kw={"grammar": 'start: "a"'}, backend=backend)
    with pytest.raises(sgl.BackendError, match="json_schema_mode"):
        plain_gen.run(kw={"regex": "a", "json_schema_mode": "exact"}, backend=backend)
    assert rec.bodies == []


def test_unset_endpoint_server_is_read_from_model_info():
    ours = {"/get_model_info": {"model_path": "m", "has_chat_template": True}}
    sglang = {"/get_model_info": {"model_path": "m", "is_generation": True}}
    assert sgl.RuntimeEndpoint("http://x", transport=_answering(ours)).server == "runtime"
    assert sgl.RuntimeEndpoint("http://x", transport=_answering(sglang)).server == "sglang"


def test_our_server_must_name_the_constraint_it_applied():
    # our server reports meta_info.constraint; an answer without it passed through something
    # that dropped the field (SGLang's server never reports it, so it is not asked there)
    backend, _ = endpoint("runtime")
    with pytest.raises(sgl.BackendError, match="without the regex constraint"):
        plain_gen.run(kw={"regex": "[0-9]"}, backend=backend)


# ---- end to end against our server ----


@pytest.fixture(scope="module")
def model(server):
    info = sgl.RuntimeEndpoint(server.url)
    try:
        return info.model_info["served_model_name"]
    finally:
        info.shutdown()


@sgl.function
def constrained(s):
    s += sgl.system("Answer briefly.")
    s += sgl.user("A number as JSON.")
    s += sgl.assistant(sgl.gen("record", max_tokens=24, json_schema=SCHEMA, temperature=0))
    s += sgl.user("Three digits.")
    s += sgl.assistant(sgl.gen("digits", max_tokens=6, regex="[0-9]{3}", temperature=0))
    s += sgl.user("Pick a color.")
    s += sgl.assistant(sgl.select("color", ["red", "blue"]))
    s += sgl.user("Yes or no?")
    s += sgl.assistant(sgl.gen("yn", max_tokens=4, ebnf=GBNF, temperature=0))


@pytest.mark.parametrize("dialect", ["vllm", "vllm-guided", "sglang", "runtime"])
def test_every_dialect_is_honoured_by_our_server(server, model, dialect):
    backend = sgl.OpenAI(model, base_url=server.url + "/v1", server=dialect)
    try:
        state = constrained.run(backend=backend)
    finally:
        backend.shutdown()
    if state.get_meta_info("record")["finish_reason"] == "stop":
        assert isinstance(json.loads(state["record"])["n"], int)
    assert re.fullmatch("[0-9]{0,3}", state["digits"])
    assert state["color"] in ("red", "blue")
    assert state["yn"] in ("yes", "no", "y", "n", "ye", "")  # cut by max_tokens at worst


def test_openai_dialect_against_our_server(server, model):
    @sgl.function
    def prog(s):
        s += sgl.user("A number as JSON.")
        s += sgl.assistant(sgl.gen("record", max_tokens=24, json_schema=SCHEMA, temperature=0))
        s += sgl.user("Pick.")
        s += sgl.assistant(sgl.select("color", ["red", "blue"]))

    backend = sgl.OpenAI(model, base_url=server.url + "/v1", server="openai")
    try:
        state = prog.run(backend=backend)
    finally:
        backend.shutdown()
    assert state["color"] in ("red", "blue")
    if state.get_meta_info("record")["finish_reason"] == "stop":
        assert isinstance(json.loads(state["record"])["n"], int)


def test_runtime_endpoint_as_sglang_against_our_server(server):
    backend = sgl.RuntimeEndpoint(server.url, server="sglang")
    try:
        state = plain_gen.run(kw={"regex": "[0-9]{2}", "temperature": 0}, backend=backend)
        assert re.fullmatch("[0-9]{0,2}", state["out"])
        state = plain_gen.run(kw={"json_schema": SCHEMA, "max_tokens": 24}, backend=backend)
        if state.get_meta_info("out")["finish_reason"] == "stop":
            assert isinstance(json.loads(state["out"])["n"], int)
    finally:
        backend.shutdown()


@sgl.function
def pick_plain(s):
    s += "Color: " + sgl.select("color", ["red", "blue"])
    s += "\nAgain: " + sgl.select("again", ["red", "blue"])


def test_a_completion_server_without_prompt_logprobs_answers_by_choice():
    backend, rec = openai("vllm", chat=False, answer="blue")  # echoes no log-probs
    state = pick_plain.run(backend=backend)
    assert (state["color"], state["again"]) == ("blue", "blue")
    sent = [body for _, body in rec.bodies]
    assert sent[0]["echo"] is True  # tried to score first
    assert sent[1]["structured_outputs"] == {"choice": ["red", "blue"]}
    assert len(sent) == 3 and "echo" not in sent[2]  # then remembered: no second scoring try
    assert backend.scores_text is False
