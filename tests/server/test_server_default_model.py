"""The server on the real default model (SmolLM2-135M-Instruct): answers that mean something."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.support.server_process import constrained_decoding_available

pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def client(default_server):
    return openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="x", max_retries=0)


def test_default_model_answers_a_question(client):
    out = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    assert "Paris" in out.choices[0].message.content
    assert out.choices[0].finish_reason in ("stop", "length")


@pytest.mark.xfail(
    not constrained_decoding_available(),
    reason="this engine has no constrained decoding",
    strict=False,
)
def test_default_model_json_schema_answer_validates(client):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "country": {"type": "string", "maxLength": 30},
        },
        "required": ["city", "country"],
    }
    out = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "Name the capital of France and its country."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    value = json.loads(out.choices[0].message.content)
    jsonschema.validate(value, schema)
