"""Every tool-call parser over hand-written answers in its family's format: finished answers,
the same answers streamed in every split of the text, parallel calls, malformed calls."""

from __future__ import annotations

import json
import zlib

import pytest

from runtime.server.protocol import Tool
from runtime.server.tools.parser import CallStreamer
from runtime.server.tools.registry import get_parser, parser_for_template
from runtime.server.tools.scan import python_literal

TOOLS = [
    Tool.model_validate({"function": {"name": n, "parameters": {"type": "object"}}})
    for n in ("get_weather", "get_time")
]
W = {"city": "Oslo", "unit": "c"}
T = {"zone": "UTC"}
DS_B, DS_E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CB, DS_CE, DS_S = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _ds(name: str, args: dict) -> str:
    return f"{DS_CB}function{DS_S}{name}\n```json\n{json.dumps(args)}\n```{DS_CE}"


def _hermes(name: str, args: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


# (parser, answer, content, calls)
CASES = [
    ("hermes", "Sure.\n" + _hermes("get_weather", W), "Sure.", [("get_weather", W)]),
    ("hermes", _hermes("get_weather", W) + "\n" + _hermes("get_time", T), None,
     [("get_weather", W), ("get_time", T)]),
    ("hermes", "No tool needed: 2 < 3.", "No tool needed: 2 < 3.", []),
    ("hermes", _hermes("get_time", T) + "\nDone.", "Done.", [("get_time", T)]),
    ("qwen25", '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>', None,
     [("get_time", T)]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}', None,
     [("get_weather", W)]),
    ("llama3", '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}; '
     '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}', None,
     [("get_time", T), ("get_weather", W)]),
    ("llama3", "It is sunny {mostly}.", "It is sunny {mostly}.", []),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": '
     '{"city": "Oslo", "unit": "c"}}, {"name": "get_time", "arguments": {"zone": "UTC"}}]', None,
     [("get_weather", W), ("get_time", T)]),
    ("mistral", 'Let me check. [TOOL_CALLS] [{"name": "get_time", "arguments": {"zone": "UTC"}}]',
     "Let me check.", [("get_time", T)]),
    ("mistral", '[{"name": "get_time", "arguments": {"zone": "UTC"}}]', None,  # control token
     [("get_time", T)]),  # decoded away
    ("deepseekv3", f"{DS_B}{_ds('get_weather', W)}\n{_ds('get_time', T)}{DS_E}", None,
     [("get_weather", W), ("get_time", T)]),
    ("deepseekv3", f"Checking.{DS_B}{_ds('get_time', T)}{DS_E}", "Checking.", [("get_time", T)]),
    ("pythonic", '[get_weather(city="Oslo", unit=\'c\'), get_time(zone="UTC")]', None,
     [("get_weather", W), ("get_time", T)]),
    ("pythonic", "[get_time(zone='UTC')]", None, [("get_time", T)]),
    ("pythonic", "Plain [text] here.", "Plain [text] here.", []),
    ("json", '[{"name": "get_time", "arguments": {"zone": "UTC"}}, '
     '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}]', None,
     [("get_time", T), ("get_weather", W)]),
    ("json", '{"name":"get_time","arguments":{"zone":"UTC"}}', None, [("get_time", T)]),
    ("json", "The time is noon.", "The time is noon.", []),
]  # fmt: skip

MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>'),
    ("hermes", "<tool_call>\nnot json\n</tool_call>"),
    ("llama3", '{"name": "get_time", "parameters": [1, 2]}'),
    ("mistral", '[TOOL_CALLS] [{"name": "get_time", "arguments": {"zone": '),
    ("deepseekv3", f'{DS_B}{DS_CB}function{DS_S}get_time\n```json\n{{"zone": '),
    ("pythonic", "[get_time(zone=UTC)]"),
    ("json", '{"name": "get_time", "arguments": "UTC"}'),
]


def _ids(case):
    return f"{case[0]}-{len(case[3])}calls-{zlib.crc32(case[1].encode()) % 1000}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_finished_answer_parses_into_content_and_calls(case):
    name, text, content, calls = case
    got_content, got_calls = get_parser(name).parse(text, TOOLS)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got_calls] == (
        calls
    )
    assert len({c["id"] for c in got_calls}) == len(got_calls)
    for c in got_calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
    if calls:
        for tag in ("<tool_call>", "[TOOL_CALLS]", DS_B, "<|python_tag|>"):
            assert tag not in (got_content or "")


def _replay(name: str, pieces: list[str]):
    streamer = CallStreamer(get_parser(name))
    text, content, calls = "", "", {}
    for k, piece in enumerate(pieces):
        text += piece
        for d in streamer.feed(text, final=k == len(pieces) - 1):
            if "content" in d:
                content += d["content"]
                continue
            (tc,) = d["tool_calls"]
            if tc["index"] not in calls:
                assert tc["function"]["arguments"] == "" and tc["id"] and tc["type"] == "function"
                calls[tc["index"]] = [tc["function"]["name"], ""]
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                calls[tc["index"]][1] += tc["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return content, [(n, json.loads(a)) for n, a in (calls[i] for i in sorted(calls))]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_streamed_in_every_split_gives_the_same_answer(case):
    name, text, content, calls = case
    splits = [[text[:i], text[i:]] for i in range(1, len(text))]
    splits.append(list(text))  # one character at a time
    for pieces in splits:
        got_content, got_calls = _replay(name, pieces)
        assert got_content.strip() == (content or "")
        assert got_calls == calls


@pytest.mark.parametrize("name, text", MALFORMED)
def test_malformed_calls_leave_the_text_as_content(name, text):
    content, calls = get_parser(name).parse(text, TOOLS)
    assert calls == [] and content == text


@pytest.mark.parametrize("name", ["hermes", "mistral", "deepseekv3", "pythonic", "json"])
def test_a_last_call_cut_short_is_dropped_and_the_others_kept(name):
    parser = get_parser(name)
    text = parser.render([("get_time", T), ("get_weather", W)])
    cut = text[: text.rindex("Oslo")]
    content, calls = parser.parse(cut, TOOLS)
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    assert parser.cut_in_a_call(cut) and not parser.cut_in_a_call(text)
    assert not any(tag in (content or "") for tag in ("<tool_call>", "[TOOL_CALLS]", DS_B))


def test_parser_chosen_from_the_template_markers():
    assert parser_for_template("{{ '<tool_call>' }}") == "hermes"
    assert parser_for_template("x [TOOL_CALLS] y") == "mistral"
    assert parser_for_template("<｜tool▁calls▁begin｜>") == "deepseekv3"
    assert parser_for_template("<|python_tag|>") == "llama3"
    assert parser_for_template("{{ messages }}") == "json"
    assert parser_for_template(None) == "json"
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        get_parser("nope")


def test_pythonic_literals_read_python_and_json_spellings():
    assert python_literal("[1, -2.5, 'a', None, True]") == [1, -2.5, "a", None, True]
    assert python_literal('{"a": null, "b": false}') == {"a": None, "b": False}
    with pytest.raises(ValueError):
        python_literal("os.system('x')")


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral", "deepseekv3", "pythonic", "json"])
def test_rendered_calls_parse_back(name):
    parser = get_parser(name)
    text = parser.render([("get_weather", W), ("get_time", T)])
    _, calls = parser.parse(text, TOOLS)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    assert got == [("get_weather", W), ("get_time", T)]
