"""outlines, unchanged, against the default-model server through an `openai` client: its OpenAI
model (JSON Schema output types as `response_format`, whole and streamed) and its vLLM and SGLang
models on the same client, which send regexes, choices and grammars as those servers' extra
fields. Every answer must match what was asked for."""

from __future__ import annotations

import re
from typing import Literal

import openai
import pytest

from tests.support.extraction import PROMPT, Team

outlines = pytest.importorskip("outlines")

from outlines.types import CFG, Regex  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # outlines: CFG is not lark here


@pytest.fixture(scope="module")
def client(default_server):
    return openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model_name(client):
    return client.models.list().data[0].id


def test_openai_model_json_schema_output(client, model_name):
    model = outlines.from_openai(client, model_name)
    Team.model_validate_json(model(PROMPT, Team, max_tokens=160, temperature=0))


def test_openai_model_streamed_json_schema_output(client, model_name):
    model = outlines.from_openai(client, model_name)
    pieces = list(model.stream(PROMPT, Team, max_tokens=160, temperature=0))
    assert len(pieces) > 1
    Team.model_validate_json("".join(pieces))


@pytest.mark.parametrize(
    "output_type, pattern",
    [
        (Literal["yes", "no"], r"yes|no"),
        (Regex(r"[0-9]{3}-[A-Z]{2}"), r"[0-9]{3}-[A-Z]{2}"),
        (CFG('root ::= ("yes" | "no") "."'), r"(yes|no)\."),
    ],
    ids=["choice", "regex", "gbnf"],
)
@pytest.mark.parametrize("server_kind", ["vllm", "sglang"])
def test_server_models_honour_regex_choice_and_grammar(
    client, model_name, server_kind, output_type, pattern
):
    model = getattr(outlines, f"from_{server_kind}")(client, model_name)
    out = model("Answer.", output_type, max_tokens=12, temperature=0)
    assert re.fullmatch(pattern, out)
