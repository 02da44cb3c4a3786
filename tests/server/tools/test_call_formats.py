"""The formats described once (`CallFormat`): Qwen3-Coder's XML parameters, GLM-4.5, Kimi K2,
DeepSeek V3.1 and gpt-oss's Harmony channels. From each description: a rendered call reads back
through the parser, the strict structural tag (walked token by token over SmolLM2's vocabulary)
accepts exactly the valid calls to the declared tools, and streamed deltas of any size give the
same calls as the whole text."""

from __future__ import annotations

import json

import pytest

from runtime.server.protocol import Tool
from runtime.server.tools.call_tags import BuiltinTagError, builtin_structural_tag
from runtime.server.tools.parser import CallStreamer
from runtime.server.tools.plan import tool_answer_spec
from runtime.server.tools.registry import get_parser, parser_for_template

WEATHER = Tool.model_validate(
    {
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 8},
                    "days": {"type": "integer"},
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
TOOLS = [WEATHER, TIME]
GOOD = [("get_weather", {"city": "Oslo", "days": 3, "unit": "c"}), ("get_time", {"zone": "UTC"})]
BAD = [
    [("get_weather", {"city": "Oslo", "extra": 1})],  # an undeclared argument
    [("get_weather", {"unit": "c"})],  # a required one missing
    [("get_time", {"zone": "PST"})],  # outside the enum
    [("get_weather", {"city": "Oslo", "days": "x"})],  # not an integer
    [("launch", {"zone": "UTC"})],  # an undeclared tool
]
FORMATS = [
    "qwen3_coder", "glm45", "kimi_k2", "deepseekv31", "gpt-oss", "deepseekv3", "hermes", "mistral"
]  # fmt: skip


def _spec(name: str, choice, parallel: bool = True) -> dict:
    return tool_answer_spec(get_parser(name), TOOLS, choice, parallel, "strict", None).constraint


def _calls(parsed) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed]


@pytest.mark.parametrize("name", FORMATS)
def test_a_rendered_answer_reads_back_as_its_calls(name):
    parser = get_parser(name)
    content, calls = parser.parse("Let me check. " + parser.render(GOOD), TOOLS)
    assert content == "Let me check."
    assert _calls(calls) == GOOD
    content, calls = parser.parse("No tool is needed.", TOOLS)
    assert (content, calls) == ("No tool is needed.", [])


@pytest.mark.parametrize("name", ["qwen3_coder", "glm45"])
def test_xml_values_are_typed_by_the_tool_schema(name):
    parser = get_parser(name)
    text = parser.render([("get_weather", {"city": "1234", "days": 2})])
    _, calls = parser.parse(text, TOOLS)
    assert _calls(calls) == [("get_weather", {"city": "1234", "days": 2})]  # "1234" stays text


def test_qwen3_coder_reads_the_templates_line_breaks_around_values():
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    _, calls = get_parser("qwen3_coder").parse(text, TOOLS)
    assert _calls(calls) == [("get_weather", {"city": "Oslo", "days": 3})]


@pytest.mark.parametrize("name", FORMATS)
def test_required_tag_accepts_valid_calls_and_refuses_invalid(walk, name):
    parser, constraint = get_parser(name), _spec(name, "required")
    assert walk(constraint, parser.render(GOOD)), parser.render(GOOD)
    for bad in BAD:
        assert not walk(constraint, parser.render(bad)), parser.render(bad)
    assert not walk(constraint, "Free text first. " + parser.render(GOOD))


@pytest.mark.parametrize("name", FORMATS)
def test_parallel_false_and_named_allow_one_call(walk, name):
    parser = get_parser(name)
    one = _spec(name, "required", parallel=False)
    assert walk(one, parser.render(GOOD[:1]))
    assert not walk(one, parser.render(GOOD))
    named = _spec(name, {"name": "get_time"})
    assert walk(named, parser.render(GOOD[1:]))
    assert not walk(named, parser.render(GOOD[:1]))


@pytest.mark.parametrize("name", FORMATS)
def test_auto_keeps_text_free_until_the_call_opens(walk, name):
    parser, constraint = get_parser(name), _spec(name, "auto")
    assert walk(constraint, "Any text { [ < at all.")
    assert walk(constraint, "Let me look. " + parser.render(GOOD[1:]))
    assert not walk(constraint, "Let me look. " + parser.render(BAD[2]))
    assert not walk(constraint, "Let me look. " + parser.trigger + "nonsense")


