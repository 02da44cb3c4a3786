"""LiteLLM's `completion` against a real server (tiny random model): tools, a pydantic
`response_format`, streaming (text and tool calls)."""

from __future__ import annotations

import json
import os
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.support.server_process import shared_server

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost map download
litellm = pytest.importorskip("litellm")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # litellm's own TypedDicts

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]


class Forecast(BaseModel):
    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]


@pytest.fixture(scope="module")
def kw():
    import httpx

    server = shared_server()
    name = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    return {
        "model": f"openai/{name}",
        "api_base": f"{server.url}/v1",
        "api_key": "unused",
        "temperature": 0,
        "max_tokens": 80,
        "num_retries": 0,
    }


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_completion_with_forced_tools(kw, choice):
    out = litellm.completion(messages=MESSAGES, tools=[WEATHER], tool_choice=choice, **kw)
    assert out.choices[0].finish_reason == "tool_calls"
    for call in out.choices[0].message.tool_calls:
        assert call.function.name == "get_weather" and call.id
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_completion_with_auto_tools(kw):
    out = litellm.completion(messages=MESSAGES, tools=[WEATHER], **kw)
    message = out.choices[0].message
    if message.tool_calls:
        for call in message.tool_calls:
            params = WEATHER["function"]["parameters"]
            jsonschema.validate(json.loads(call.function.arguments), params)
    else:
        assert isinstance(message.content, str)


def test_response_format_pydantic_model(kw):
    out = litellm.completion(messages=MESSAGES, response_format=Forecast, **kw)
    Forecast.model_validate_json(out.choices[0].message.content)


def test_streaming_text_and_tool_calls(kw):
    text = "".join(
        c.choices[0].delta.content or ""
        for c in litellm.completion(messages=MESSAGES, stream=True, **kw)
    )
    assert text
    stream = litellm.completion(
        messages=MESSAGES, tools=[WEATHER], tool_choice="required", stream=True, **kw
    )
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in stream:
        reasons.append(chunk.choices[0].finish_reason)
        for d in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"name": None, "arguments": ""})
            if d.function.name:
                entry["name"] = d.function.name
            entry["arguments"] += d.function.arguments or ""
    assert "tool_calls" in reasons and calls
    for call in calls.values():
        assert call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])
