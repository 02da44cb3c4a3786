"""Every request field that constrains output, as each kind of client sends it, against a real
server: the output obeys the field (checked with jsonschema / re / the choices / the grammar /
the tag structure / the biased token), or the request is a 400 naming the field.

The server runs a tiny random model: its free text is noise, so a dropped constraint shows as
an output that does not validate. Outputs cut by max_tokens are checked as prefixes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import regex as partial_re

from tests._runtime_fixtures import smollm_tokenizer
from tests._server_fixtures import shared_server
from tests._structured_fixtures import (
    GBNF,
    GBNF_AS_REGEX,
    LARK,
    TAG_SCHEMA,
    needs_ebnf,
    needs_tags,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "n"],
}
REGEX = r"(red|blue|green)-[0-9]{2,4}"
CHOICES = ["alpha", "beta", "gamma"]
# a tag whose trigger is one token of SmolLM2's vocabulary; a +100 bias on it makes the free
# text fire it at once, and (the JSON mask forbidding it inside the tag) again after each end
TRIGGER = "calc"
SGLANG_TAG = {
    "structures": [{"begin": "calc(", "schema": TAG_SCHEMA, "end": ")"}],
    "triggers": [TRIGGER],
}
XGRAMMAR_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": [TRIGGER],
        "tags": [
            {
                "type": "tag",
                "begin": "calc(",
                "content": {"type": "json_schema", "json_schema": TAG_SCHEMA},
                "end": ")",
            }
        ],
    },
}
TAG_BIAS = {"22966": 100}  # "calc"


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


# ---- checkers: (text, finish_reason) -> None, raising when the output breaks the field -----
def obeys_schema(schema: dict[str, Any]) -> Callable[[str, str], None]:
    def check(text: str, finish: str) -> None:
        if finish == "stop":
            jsonschema.validate(json.loads(text), schema)
        else:
            assert text.startswith("{"), text

    return check


def is_object(text: str, finish: str) -> None:
    if finish == "stop":
        assert isinstance(json.loads(text), dict), text
    else:
        assert text.startswith("{"), text


def matches(pattern: str) -> Callable[[str, str], None]:
    def check(text: str, finish: str) -> None:
        if finish == "stop":
            assert re.fullmatch(pattern, text), text
        else:  # cut by max_tokens: a prefix of a match
            assert partial_re.fullmatch(pattern, text, partial=True), text

    return check


def one_of(choices: list[str]) -> Callable[[str, str], None]:
    def check(text: str, finish: str) -> None:
        assert text in choices if finish == "stop" else any(c.startswith(text) for c in choices)

    return check


def tagged(begin: str, end: str, schema: dict[str, Any]) -> Callable[[str, str], None]:
    """Free text in which each trigger starts `begin` + a JSON value valid for `schema` +
    `end`; at least one tag (the bias fires the trigger); only the last may be cut short."""

    def check(text: str, finish: str) -> None:
        at, tags = 0, 0
        while (start := text.find(TRIGGER, at)) >= 0:
            rest = text[start:]
            try:
                assert rest.startswith(begin), rest
                value, stop = json.JSONDecoder().raw_decode(text, start + len(begin))
                assert text.startswith(end, stop), text[stop:]
            except (AssertionError, ValueError):
                if finish == "length" and len(rest) < len(begin) + 12:
                    break  # the last tag, cut by max_tokens
                raise
            jsonschema.validate(value, schema)
            at, tags = stop + len(end), tags + 1
        assert tags >= 1, text

    return check


TAG_CHECK = tagged("calc(", ")", TAG_SCHEMA)


# ---- the request shapes of /v1 -------------------------------------------------------------
V1_CASES = [
    pytest.param(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": SCHEMA},
            }
        },
        obeys_schema(SCHEMA),
        id="openai-response_format-json_schema",
    ),
    pytest.param({"response_format": {"type": "json_object"}}, is_object, id="openai-json_object"),
    pytest.param({"guided_json": SCHEMA}, obeys_schema(SCHEMA), id="vllm-guided_json"),
    pytest.param(
        {"guided_json": json.dumps(SCHEMA), "guided_decoding_backend": "xgrammar"},
        obeys_schema(SCHEMA),
        id="vllm-guided_json-text-with-backend",
    ),
    pytest.param({"guided_regex": REGEX}, matches(REGEX), id="vllm-guided_regex"),
    pytest.param({"guided_choice": CHOICES}, one_of(CHOICES), id="vllm-guided_choice"),
    pytest.param(
        {"guided_grammar": GBNF},
        matches(GBNF_AS_REGEX),
        id="vllm-guided_grammar",
        marks=needs_ebnf,
    ),  # fmt: skip
    pytest.param({"structured_outputs": {"json": SCHEMA}}, obeys_schema(SCHEMA), id="vllm-so-json"),
    pytest.param({"structured_outputs": {"regex": REGEX}}, matches(REGEX), id="vllm-so-regex"),
    pytest.param({"structured_outputs": {"choice": CHOICES}}, one_of(CHOICES), id="vllm-so-choice"),
    pytest.param(
        {"structured_outputs": {"grammar": GBNF}},
        matches(GBNF_AS_REGEX),
        id="vllm-so-grammar",
        marks=needs_ebnf,
    ),  # fmt: skip
    pytest.param(
        {"structured_outputs": {"json_object": True, "disable_any_whitespace": True}},
        is_object,
        id="vllm-so-json_object",
    ),
    pytest.param(
        {
            "structured_outputs": {"structural_tag": json.dumps(XGRAMMAR_TAG)},
            "logit_bias": TAG_BIAS,
        },
        TAG_CHECK,
        id="vllm-so-structural_tag",
        marks=needs_tags,
    ),
    pytest.param(
        {"response_format": {"type": "structural_tag", **SGLANG_TAG}, "logit_bias": TAG_BIAS},
        TAG_CHECK,
        id="sglang-response_format-structural_tag",
        marks=needs_tags,
    ),
    pytest.param(
        {"response_format": XGRAMMAR_TAG, "logit_bias": TAG_BIAS},
        TAG_CHECK,
        id="xgrammar-response_format-structural_tag",
        marks=needs_tags,
    ),
    pytest.param({"regex": REGEX}, matches(REGEX), id="ours-regex"),
    pytest.param({"json_schema": SCHEMA}, obeys_schema(SCHEMA), id="ours-json_schema"),
    pytest.param({"ebnf": GBNF}, matches(GBNF_AS_REGEX), id="ours-ebnf", marks=needs_ebnf),
]


def _split(extra: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields the openai client takes as arguments, and the rest (its extra_body)."""
    typed = {k: v for k, v in extra.items() if k in ("response_format", "logit_bias")}
    return typed, {k: v for k, v in extra.items() if k not in typed}