@pytest.mark.parametrize("name", ["qwen3_coder", "glm45"])
def test_xml_calls_beside_a_response_format_are_a_call_or_the_format(walk, name):
    parser = get_parser(name)
    spec = tool_answer_spec(parser, TOOLS, "auto", True, "strict", r"\{\}").constraint
    assert walk(spec, "{}")
    assert walk(spec, parser.render(GOOD[1:]))
    assert not walk(spec, "free text")
    assert not walk(spec, parser.render(BAD[2]))


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("step", [1, 3, 17, 10_000])
def test_streamed_deltas_of_any_size_give_the_same_calls(name, step):
    """One delta per character, per few characters (a token), per jump-forward run, or the
    whole answer at once: the same content and calls."""
    parser = get_parser(name)
    parser.bind(TOOLS)
    text = "Checking. " + parser.render(GOOD)
    streamer = CallStreamer(parser)
    deltas = []
    for end in range(step, len(text) + step, step):
        deltas += streamer.feed(text[: min(end, len(text))])
    deltas += streamer.feed(text, final=True)
    content = "".join(d.get("content", "") for d in deltas)
    names, args = {}, {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            if "id" in c:
                names[c["index"]] = c["function"]["name"]
            args[c["index"]] = args.get(c["index"], "") + c["function"].get("arguments", "")
    assert content.strip() == "Checking."
    assert [(names[k], json.loads(args[k])) for k in sorted(names)] == GOOD


def test_harmony_keeps_the_analysis_channel_and_markup_out_of_content():
    parser = get_parser("gpt-oss")
    text = (
        "<|channel|>analysis<|message|>The user wants the time.<|end|><|start|>assistant"
        + parser.render(GOOD[1:])
    )
    content, calls = parser.parse(text, TOOLS)
    assert content is None and _calls(calls) == GOOD[1:]
    final = (
        "<|channel|>analysis<|message|>Easy.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hi.<|return|>"
    )
    assert parser.parse(final, TOOLS) == ("Hi.", [])


@pytest.mark.parametrize(
    "template, name",
    [
        pytest.param("<tool_call>\n<function={{ n }}>\n<parameter={{ k }}>", "qwen3_coder",
                     id="qwen3_coder"),
        pytest.param("<tool_call>{{ n }}\n<arg_key>{{ k }}</arg_key>", "glm45", id="glm45"),
        pytest.param("<|tool_calls_section_begin|>", "kimi_k2", id="kimi_k2"),
        pytest.param("<|channel|>commentary to=functions.{{ n }}", "gpt-oss", id="gpt-oss"),
        pytest.param("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ n + '<｜tool▁sep｜>'",
                     "deepseekv31", id="deepseekv31"),
        pytest.param("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...```json", "deepseekv3",
                     id="deepseekv3"),
        pytest.param("<tool_call>\n{\"name\": ...", "hermes", id="hermes"),
    ],
)  # fmt: skip
def test_parser_for_template_picks_each_format(template, name):
    assert parser_for_template(template) == name


@pytest.mark.parametrize(
    "alias, name",
    [("qwen3_xml", "qwen3_coder"), ("glm", "glm45"), ("openai", "gpt-oss"),
     ("deepseek_v31", "deepseekv31")],
)  # fmt: skip
def test_vllm_and_sglang_names_reach_the_same_format(alias, name):
    assert get_parser(alias).name == name


@pytest.mark.parametrize("name", FORMATS)
def test_builtin_tag_with_reasoning_puts_the_thinking_first(walk, name):
    parser = get_parser(name)
    tools = [t.model_dump(mode="json", exclude_none=True) for t in TOOLS]
    tag = builtin_structural_tag(name, tools, "required", reasoning=True)
    start, end = parser.fmt.reasoning
    thought = f"{start}Which tool?{end}\n\n"
    assert walk({"structural_tag": tag}, thought + parser.render(GOOD[1:]))
    assert not walk({"structural_tag": tag}, parser.render(GOOD[1:]))  # the thinking is owed
    choice = {"type": "function", "function": {"name": "get_time"}}
    plain = builtin_structural_tag(name, tools, choice)
    assert walk({"structural_tag": plain}, parser.render(GOOD[1:]))
    assert not walk({"structural_tag": plain}, parser.render(GOOD[:1]))


def test_llama3_is_a_whole_answer_description(walk):
    """Llama 3's calls are the whole answer (`whole_answer`, optional `<|python_tag|>`): the
    parser and the regex both come from the description."""
    parser = get_parser("llama3")
    assert parser.fmt.whole_answer and parser.trigger is None
    text = parser.render(GOOD)
    assert _calls(parser.parse(text, TOOLS)[1]) == GOOD
    assert _calls(parser.parse("<|python_tag|>" + text, TOOLS)[1]) == GOOD
    assert parser.parse("Let me check. " + text, TOOLS) == ("Let me check. " + text, [])
    required = _spec("llama3", "required")
    assert walk(required, text) and walk(required, "<|python_tag|>" + text)
    for bad in BAD:
        assert not walk(required, parser.render(bad))
    auto = _spec("llama3", "auto")
    assert walk(auto, "No call.") and walk(auto, text)
    assert not walk(auto, parser.render(BAD[2]))


def test_builtin_tag_names_what_it_refuses():
    with pytest.raises(BuiltinTagError, match="no built-in"):
        builtin_structural_tag("pythonic", [WEATHER])
    with pytest.raises(BuiltinTagError, match="nowhere"):
        builtin_structural_tag("kimi_k2", [WEATHER], {"name": "nowhere"})
    with pytest.raises(BuiltinTagError, match="unknown tool-call parser"):
        builtin_structural_tag("no_such_family", [WEATHER])


def test_xml_parameters_the_style_cannot_write_are_a_400_naming_the_tool():
    from runtime.server.errors import APIError

    either = Tool.model_validate(
        {
            "function": {
                "name": "note",
                "parameters": {
                    "type": "object",
                    "properties": {"text": {"type": ["string", "integer"]}},
                },
            }
        }
    )
    with pytest.raises(APIError) as err:
        tool_answer_spec(get_parser("qwen3_coder"), [WEATHER, either], "auto", True, "strict", None)
    assert err.value.param == "tools.1.function.parameters" and "note" in err.value.message


def test_harmony_reasoning_parser_takes_the_analysis_channel():
    from runtime.server.tools.reasoning import get_reasoning_parser

    rp = get_reasoning_parser("gpt-oss")
    text = "<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant" + get_parser(
        "gpt-oss"
    ).render(GOOD[1:])
    reasoning, answer = rp.split(text, open_at_start=False)
    assert reasoning == "Need the time."
    content, calls = get_parser("gpt-oss").parse(answer, TOOLS)
    assert content is None and _calls(calls) == GOOD[1:]
