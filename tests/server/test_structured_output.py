"""Every request field that constrains output, as each kind of client sends it, against a real
server: the output obeys the field (checked with jsonschema / re / the choices / the grammar /
the tag structure / the biased token), or the request is a 400 naming the field.

The server runs a tiny random model: its free text is noise, so a dropped constraint shows as
an output that does not validate. Outputs cut by max_tokens are checked as prefixes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from benchmarks.serving.structured_output import (
    BIASED_TOKEN,
    GBNF,
    NATIVE,
    REGEX,
    SCHEMA,
    V1,
    matches,
    obeys_schema,
)
from tests.support.marks import needs_ebnf, needs_tags
from tests.support.tiny_models import smollm_tokenizer


# ---- the request shapes of /v1 -------------------------------------------------------------
def _marks(fields: dict[str, Any]) -> list[pytest.MarkDecorator]:
    text = json.dumps(fields)
    marks = [needs_ebnf] if json.dumps(GBNF)[1:-1] in text else []
    return marks + ([needs_tags] if "structural_tag" in text else [])


V1_CASES = [pytest.param(f, check, id=name, marks=_marks(f)) for name, f, check in V1]


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


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"guided_json": SCHEMA, "guided_whitespace_pattern": " "}, id="vllm"),
        pytest.param(
            {"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " "}}, id="vllm-0.12"
        ),
    ],
)
def test_whitespace_pattern_is_the_whitespace_between_json_tokens(client, model, fields):
    out = client.completions.create(
        model=model, prompt="Answer:", max_tokens=48, temperature=0, extra_body=fields
    )
    text, finish = out.choices[0].text, out.choices[0].finish_reason
    assert text.startswith('{ "name" : "'), text  # compact output would be '{"name":"'
    if finish == "stop":
        obeys_schema(SCHEMA)(text, finish)


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
    ids = _completion_ids(server, {"logit_bias": {str(BIASED_TOKEN): 100}})
    assert ids == [BIASED_TOKEN] * 6


def test_logit_bias_minus_100_bans_the_greedy_token(server):
    first = _completion_ids(server, {})[0]
    banned = _completion_ids(server, {"logit_bias": {str(first): -100}})
    assert first not in banned


def test_logit_bias_cannot_lift_a_token_the_grammar_forbids(client, model):
    # the biased token is outside the regex: the mask wins, the output still matches
    out = client.completions.create(
        model=model,
        prompt="Colour:",
        max_tokens=24,
        temperature=0,
        logit_bias={str(BIASED_TOKEN): 100},
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
        "/v1/chat/completions",
        {
            "guided_grammar": GBNF,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        },
        ["guided_grammar", "tools"],
        id="gbnf-with-auto-tools",
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
NATIVE_CASES = [pytest.param(f, check, id=name, marks=_marks(f)) for name, f, check in NATIVE]


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
