"""OpenAI's Responses API through the `openai` client (and raw HTTP for the wire format) against
the tiny-model server: output items, usage, the streamed event sequence the SDK accumulates,
tools with nested parameters under every tool_choice, `text.format`, the stored responses
(`previous_response_id`, GET, DELETE), and the fields refused by name. The model is random:
the checks are on the protocol and on constrained output, which must validate."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.tools.test_nested_schemas import BADGE, PEOPLE
from tests.support.tool_servers import template_server

TOOLS = [
    {"type": "function", "name": "save_people", "parameters": PEOPLE, "strict": True},
    {"type": "function", "name": "badge", "parameters": BADGE, "strict": True},
]
SCHEMAS = {"save_people": PEOPLE, "badge": BADGE}


class Person(BaseModel):  # bounded: a random model's answer ends within max_output_tokens
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)


class People(BaseModel):
    people: list[Person] = Field(max_length=2)


def _events(server, body: dict) -> list[dict]:
    """The SSE events of a streamed request, as (event name, data) checked to agree."""
    events = []
    with httpx.stream("POST", f"{server.url}/v1/responses", json={**body, "stream": True},
                      timeout=120) as r:  # fmt: skip
        assert r.status_code == 200
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                assert data["type"] == name
                events.append(data)
    return events


def test_text_answer_items_and_usage(client, model):
    r = client.responses.create(model=model, input="Say hi.", max_output_tokens=8)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    [message] = r.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text" and r.output_text == message.content[0].text
    u = r.usage
    assert u.output_tokens == 8 and u.input_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0
    assert u.output_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "badge"}])
def test_function_calls_with_nested_parameters_validate(client, model, choice, parallel):
    r = client.responses.create(
        model=model, input="Save Ann, 30.", tools=TOOLS, tool_choice=choice,
        parallel_tool_calls=parallel, max_output_tokens=150,
    )  # fmt: skip
    calls = [o for o in r.output if o.type == "function_call"]
    if r.status == "incomplete":  # cut inside a call: no call item, the text as a message
        return
    assert calls and r.status == "completed"
    for c in calls:
        assert c.call_id.startswith("call_") and c.id.startswith("fc_")
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
    if isinstance(choice, dict) or not parallel:
        assert len(calls) == 1
    if isinstance(choice, dict):
        assert calls[0].name == "badge"


def test_auto_answers_with_calls_or_text(client, model):
    for seed in (0, 1, 2):
        r = client.responses.create(
            model=model, input="Save Ann, 30.", tools=TOOLS, max_output_tokens=60,
            extra_body={"seed": seed},
        )  # fmt: skip
        for item in r.output:
            if item.type == "function_call":
                jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])
            else:
                assert item.type == "message"


def test_stream_events_in_order_and_the_sdk_accumulates_them(server, client, model):
    body = {"model": model, "input": "Save Ann, 30.", "tools": TOOLS,
            "tool_choice": "required", "max_output_tokens": 150}  # fmt: skip
    events = _events(server, body)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    final = events[-1]["response"]
    args: dict[str, str] = {}
    for e in events:
        if e["type"] == "response.function_call_arguments.delta":
            args[e["item_id"]] = args.get(e["item_id"], "") + e["delta"]
        if e["type"] == "response.function_call_arguments.done":
            assert e["arguments"] == args.get(e["item_id"], "")
            assert final["output"][e["output_index"]]["arguments"] == e["arguments"]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == list(range(len(final["output"])))
    assert [e["item"] for e in done] == final["output"]
    with client.responses.stream(**body) as stream:
        for _ in stream:
            pass
        if stream.get_final_response().status == "completed":
            for call in stream.get_final_response().output:
                jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_streamed_text_has_its_part_and_text_events(server, model):
    events = _events(server, {"model": model, "input": "Hi", "max_output_tokens": 6})
    kinds = [e["type"] for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    [text_done] = [e for e in events if e["type"] == "response.output_text.done"]
    assert text_done["text"] == deltas == events[-1]["response"]["output"][0]["content"][0]["text"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]  # fmt: skip


def test_text_format_json_schema_parses_streamed_or_not(client, model):
    parsed = client.responses.parse(
        model=model, input="Ann is 3.", text_format=People, max_output_tokens=200
    )
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, People)
    with client.responses.stream(
        model=model, input="Bo is 4.", text_format=People, max_output_tokens=200
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    jsonschema.validate(json.loads(final.output_text), People.model_json_schema())


def test_json_object_format(client, model):
    r = client.responses.create(
        model=model, input="JSON please", text={"format": {"type": "json_object"}},
        max_output_tokens=120,
    )  # fmt: skip
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)


def test_a_tool_round_trip_through_input_items(client, model):
    first = client.responses.create(
        model=model, input="Save Ann, 30.", tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=150,
    )  # fmt: skip
    [call] = [o for o in first.output if o.type == "function_call"]
    second = client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Save Ann, 30."}]},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "saved"},
        ],
        tools=TOOLS, max_output_tokens=8,
    )  # fmt: skip
    assert second.status in ("completed", "incomplete")


def test_previous_response_id_continues_from_the_stored_conversation(client, model):
    first = client.responses.create(model=model, input="Name a city.", max_output_tokens=6)
    again = client.responses.create(
        model=model, previous_response_id=first.id, input="And another?", max_output_tokens=6
    )
    assert again.previous_response_id == first.id
    # the first turn's prompt and answer are in the radix cache
    assert again.usage.input_tokens_details.cached_tokens > 0
    assert again.usage.input_tokens > first.usage.input_tokens
    items = client.responses.input_items.list(again.id).data
    assert len(items) == 3  # the first input, its answer, the new input
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=model, previous_response_id=first.id, input="x")
    assert err.value.body["param"] == "previous_response_id"


def test_store_false_is_not_kept(client, model):
    r = client.responses.create(model=model, input="Hi", max_output_tokens=2, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"include": ["file_search_call.results"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"background": True}, "background"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input.0.content.0.type"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
         "messages.0.tool_call_id"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {
            "type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}}]},
         "tools.0.function.parameters"),
    ],
)  # fmt: skip
def test_what_is_not_implemented_is_a_400_naming_it(server, model, extra, param):
    body = {"model": model, "input": "Hi", "max_output_tokens": 2, **extra}
    r = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_accepted_fields_that_change_nothing(server, model):
    body = {"model": model, "input": "Hi", "max_output_tokens": 2, "include": [],
            "truncation": "disabled", "metadata": {"k": "v"}, "user": "u",
            "service_tier": "auto", "prompt_cache_key": "p", "safety_identifier": "s",
            "max_tool_calls": 3, "reasoning": {"effort": "none"}}  # fmt: skip
    r = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["metadata"] == {"k": "v"}


def test_reasoning_items_with_a_reasoning_parser():
    srv = template_server("think", "--reasoning-parser", "deepseek-r1")
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    schema = People.model_json_schema()
    fmt = {"format": {"type": "json_schema", "name": "people", "schema": schema}}
    r = client.responses.create(model=model, input="Ann is 3.", text=fmt, max_output_tokens=120,
                                reasoning={"effort": "medium"})  # fmt: skip
    kinds = [o.type for o in r.output]
    assert kinds[0] == "reasoning" and r.output[0].content[0].type == "reasoning_text"
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    if r.status == "completed":
        jsonschema.validate(json.loads(r.output_text), schema)
    # the reasoning item of an earlier turn is accepted as input (and not rendered)
    again = client.responses.create(model=model, previous_response_id=r.id, input="More?",
                                    max_output_tokens=4)  # fmt: skip
    assert again.status in ("completed", "incomplete")
