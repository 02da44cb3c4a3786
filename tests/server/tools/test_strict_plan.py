"""Strict calls and reasoning phases without a server: the constraint built from a parser's
format and the tools accepts that format's valid calls and refuses invalid ones (checked with
Python's `re` and through the grammar's own DFA), and the plan of phases follows triggers,
`</think>` and the reasoning budget."""

from __future__ import annotations

import json
import re

import pytest

from runtime.scheduling.request import GenerateResult
from runtime.server.protocol import Tool
from runtime.server.tools.plan import AnswerPlan, ReasoningSpec, not_prefixed, tool_answer_spec
from runtime.server.tools.reasoning import ReasoningStream, get_reasoning_parser
from runtime.server.tools.registry import get_parser

WEATHER = Tool.model_validate(
    {
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 8},
                    "unit": {"enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        }
    }
)
TIME = Tool.model_validate(
    {
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"],
            },
        }
    }
)
LOOSE = Tool.model_validate(
    {"function": {"name": "note", "strict": False, "parameters": WEATHER.function.parameters}}
)
TOOLS = [WEATHER, TIME]
GOOD = [("get_weather", {"city": "Oslo", "unit": "c"}), ("get_time", {"zone": "UTC"})]
BAD = [
    [("get_weather", {"city": "Oslo", "extra": 1})],  # undeclared argument
    [("get_weather", {"unit": "c"})],  # a required one missing
    [("get_time", {"zone": "PST"})],  # outside the enum
    [("launch", {"zone": "UTC"})],  # an undeclared tool
]
PARSERS = ["hermes", "llama3", "mistral", "deepseekv3", "pythonic", "json"]


def _spec(name: str, choice, parallel: bool = True) -> dict:
    parser = get_parser(name)
    return tool_answer_spec(parser, TOOLS, choice, parallel, "strict", None).constraint


def _text(name: str, calls) -> str:
    return get_parser(name).render(calls)


@pytest.mark.parametrize("name", [p for p in PARSERS if p != "json"])
def test_required_accepts_valid_calls_and_refuses_invalid(walk, name):
    constraint = _spec(name, "required")
    assert walk(constraint, _text(name, GOOD)), _text(name, GOOD)
    for bad in BAD:
        assert not walk(constraint, _text(name, bad)), _text(name, bad)
    assert not walk(constraint, "Free text first. " + _text(name, GOOD))
    if name in ("hermes", "mistral", "deepseekv3"):  # calls only: no text after them
        assert not walk(constraint, _text(name, GOOD) + " And some text.")


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral", "deepseekv3", "pythonic"])
def test_parallel_false_and_named_allow_one_call(walk, name):
    one = _spec(name, "required", parallel=False)
    assert walk(one, _text(name, GOOD[:1]))
    assert not walk(one, _text(name, GOOD))
    named = _spec(name, {"name": "get_time"})
    assert walk(named, _text(name, GOOD[1:]))
    assert not walk(named, _text(name, GOOD[:1]))


@pytest.mark.parametrize("name", ["hermes", "mistral", "deepseekv3"])
def test_auto_in_trigger_formats_keeps_text_free_until_the_call_opens(walk, name):
    constraint = _spec(name, "auto")
    assert "structural_tag" in constraint
    assert walk(constraint, "Any text { [ at all.")
    assert walk(constraint, "Let me look. " + _text(name, GOOD[1:]))
    assert not walk(constraint, "Let me look. " + _text(name, BAD[2]))


@pytest.mark.parametrize("name", ["llama3", "pythonic", "json"])
def test_auto_in_whole_answer_formats_is_calls_or_text_that_does_not_open_them(name):
    parser = get_parser(name)
    regex = tool_answer_spec(parser, TOOLS, "auto", True, "strict", None).constraint["regex"]
    assert re.fullmatch(regex, "The weather is fine.")
    assert re.fullmatch(regex, parser.render(GOOD[1:]))
    opened = parser.openers[0] + "not a call"
    assert not re.fullmatch(regex, opened)


def test_strict_false_relaxes_only_the_arguments(walk):
    parser = get_parser("hermes")
    constraint = tool_answer_spec(parser, [LOOSE], "required", True, "strict", None).constraint
    assert walk(constraint, parser.render([("note", {"any": [1]})]))
    assert not walk(constraint, parser.render([("other", {})]))


def test_auto_with_a_response_format_is_a_call_or_the_format():
    parser = get_parser("hermes")
    spec = tool_answer_spec(parser, TOOLS, "auto", True, "strict", r"\{\}")
    assert re.fullmatch(spec.constraint["regex"], "{}")
    assert re.fullmatch(spec.constraint["regex"], parser.render(GOOD[1:]))
    assert not re.fullmatch(spec.constraint["regex"], "free text")


