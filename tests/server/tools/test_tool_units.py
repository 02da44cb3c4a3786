"""The pieces of tool calling that need no server: streaming a growing answer as OpenAI's
`tool_calls` deltas, reading calls back, rendering tool turns with or without a template that
knows them, and the `json_schema_mode` switch through the engine and `sgl.gen`."""

from __future__ import annotations

import json

import pytest

from runtime.server.chat import ChatRequest, render_prompt, renders_tool_calls
from runtime.server.tools.json_calls import JsonCallsParser
from runtime.server.tools.parser import CallStreamer
from runtime.server.tools.registry import get_parser
from runtime.server.tools.request import parse_tools

TOOLS = parse_tools(
    [
        {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "b"}},
    ]
)
ANSWER = '[{"name":"a","arguments":{"x":"}{\\"[","n":[1,{"y":2}]}}, {"name":"b","arguments":{}}]'


@pytest.mark.parametrize("step", [1, 3, 7, len(ANSWER)])
def test_call_stream_rebuilds_every_call_from_any_split(step):
    stream, calls = CallStreamer(JsonCallsParser()), {}
    for end in range(step, len(ANSWER) + step, step):
        for delta in stream.feed(ANSWER[:end], final=end >= len(ANSWER)):
            (d,) = delta["tool_calls"]
            if "id" in d:
                assert d["function"]["arguments"] == "" and d["type"] == "function"
                calls[d["index"]] = [d["function"]["name"], ""]
            else:
                assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
                calls[d["index"]][1] += d["function"]["arguments"]
    assert [c[0] for c in calls.values()] == ["a", "b"]
    assert json.loads(calls[0][1]) == {"x": '}{"[', "n": [1, {"y": 2}]}
    assert json.loads(calls[1][1]) == {}


def test_scan_on_partial_and_single_answers():
    def scan(text):
        return [(c.name, c.arguments) for c in JsonCallsParser().scan(text).calls]

    assert scan("") == [] and scan('{"na') == [(None, "")]
    assert scan('{"name":"a","arguments":{"x":1') == [("a", '{"x":1')]
    assert scan('{"name":"a","arguments":{}}') == [("a", "{}")]


def test_parse_single_list_and_rejects():
    parser = get_parser("json")
    _, (one,) = parser.parse('{"name":"a","arguments":{"x":1}}', TOOLS)
    assert json.loads(one["function"]["arguments"]) == {"x": 1}
    assert len(parser.parse(ANSWER, TOOLS)[1]) == 2
    for bad in ('{"name":"c","arguments":{}}', "[]", "hi", '{"name":"a",'):
        assert parser.parse(bad, TOOLS) == (bad, [])


HISTORY = {
    "messages": [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny-42"},
    ],
    "tools": [{"type": "function", "function": {"name": "a"}}],
}
# a template that knows tool calls (the shape of Qwen's / Hermes' templates, shortened)
TOOL_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}</call>{% endfor %}{% endif %}"
    "{{ m.content or '' }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class _Tok:
    def __init__(self, template):
        from tests.support.tokenizers import smollm2_tokenizer

        self.inner = smollm2_tokenizer()
        self.chat_template = template

    def apply_chat_template(self, messages, **kw):
        return self.inner.apply_chat_template(messages, chat_template=self.chat_template, **kw)


def _request():
    body = ChatRequest.model_validate(HISTORY)
    body.prepare()
    return body


def test_template_with_tool_calls_gets_them_natively():
    tok = _Tok(TOOL_TEMPLATE)
    assert renders_tool_calls(tok)
    prompt = render_prompt(tok, _request())
    assert "<call>a{}</call>" in prompt and "<|tool|>sunny-42" in prompt


def test_template_without_tool_calls_gets_json_and_a_user_turn():
    from tests.support.tokenizers import smollm2_tokenizer

    tok = smollm2_tokenizer()
    assert not renders_tool_calls(tok)
    prompt = render_prompt(tok, _request())
    assert '{"name": "a", "arguments": {}}' in prompt
    assert "Tool result (a): sunny-42" in prompt


def test_sgl_gen_carries_the_mode():
    import sgl_dsl as sgl

    g = sgl.gen("x", json_schema={"type": "object"}, json_schema_mode="exact")
    assert g.params["json_schema_mode"] == "exact"
    assert "json_schema_mode" not in sgl.gen("y", json_schema={"type": "object"}).params


def test_engine_mode_is_checked(monkeypatch):
    from runtime.scheduling.constrained import ConstraintHooks

    hooks = ConstraintHooks(None, (), json_schema_mode="exact")
    assert hooks.json_schema_mode == "exact"
    with pytest.raises(ValueError, match="json_schema_mode"):
        hooks.attach(object(), json_schema={"type": "object"}, json_schema_mode="loose")