@pytest.mark.parametrize(("fields", "check"), V1_CASES)
def test_chat_output_obeys_the_constraint_field(client, model, fields, check):
    typed, extra = _split(fields)
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Answer."}],
        max_tokens=48,
        temperature=0,
        extra_body=extra,
        **typed,
    )
    choice = out.choices[0]
    check(choice.message.content, choice.finish_reason)


@pytest.mark.parametrize(("fields", "check"), V1_CASES)
def test_completion_output_obeys_the_constraint_field(client, model, fields, check):
    typed, extra = _split(fields)
    out = client.completions.create(
        model=model,
        prompt="Answer:",
        max_tokens=48,
        temperature=0,
        extra_body={**extra, **typed},
    )
    choice = out.choices[0]
    check(choice.text, choice.finish_reason)


def test_streamed_chat_obeys_vllm_guided_regex(client, model):
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Colour?"}],
        max_tokens=24,
        temperature=0,
        stream=True,
        extra_body={"guided_regex": REGEX},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    matches(REGEX)(text, finish)


# ---- logit_bias ----------------------------------------------------------------------------
def test_logit_bias_plus_100_makes_the_token_win(client, model, server):
    ids = _completion_ids(server, {"logit_bias": {"42561": 100}})
    assert ids == [42561] * 6


def test_logit_bias_minus_100_bans_the_greedy_token(server):
    first = _completion_ids(server, {})[0]
    banned = _completion_ids(server, {"logit_bias": {str(first): -100}})
    assert first not in banned


def test_logit_bias_cannot_lift_a_token_the_grammar_forbids(client, model):
    # the biased token ("qq") is outside the regex: the mask wins, the output still matches
    out = client.completions.create(
        model=model,
        prompt="Colour:",
        max_tokens=24,
        temperature=0,
        logit_bias={"42561": 100},
        extra_body={"guided_regex": REGEX},
    )
    matches(REGEX)(out.choices[0].text, out.choices[0].finish_reason)


def test_logit_bias_steers_inside_the_grammar(server):
    # "blue" is one of the regex's words: biased, greedy decoding picks it
    blue = _token("blue")
    out = httpx.post(
        f"{server.url}/v1/completions",
        json={
            "prompt": "Colour:",
            "max_tokens": 12,
            "temperature": 0,
            "regex": REGEX,
            "logit_bias": {str(blue): 50},
        },
        timeout=60,
    ).json()
    assert out["choices"][0]["text"].startswith("blue-"), out


def _token(text: str) -> int:
    (token,) = smollm_tokenizer().encode(text, add_special_tokens=False)
    return token


