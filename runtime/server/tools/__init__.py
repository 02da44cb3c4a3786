"""Tool calling and reasoning models: call formats, the request's tools, strict calls as phases.

`parser.ToolParser` is the interface of a call format. Most formats are described once as a
`call_format.CallFormat` (`formats.py`: hermes, deepseekv3, qwen3_coder, glm45, kimi_k2,
deepseekv31, gpt-oss), their streaming parser and strict structural tag (`call_tags`) derived
from it; `llama3`, `mistral`, `pythonic` and `json_calls` are modules of their own. `registry`
maps the `--tool-call-parser` names; `plan` constrains calls (and puts a reasoning phase first)
as `phases` of one answer; `reasoning` reads `<think>`.
"""
