"""Tool calling and reasoning models: call formats, the request's tools, strict calls as phases.

`parser.ToolParser` is the interface of a call format and `registry` maps the
`--tool-call-parser` names to one module per family (`hermes`, `llama3`, `mistral`,
`deepseekv3`, `pythonic`, `json_calls`); `plan` constrains calls (and puts a reasoning phase
first) as `phases` of one answer; `reasoning` reads `<think>`.
"""
