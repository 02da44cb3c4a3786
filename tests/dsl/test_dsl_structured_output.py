"""`gen(..., ebnf=..., structural_tag=...)` and `Engine.generate(..., logit_bias=...)` on each
backend: in-process (a tiny random Llama), `RuntimeEndpoint` and `sgl.OpenAI` (the shared test
server). The model's text is noise, so an output that parses proves the constraint held."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

import sgl_dsl as sgl
from benchmarks.serving.structured_output import GBNF, GBNF_AS_REGEX, LARK, TAG_SCHEMA
from tests.support.marks import needs_ebnf, needs_tags
from tests.support.server_process import shared_server

WHOLE_TAG = {  # XGrammar's shape: the whole output is one tag
    "type": "structural_tag",
    "format": {
        "type": "tag",
        "begin": "<r>",
        "content": {"type": "json_schema", "json_schema": TAG_SCHEMA},
        "end": "</r>",
    },
}


def _is_whole_tag(text: str) -> None:
    assert text.startswith("<r>") and text.endswith("</r>"), text
    jsonschema.validate(json.loads(text[3:-4]), TAG_SCHEMA)


@sgl.function
def greet(s, options):
    s += "Greeting: " + sgl.gen("out", max_tokens=24, temperature=0, **options)


@pytest.fixture(scope="module")
def endpoint():
    return sgl.RuntimeEndpoint(shared_server().url)


@pytest.fixture(scope="module")
def openai_backend(endpoint):
    model = endpoint.model_info["served_model_name"]
    url = shared_server().url + "/v1"
    return sgl.OpenAI(model, base_url=url, api_key="unused", is_chat_model=False)


BACKENDS = ["runtime", "endpoint", "openai_backend"]


@needs_ebnf
@pytest.mark.parametrize("backend", BACKENDS)
def test_gen_ebnf_obeys_the_gbnf_grammar(request, backend):
    state = greet.run(options={"ebnf": GBNF}, backend=request.getfixturevalue(backend))
    assert re.fullmatch(GBNF_AS_REGEX, state["out"]), state["out"]


@needs_tags
@pytest.mark.parametrize("backend", BACKENDS)
def test_gen_structural_tag_obeys_the_tag(request, backend):
    state = greet.run(
        options={"structural_tag": WHOLE_TAG}, backend=request.getfixturevalue(backend)
    )
    _is_whole_tag(state["out"])


@pytest.mark.parametrize("backend", ["runtime", "endpoint"])
def test_gen_grammar_is_lark_on_every_backend(request, backend):
    state = greet.run(options={"grammar": LARK}, backend=request.getfixturevalue(backend))
    assert re.fullmatch(GBNF_AS_REGEX, state["out"]), state["out"]


def test_gen_takes_one_constraint():
    with pytest.raises(sgl.ProgramError, match="at most one"):
        sgl.gen("x", regex="a", ebnf=GBNF)
    with pytest.raises(sgl.ProgramError, match="structural_tag"):
        sgl.gen("x", structural_tag="{not json")


def test_engine_logit_bias_wins_unless_the_grammar_forbids(runtime):
    engine = runtime.engine
    plain = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    out = engine.generate("The weather", logit_bias={42561: 100}, **plain)
    assert out.token_ids == [42561] * 5
    # the same bias under a regex that does not allow that token: the mask wins
    out = engine.generate("The weather", logit_bias={42561: 100}, regex="(yes|no)", **plain)
    assert out.text in ("yes", "no")
    with pytest.raises(ValueError, match="logit_bias"):
        engine.generate("x", logit_bias={10**9: 1.0}, **plain)
    with pytest.raises(ValueError, match="logit_bias"):
        engine.generate("x", logit_bias={5: 200.0}, **plain)


def test_endpoint_refuses_an_answer_generated_without_its_constraint():
    from sgl_dsl.backend.endpoint import _check_constraint_reached

    _check_constraint_reached({"grammar": LARK}, {"constraint": "lark"})
    _check_constraint_reached({"max_tokens": 4}, {})
    with pytest.raises(sgl.BackendError, match="ebnf"):
        _check_constraint_reached({"grammar": LARK}, {"finish_reason": {"type": "stop"}})
    with pytest.raises(sgl.BackendError, match="structural_tag"):
        _check_constraint_reached({"structural_tag": "{}"}, {})