def _completion_ids(server, fields: dict[str, Any]) -> list[int]:
    out = httpx.post(
        f"{server.url}/generate",
        json={
            "text": "The weather today",
            "sampling_params": {
                "max_new_tokens": 6,
                "temperature": 0,
                "ignore_eos": True,
                **fields,
            },  # fmt: skip
        },
        timeout=60,
    )
    assert out.status_code == 200, out.text
    return out.json()["output_ids"]


# ---- refusals that name the field ----------------------------------------------------------
REFUSED = [
    pytest.param(
        "/v1/chat/completions",
        {"guided_json": SCHEMA, "response_format": {"type": "json_object"}},
        ["guided_json", "response_format"],
        id="two-constraints-chat",
    ),
    pytest.param(
        "/v1/completions",
        {"guided_regex": "a+", "structured_outputs": {"choice": ["a"]}},
        ["guided_regex", "structured_outputs.choice"],
        id="two-constraints-completions",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"structured_outputs": {"regex": "a", "json": SCHEMA}},
        ["structured_outputs.json", "structured_outputs.regex"],
        id="two-in-structured_outputs",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"structured_outputs": {"jsonn": SCHEMA}},
        ["structured_outputs.jsonn"],
        id="unknown-structured_outputs-key",
    ),
    pytest.param(
        "/v1/completions", {"logit_bias": {"999999999": 1}}, ["logit_bias"], id="bias-bad-id"
    ),
    pytest.param(
        "/v1/chat/completions", {"logit_bias": {"5": 101}}, ["logit_bias"], id="bias-too-big"
    ),
    pytest.param("/v1/completions", {"logit_bias": {"x": 1}}, ["logit_bias"], id="bias-not-an-id"),
    pytest.param(
        "/v1/chat/completions",
        {"guided_choice": []},
        ["guided_choice"],
        id="empty-guided_choice",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"response_format": {"type": "structural_tag"}},
        ["response_format"],
        id="structural_tag-without-format",
    ),
    pytest.param(
        "/generate",
        {"sampling_params": {"regex": "a", "ebnf": GBNF}},
        ["regex", "ebnf"],
        id="generate-two-constraints",
    ),
    pytest.param(
        "/generate",
        {"sampling_params": {"logit_bias": {"-3": 5}}},
        ["logit_bias"],
        id="generate-bias-bad-id",
    ),
]


@pytest.mark.parametrize(("path", "fields", "named"), REFUSED)
def test_a_field_that_cannot_be_honoured_is_a_400_naming_it(server, path, fields, named):
    body: dict[str, Any] = {"max_tokens": 4, **fields}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "x"}]
    elif path == "/v1/completions":
        body["prompt"] = "x"
    else:
        body = {"text": "x", **fields}
    r = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    for name in named:
        assert name in error["message"], error
    assert error["param"] in named, error


def test_a_constraint_kind_missing_from_the_grammar_build_is_a_400_naming_the_field(
    monkeypatch,
):
    import grammar
    from runtime.server.errors import APIError
    from runtime.server.structured import require_compiler

    monkeypatch.delattr(grammar, "compile_ebnf", raising=False)
    with pytest.raises(APIError) as err:
        require_compiler("ebnf", "guided_grammar")
    assert err.value.status == 400 and err.value.param == "guided_grammar"


# ---- /generate (SGLang's native API) -------------------------------------------------------
NATIVE_CASES = [
    pytest.param({"json_schema": json.dumps(SCHEMA)}, obeys_schema(SCHEMA), id="json_schema"),
    pytest.param({"regex": REGEX}, matches(REGEX), id="regex"),
    pytest.param({"ebnf": GBNF}, matches(GBNF_AS_REGEX), id="ebnf-gbnf", marks=needs_ebnf),
    pytest.param(
        {"structural_tag": json.dumps(SGLANG_TAG), "logit_bias": TAG_BIAS},
        TAG_CHECK,
        id="structural_tag-sglang",
        marks=needs_tags,
    ),
    pytest.param(
        {"structural_tag": XGRAMMAR_TAG, "logit_bias": TAG_BIAS},
        TAG_CHECK,
        id="structural_tag-xgrammar",
        marks=needs_tags,
    ),
    pytest.param(
        {"lark": LARK},
        matches(GBNF_AS_REGEX),
        id="lark",
    ),
]


@pytest.mark.parametrize(("fields", "check"), NATIVE_CASES)
def test_generate_output_obeys_the_constraint_field(server, fields, check):
    r = httpx.post(
        f"{server.url}/generate",
        json={
            "text": "Answer:",
            "sampling_params": {"max_new_tokens": 48, "temperature": 0, **fields},
        },  # fmt: skip
        timeout=60,
    )
    assert r.status_code == 200, r.text
    out = r.json()
    check(out["text"], out["meta_info"]["finish_reason"]["type"])