@pytest.mark.parametrize(
    "prefixes, good, bad",
    [
        (("{",), ["a", "}{", " {"], ["", "{", '{"a"'] ),
        (("{", "<|python_tag|>"), ["<", "<|", "<|pyt", "<a", "x{"], ["{", "<|python_tag|>x"]),
    ],
)  # fmt: skip
def test_not_prefixed(prefixes, good, bad):
    regex = not_prefixed(prefixes)
    assert all(re.fullmatch(regex, g) for g in good)
    assert not any(re.fullmatch(regex, b) for b in bad)


def _result(text: str, reason: str = "stop", stop=None) -> GenerateResult:
    return GenerateResult(text, [], [], reason, matched_stop=stop)


def test_plan_reasoning_then_the_format_and_the_budget_forces_the_end_tag():
    spec = tool_answer_spec(get_parser("json"), TOOLS, "required", True, "strict", None)
    rp = get_reasoning_parser("deepseek-r1")
    plan = AnswerPlan(ReasoningSpec(rp, True, 5), spec)
    first = plan.first()
    assert first.stop == ("</think>",) and first.max_tokens == 5 and not first.constraint
    answer = plan.next("hmm", _result("hmm", "length"), capped=True)
    assert answer.forced == "</think>" and answer.constraint == spec.constraint
    plan = AnswerPlan(ReasoningSpec(get_reasoning_parser("qwen3"), False, None), spec)
    assert plan.first().forced == "<think>\n"  # the model's own opening, written for it
    assert plan.next("x", _result("x", "length"), capped=False) is None  # out of tokens
    plan = AnswerPlan(ReasoningSpec(rp, True, None), spec)
    assert plan.first().share == 0.5  # no budget: the constrained answer keeps room
    after_eos = AnswerPlan(ReasoningSpec(rp, True, None), spec)
    after_eos.first()
    owed = after_eos.next("hm", _result("hm", stop=2), capped=False)  # the turn ended thinking
    assert owed.forced == "</think>" and owed.constraint == spec.constraint
    after_user_stop = AnswerPlan(ReasoningSpec(rp, True, None), spec)
    after_user_stop.first()
    assert after_user_stop.next("hm", _result("hm", stop="STOP"), capped=False) is None
    answer = plan.next("hm", _result("hm", stop="</think>"), capped=False)
    assert answer.forced == "</think>" and answer.constraint == spec.constraint


READS = [
    # parser, open in prompt, answer, reasoning, content
    ("deepseek-r1", True, "Let me think.</think>\n\nParis.", "Let me think.", "Paris."),
    ("deepseek-r1", True, "<think>Hm.</think>Yes", "Hm.", "Yes"),
    ("deepseek-r1", True, "never closed", "never closed", ""),
    ("qwen3", False, "<think>\nA.\n</think>\n\nB", "\nA.\n", "B"),
    ("qwen3", False, "No thinking here.", None, "No thinking here."),
    ("qwen3", True, "inside</think>out", "inside", "out"),
]


@pytest.mark.parametrize("name, opened, text, reasoning, content", READS)
def test_reasoning_split_finished_and_streamed_in_every_split(name, opened, text, reasoning,
                                                              content):  # fmt: skip
    parser = get_reasoning_parser(name)
    assert parser.split(text, opened) == (reasoning, content)
    for i in range(1, len(text) + 1):
        stream = ReasoningStream(parser, opened)
        got = ""
        for k, part in enumerate((text[:i], text)):
            piece, answer, _ = stream.feed(part, final=k == 1)
            got += piece
        assert got == (reasoning or "") and answer == content


def test_reasoning_opens_in_prompt_as_the_templates_put_it():
    r1, q3 = get_reasoning_parser("deepseek_r1"), get_reasoning_parser("qwen3")
    assert r1.opens_in_prompt("<|Assistant|><think>\n", True)
    assert r1.opens_in_prompt("<|Assistant|>", True)  # R1 answers start inside the reasoning
    assert not r1.opens_in_prompt("<think>\n\n</think>\n\n", True)  # thinking turned off
    assert not q3.opens_in_prompt("<|im_start|>assistant\n", True)
    assert q3.opens_in_prompt("<|im_start|>assistant\n<think>\n", True)
    assert not q3.opens_in_prompt("<|im_start|>assistant\n<think>\n", False)
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        get_reasoning_parser("nope")


def test_plan_spec_cache_gives_equal_constraints_for_equal_tools():
    a = tool_answer_spec(get_parser("mistral"), TOOLS, "required", True, "strict", None)
    b = tool_answer_spec(
        get_parser("mistral"),
        [Tool.model_validate(json.loads(t.model_dump_json())) for t in TOOLS],
        "required",
        True,
        "strict",
        None,
    )
    assert a.constraint == b.constraint
