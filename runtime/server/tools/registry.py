"""The `--tool-call-parser` names: each format's parser, its aliases, and the format a chat
template asks for.

A new format is a `CallFormat` description in `formats.py` (its parser and structural tag come
from it) or, for a format the description cannot say, a `ToolParser` module; then one entry in
`PARSERS` (its SGLang / vLLM names in `ALIASES`, its template's markers in
`parser_for_template`).
"""

from __future__ import annotations

from runtime.server.tools.formats import (
    PYTHON_TAG,
    DeepSeekV3Parser,
    DeepSeekV31Parser,
    Glm45Parser,
    GptOssParser,
    HermesParser,
    KimiK2Parser,
    Llama3Parser,
    MistralParser,
    PythonicParser,
    Qwen3CoderParser,
)
from runtime.server.tools.json_calls import JsonCallsParser
from runtime.server.tools.parser import ToolParser


class ToolParserError(ValueError):
    """An unknown parser name."""


PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "llama3": Llama3Parser,
    "mistral": MistralParser,
    "deepseekv3": DeepSeekV3Parser,
    "pythonic": PythonicParser,
    "json": JsonCallsParser,
    "qwen3_coder": Qwen3CoderParser,
    "glm45": Glm45Parser,
    "kimi_k2": KimiK2Parser,
    "deepseekv31": DeepSeekV31Parser,
    "gpt-oss": GptOssParser,
}
ALIASES = {
    "qwen25": "hermes",
    "qwen": "hermes",
    "qwen3": "hermes",
    "llama3_json": "llama3",
    "llama32": "llama3",
    "llama4": "pythonic",
    "deepseek_v3": "deepseekv3",
    "qwen3_xml": "qwen3_coder",  # vLLM's second name for it
    "glm": "glm45",  # SGLang's newer name
    "glm4_moe": "glm45",
    "deepseek_v31": "deepseekv31",  # vLLM's
    "openai": "gpt-oss",  # vLLM's name of the Harmony format
    "gpt_oss": "gpt-oss",
}


def get_parser(name: str) -> ToolParser:
    key = ALIASES.get(name, name)
    if key not in PARSERS:
        known = sorted([*PARSERS, *ALIASES])
        raise ToolParserError(f"unknown tool-call parser {name!r}; known: {', '.join(known)}")
    return PARSERS[key]()


def parser_for_template(template: str | None) -> str:
    """The parser a chat template's tool format asks for (its call markers, looked up in
    this order); `json` (our system text) when the template shows no known format."""
    if not template:
        return "json"
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "<arg_key>" in template:
        return "glm45"
    if "<|tool_calls_section_begin|>" in template:
        return "kimi_k2"
    if "<|channel|>" in template and "to=functions." in template:
        return "gpt-oss"
    if "tool▁call▁begin" in template and "tool▁calls▁begin" in template:
        if "```json" not in template:  # V3.1 writes the arguments bare after the name
            return "deepseekv31"
    if "<tool_call>" in template:
        return "hermes"
    if "tool▁calls▁begin" in template:
        return "deepseekv3"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if PYTHON_TAG in template or ('"parameters"' in template and "ipython" in template):
        return "llama3"
    if "func_name1(" in template or "[func_name(" in template:
        return "pythonic"
    return "json"
