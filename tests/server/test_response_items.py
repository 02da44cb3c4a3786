"""The Responses API's pieces without a server: chat deltas into output items and their events,
the request read as a chat request, and the bounded store of responses."""

from __future__ import annotations

import pytest

from runtime.server.errors import APIError
from runtime.server.response_store import ResponseStore, StoredResponse
from runtime.server.responses_input import ResponsesRequest, to_chat, to_messages
from runtime.server.responses_output import ResponseItems

DELTAS = [
    {"reasoning_content": "Think"},
    {"reasoning_content": "ing."},
    {"content": "Let me "},
    {"content": "look."},
    {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                     "function": {"name": "f", "arguments": ""}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
    {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                     "function": {"name": "g", "arguments": "{}"}}]},
]  # fmt: skip


def _run(deltas, reason="stop"):
    items = ResponseItems({"id": "resp_1", "object": "response"})
    events = items.start()
    for d in deltas:
        events += items.feed(d)
    events += items.finish(reason, {"input_tokens": 1})
    return items, events


def test_deltas_become_items_in_order():
    items, _ = _run(DELTAS)
    out = items.response["output"]
    assert [i["type"] for i in out] == ["reasoning", "message", "function_call", "function_call"]
    assert out[0]["content"] == [{"type": "reasoning_text", "text": "Thinking."}]
    assert out[1]["content"][0]["text"] == "Let me look."
    assert (out[2]["call_id"], out[2]["name"], out[2]["arguments"]) == ("call_a", "f", '{"x": 1}')
    assert out[3]["arguments"] == "{}"
    assert items.response["status"] == "completed" and all(i["status"] == "completed" for i in out)


def test_events_are_numbered_and_each_item_opens_and_closes():
    items, events = _run(DELTAS)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"]["id"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [i["id"] for i in items.output]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    # an item is done before the next is added
    for i, kind in enumerate(kinds):
        if kind == "response.output_item.added" and i > 2:
            assert kinds[i - 1] == "response.output_item.done"
    [args_done] = [e for e in events if e["type"] == "response.function_call_arguments.done"
                   and e["name"] == "f"]  # fmt: skip
    assert args_done["arguments"] == '{"x": 1}'


def test_a_cut_answer_is_incomplete_and_an_empty_one_has_its_message():
    items, events = _run([{"content": "abc"}], reason="length")
    assert items.response["status"] == "incomplete"
    assert items.response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-1]["type"] == "response.incomplete"
    assert items.output[0]["status"] == "incomplete"
    items, _ = _run([])
    assert [i["type"] for i in items.output] == ["message"]


def test_input_items_become_chat_messages():
    messages = to_messages([
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Calling.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
    ])  # fmt: skip
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "Calling."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "one"}


def test_the_request_as_a_chat_request():
    body = ResponsesRequest(
        input="Hi", instructions="Be brief.", max_output_tokens=9, temperature=0.5,
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "f"},
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    )  # fmt: skip
    chat = to_chat(body, [{"type": "message", "role": "user", "content": "Earlier"}])
    assert [m.role for m in chat.messages] == ["system", "user", "user"]
    assert chat.max_completion_tokens == 9 and chat.temperature == 0.5
    assert chat.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert chat.response_format.json_schema.schema_ == {"type": "object"}


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
         "input.0.content.0.type"),
        ({"type": "computer_call_output"}, "input.0.type"),
        ({"type": "function_call", "name": "f"}, "input.0.call_id"),
        ({"role": "tool", "content": "x"}, "input.0.role"),
    ],
)  # fmt: skip
def test_input_items_that_are_not_read_are_400_naming_them(item, param):
    with pytest.raises(APIError) as err:
        to_messages([item])
    assert err.value.status == 400 and err.value.param == param


def test_the_store_drops_the_least_recently_used():
    store = ResponseStore(capacity=2)
    for rid in ("a", "b"):
        store.put(StoredResponse({"id": rid}, [], []))
    assert store.get("a") is not None  # a used: b is now the oldest
    store.put(StoredResponse({"id": "c"}, [], []))
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    assert store.delete("a") and not store.delete("a")
    with pytest.raises(ValueError):
        ResponseStore(capacity=0)
