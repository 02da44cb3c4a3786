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
from runtime.server.reasoning import ReasoningStream, get_reasoning_parser
from runtime.server.tool_parsers import get_parser
from runtime.server.tool_plan import AnswerPlan, ReasoningSpec, not_prefixed, tool_answer_spec

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


def _full_regex(name: str, choice, parallel: bool = True) -> str:
    parser = get_parser(name)
    spec = tool_answer_spec(parser, TOOLS, choice, parallel, "strict", None)
    if spec.triggered is None:
        return spec.constraint["regex"]
    t = spec.triggered
    return t.forced_first or re.escape(parser.trigger) + t.after_trigger


@pytest.mark.parametrize("name", [p for p in PARSERS if p != "json"])
def test_required_regex_accepts_valid_calls_and_refuses_invalid(name):
    parser = get_parser(name)
    regex = _full_regex(name, "required")
    one_call_formats = name == "hermes"  # each hermes call is its own triggered region
    calls = GOOD[:1] if one_call_formats else GOOD
    assert re.fullmatch(regex, parser.render(calls)), parser.render(calls)
    for bad in BAD:
        assert not re.fullmatch(regex, parser.render(bad)), parser.render(bad)


@pytest.mark.parametrize("name", ["llama3", "mistral", "deepseekv3", "pythonic"])
def test_parallel_false_and_named_allow_one_call(name):
    parser = get_parser(name)
    assert re.fullmatch(_full_regex(name, "required", parallel=False), parser.render(GOOD[:1]))
    assert not re.fullmatch(_full_regex(name, "required", parallel=False), parser.render(GOOD))
    named = _full_regex(name, {"name": "get_time"})
    assert re.fullmatch(named, parser.render(GOOD[1:]))
    assert not re.fullmatch(named, parser.render(GOOD[:1]))


@pytest.mark.parametrize("name", ["llama3", "pythonic", "json"])
def test_auto_in_whole_answer_formats_is_calls_or_text_that_does_not_open_them(name):
    parser = get_parser(name)
    regex = tool_answer_spec(parser, TOOLS, "auto", True, "strict", None).constraint["regex"]
    assert re.fullmatch(regex, "The weather is fine.")
    assert re.fullmatch(regex, parser.render(GOOD[1:]))
    opened = parser.openers[0] + "not a call"
    assert not re.fullmatch(regex, opened)


def test_strict_false_relaxes_only_the_arguments():
    parser = get_parser("hermes")
    spec = tool_answer_spec(parser, [LOOSE], "required", True, "strict", None)
    assert re.fullmatch(spec.triggered.forced_first, parser.render([("note", {"any": [1]})]))
    assert not re.fullmatch(spec.triggered.forced_first, parser.render([("other", {})]))


def test_regexes_compile_in_the_grammar_dialect():
    from grammar import compile_regex
    from grammar.tokens.vocab import TokenVocabulary

    vocab = TokenVocabulary.from_tokenizer(_tokenizer())
    for name in PARSERS:
        for choice in ("auto", "required", {"name": "get_weather"}):
            parser = get_parser(name)
            spec = tool_answer_spec(parser, TOOLS, choice, True, "strict", None)
            regexes = [spec.constraint.get("regex")]
            if spec.triggered is not None:
                regexes += [spec.triggered.after_trigger, spec.triggered.forced_first]
            for r in filter(None, regexes):
                compile_regex(r, vocab)


def _tokenizer():
    from tests._runtime_fixtures import smollm_tokenizer

    return smollm_tokenizer()


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


def test_plan_free_text_then_a_constrained_call_then_free_again():
    spec = tool_answer_spec(get_parser("hermes"), TOOLS, "auto", True, "strict", None)
    plan = AnswerPlan(None, spec)
    first = plan.first()
    assert first.stop == ("<tool_call>",) and not first.constraint
    call = plan.next("Sure. ", _result("Sure. ", stop="<tool_call>"), False)
    assert call.forced == "<tool_call>" and call.constraint["regex"] == spec.triggered.after_trigger
    again = plan.next("...", _result('\n{"name": ...}', stop=0), False)
    assert again.stop == ("<tool_call>",) and not again.forced
    assert plan.next("...", _result("done", stop=0), False) is None  # EOS: finished


def test_plan_parallel_false_stops_after_one_call():
    spec = tool_answer_spec(get_parser("hermes"), TOOLS, "auto", False, "strict", None)
    plan = AnswerPlan(None, spec)
    plan.first()
    plan.next("", _result("", stop="<tool_call>"), False)
    assert plan.next("", _result("call", stop=0), False) is None


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
