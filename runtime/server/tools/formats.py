r"""The call formats described as data (`CallFormat`): each family once, its parser and its
strict structural tag derived from the description.

    qwen3_coder   <tool_call>\n<function=f>\n<parameter=k>v</parameter>\n</function>\n</tool_call>
    glm45         <tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>
    kimi_k2       <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0
                  <|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>
    deepseekv31   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
                  <｜tool▁calls▁end｜>
    deepseekv3    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}
                  \n```<｜tool▁call▁end｜> (calls on their own lines) <｜tool▁calls▁end｜>
    hermes        <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call> per call, the call
                  object read in any spacing and key order ("parameters" too)
    llama3        {"name": "f", "parameters": {...}}; {...} as the whole answer, optionally after
                  <|python_tag|> (`whole_answer`, `lead`), read as JSON objects
    pythonic      [f(a=1), g(b="x")] as the whole answer (Python literals read, JSON written)
    mistral       [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...] after any text: the block
                  read as a JSON list (`json_list`), also without its control token
    gpt-oss       <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>
                  (Harmony: calls after `<|start|>assistant`, the answer in the `final` channel,
                  the thinking in `analysis`)

Qwen3-Coder's and GLM-4.5's XML values are written raw for strings and as JSON otherwise (the
grammar's `qwen_xml` / `glm_xml` styles); Kimi K2 numbers its calls (`functions.f:N`, N any
digits in the grammar). The `FormatParser` subclasses are the `--tool-call-parser` entries
(`registry.py`).
"""

from __future__ import annotations

from runtime.server.tools.call_format import CallFormat, FormatParser

QWEN3_CODER = CallFormat(
    name="qwen3_coder",
    call_begin="<tool_call>\n<function={name}>",
    call_end="</function>\n</tool_call>",
    args="qwen_xml",
    separator="\n",
    trigger_text="<tool_call>",
    markers=("<tool_call>", "</tool_call>"),
)
GLM45 = CallFormat(
    name="glm45",
    call_begin="<tool_call>{name}\n",
    call_end="</tool_call>",
    args="glm_xml",
    separator="\n",
    trigger_text="<tool_call>",
    markers=(
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    ),
)
KIMI_K2 = CallFormat(
    name="kimi_k2",
    call_begin="<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>",
    call_end="<|tool_call_end|>",
    block_begin="<|tool_calls_section_begin|>",
    block_end="<|tool_calls_section_end|>",
    markers=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
             "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
)  # fmt: skip
DEEPSEEK_V31 = CallFormat(
    name="deepseekv31",
    call_begin="<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>",
    call_end="<｜tool▁call▁end｜>",
    block_begin="<｜tool▁calls▁begin｜>",
    block_end="<｜tool▁calls▁end｜>",
    markers=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
             "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"),
)  # fmt: skip
HARMONY_MARKUP = ("<|start|>assistant", "<|channel|>final<|message|>", "<|return|>", "<|end|>")
GPT_OSS = CallFormat(
    name="gpt-oss",
    call_begin="<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>",
    call_end="<|call|>",
    separator="<|start|>assistant",
    trigger_text="<|channel|>commentary to=",
    reasoning=("<|channel|>analysis<|message|>", "<|end|>"),
    markup=HARMONY_MARKUP,
    markers=("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|call|>",
             "<|end|>", "<|return|>"),
)  # fmt: skip

DEEPSEEK_V3 = CallFormat(
    name="deepseekv3",
    call_begin="<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n",
    call_end="\n```<｜tool▁call▁end｜>",
    block_begin="<｜tool▁calls▁begin｜>",
    block_end="<｜tool▁calls▁end｜>",
    separator="\n",
    markers=DEEPSEEK_V31.markers,
)

HERMES = CallFormat(
    name="hermes",
    call_begin='<tool_call>\n{"name": "{name}", "arguments": ',
    call_end="}\n</tool_call>",
    args="json_call",
    separator="\n",
    trigger_text="<tool_call>",
    markers=("<tool_call>", "</tool_call>"),
)

MISTRAL = CallFormat(
    name="mistral",
    call_begin='{"name": "{name}", "arguments": ',
    call_end="}",
    args="json_call",
    block_begin="[TOOL_CALLS] [",
    block_end="]",
    separator=", ",
    trigger_text="[TOOL_CALLS]",
    markers=("[TOOL_CALLS]",),
    json_list=True,
    # `[TOOL_CALLS]` is a control token of Mistral's tokenizers: text decoded without special
    # tokens has only the list, so an answer that is a list of calls is read as calls too
    bare_block='[{"name"',
)

PYTHON_TAG = "<|python_tag|>"
LLAMA3 = CallFormat(
    name="llama3",
    call_begin='{"name": "{name}", "parameters": ',
    call_end="}",
    args="json_call",
    separator="; ",
    markers=(PYTHON_TAG,),
    whole_answer=True,
    lead=PYTHON_TAG,  # the tag its templates may open with
)

PYTHONIC = CallFormat(
    name="pythonic",
    call_begin="{name}(",
    call_end=")",
    args="pythonic",
    block_begin="[",
    block_end="]",
    separator=", ",
    whole_answer=True,
)

FORMATS = {
    f.name: f
    for f in (
        QWEN3_CODER, GLM45, KIMI_K2, DEEPSEEK_V31, GPT_OSS, DEEPSEEK_V3, HERMES, MISTRAL, LLAMA3,
        PYTHONIC,
    )
}  # fmt: skip


class Qwen3CoderParser(FormatParser):
    fmt = QWEN3_CODER


class Glm45Parser(FormatParser):
    fmt = GLM45


class KimiK2Parser(FormatParser):
    fmt = KIMI_K2


class DeepSeekV31Parser(FormatParser):
    fmt = DEEPSEEK_V31


class GptOssParser(FormatParser):
    fmt = GPT_OSS


class DeepSeekV3Parser(FormatParser):
    fmt = DEEPSEEK_V3


class HermesParser(FormatParser):
    fmt = HERMES


class MistralParser(FormatParser):
    fmt = MISTRAL


class Llama3Parser(FormatParser):
    fmt = LLAMA3


class PythonicParser(FormatParser):
    fmt = PYTHONIC
