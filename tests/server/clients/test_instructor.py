"""instructor, unchanged, against the default-model server: JSON_SCHEMA mode (response_format) and
TOOLS mode (a named tool whose parameters are the nested model), whole answers, lists of records
(`create_iterable`) and partial streaming. Every answer must parse into its nested model."""

from __future__ import annotations

import openai
import pytest

from tests.support.extraction import PROMPT, Person, Team

instructor = pytest.importorskip("instructor")

MESSAGES = [{"role": "user", "content": PROMPT}]
JSON_SCHEMA = instructor.Mode.JSON_SCHEMA
# TOOLS sends the model as a named tool, not strict, with `$defs` in its parameters
TOOLS = instructor.Mode.TOOLS


@pytest.fixture(scope="module")
def client(default_server):
    return openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def _create(client, mode, method, **kw):
    patched = instructor.from_openai(client, mode=mode)
    return getattr(patched.chat.completions, method)(
        messages=MESSAGES, max_retries=0, temperature=0, **kw
    )


@pytest.mark.parametrize("mode", [JSON_SCHEMA, TOOLS])
@pytest.mark.parametrize("response_model", [Person, Team])
def test_nested_model_parses(client, model, mode, response_model):
    out = _create(
        client, mode, "create", model=model, response_model=response_model, max_tokens=160
    )
    assert isinstance(out, response_model)


@pytest.mark.parametrize("mode", [JSON_SCHEMA, TOOLS])
def test_iterable_extraction_yields_whole_records(client, model, mode):
    people = list(
        _create(client, mode, "create_iterable", model=model, response_model=Person, max_tokens=160)
    )
    assert people and all(isinstance(p, Person) for p in people)


@pytest.mark.parametrize("mode", [JSON_SCHEMA, TOOLS])
def test_partial_streaming_ends_in_a_whole_record(client, model, mode):
    partials = list(
        _create(client, mode, "create_partial", model=model, response_model=Team, max_tokens=160)
    )
    assert len(partials) > 1
    # every partial is a snapshot of one growing object; the last one is the whole answer
    Team.model_validate(partials[-1].model_dump())
