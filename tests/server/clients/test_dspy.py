"""DSPy, unchanged, against the default-model server. DSPy sends a `response_format` only to a
provider it knows supports one, so the server is declared the way DSPy's docs say (a chat
provider with `ModelSupport(response_schema=True)`); then its JSONAdapter sends the signature's
outputs as a JSON Schema and the ChatAdapter falls back to that when its own field markers do not
parse. On a provider DSPy does not know, nothing constraining is sent (docs/compatibility.md)."""

from __future__ import annotations

import os

import pytest

from tests.support.extraction import Address

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost map download
dspy = pytest.importorskip("dspy")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

from dspy.lm15 import (  # noqa: E402
    AccessPolicy,
    ModelSupport,
    OpenAIChatCompat,
    ProviderDefinition,
    register_provider,
    unregister_provider,
)

PROVIDER = "sgl-test-server"
TEXT = "Alice, 34, lives in Paris, France."


class Extract(dspy.Signature):
    """Extract the person from the text."""

    text: str = dspy.InputField()
    name: str = dspy.OutputField()
    age: int = dspy.OutputField()
    address: Address = dspy.OutputField()


@pytest.fixture(scope="module")
def served(default_server):
    import httpx

    url = f"{default_server.url}/v1"
    name = httpx.get(f"{url}/models").json()["data"][0]["id"]
    return url, name


@pytest.fixture(scope="module")
def declared_lm(served):
    url, name = served
    definition = ProviderDefinition.chat(
        AccessPolicy(provider=PROVIDER, base_url=url),
        compat=OpenAIChatCompat.preset("openai"),
        placeholder_key="unused",
    )
    register_provider(definition, supports=ModelSupport(response_schema=True), replace=True)
    try:
        yield dspy.LM(
            f"{PROVIDER}/{name}", api_base=url, temperature=0, max_tokens=120, cache=False
        )
    finally:
        unregister_provider(PROVIDER)


def _predict(lm, adapter):
    with dspy.context(lm=lm, adapter=adapter):
        return dspy.Predict(Extract)(text=TEXT)


def _check(prediction):
    assert isinstance(prediction.name, str)
    assert isinstance(prediction.age, int)
    assert isinstance(prediction.address, Address)


def test_json_adapter_sends_the_schema_and_parses(declared_lm):
    _check(_predict(declared_lm, dspy.JSONAdapter()))
    assert "response_format" in declared_lm.history[-1]["kwargs"]


def test_chat_adapter_parses(declared_lm):
    _check(_predict(declared_lm, dspy.ChatAdapter()))


def test_unknown_provider_gets_no_response_format(served):
    url, name = served
    lm = dspy.LM(
        f"openai/{name}", api_base=url, api_key="unused", temperature=0, max_tokens=8, cache=False
    )
    try:
        _predict(lm, dspy.JSONAdapter())
    except dspy.AdapterParseError:  # eight tokens parse into nothing; the request is checked
        pass
    assert lm.history and "response_format" not in lm.history[-1]["kwargs"]
