"""Chat requests to prompts and constraints: the model's chat template, `response_format`.

Messages are rendered with the tokenizer's own template (`apply_chat_template`, generation
prompt added). Content given as a list of parts keeps its text parts; `developer` is a system
turn. Tool turns: when the template renders assistant `tool_calls` itself (Qwen, Llama 3.1,
Mistral, ... templates), assistant calls and `tool` results are passed to it as they are
(arguments as objects); otherwise an assistant turn that called tools is written as the JSON
calls it made and a `tool` turn as a user turn naming the tool. A `tool` message must carry
the `tool_call_id` of a call made before it (400 otherwise).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from runtime.server.errors import APIError
from runtime.server.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from runtime.server.structured import check_schema, constraint_field, openai_constraint
from runtime.server.tools.json_calls import (
    JsonCallsParser,
    auto_tool_regex,
    tool_call_lark,
    tool_call_schema,
)
from runtime.server.tools.parser import ToolParser
from runtime.server.tools.plan import AnswerPlan, AnswerSpec, ReasoningSpec, tool_answer_spec
from runtime.server.tools.prompt import calls_text, tools_system_text
from runtime.server.tools.reasoning import get_reasoning_parser
from runtime.server.tools.registry import get_parser, parser_for_template
from runtime.server.tools.request import (
    check_tool_schemas,
    forced_tools,
    parse_tool_choice,
    parse_tools,
)
from runtime.server.tools.schemas import is_recursive

JsonSchemaMode = Literal["strict", "exact"]


class ChatRequest(ChatCompletionRequest):
    """A chat request as the endpoint reads it: `tools` / `tool_choice` are checked by
    `tools/request.py` (a malformed one is a 400 naming the field), plus `json_schema_mode` and the
    reasoning fields (SGLang's `separate_reasoning`, a reasoning budget under SGLang's or
    vLLM's name)."""

    tools: list[Any] | None = None  # type: ignore[assignment]
    tool_choice: Any = None
    # "strict" (objects emit only their declared properties) or "exact"; None: the server's
    json_schema_mode: JsonSchemaMode | None = None
    separate_reasoning: bool = True
    max_reasoning_tokens: int | None = Field(default=None, ge=0)
    thinking_token_budget: int | None = Field(default=None, ge=0)
    _raw_tools: list[Any] | None = PrivateAttr(default=None)

    def prepare(self) -> None:
        if isinstance(self.tools, list) and all(isinstance(t, dict) for t in self.tools):
            self._raw_tools = self.tools
        self.tools = parse_tools(self.tools)
        self.tool_choice = parse_tool_choice(self.tool_choice, self.tools)
        check_messages(self.messages)

    @property
    def parallel(self) -> bool:
        return self.parallel_tool_calls is not False

    @property
    def tool_mode(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def tools_for_template(self) -> list[dict[str, Any]]:
        """The tools as the client sent them (what `apply_chat_template` is given)."""
        if self._raw_tools is not None:
            return self._raw_tools
        return [t.model_dump(mode="json", exclude_none=True) for t in self.tools or []]

    @property
    def reasoning_budget(self) -> int | None:
        if self.max_reasoning_tokens is not None:
            return self.max_reasoning_tokens
        return self.thinking_token_budget

    @property
    def thinking(self) -> bool:
        """False when `chat_template_kwargs` turn thinking off (`enable_thinking` / `thinking`)."""
        kw = self.chat_template_kwargs or {}
        return kw.get("enable_thinking", True) is not False and kw.get("thinking") is not False


class CompletionsRequest(CompletionRequest):
    json_schema_mode: JsonSchemaMode | None = None


def check_messages(messages: list[ChatMessage]) -> None:
    ids: set[str] = set()
    for i, m in enumerate(messages):
        for c in m.tool_calls or []:
            if c.id:
                ids.add(c.id)
        if m.role != "tool":
            continue
        if not m.tool_call_id:
            msg = f"messages.{i}: a tool message needs the tool_call_id of the call it answers"
            raise APIError(400, msg, param=f"messages.{i}.tool_call_id")
        if m.tool_call_id not in ids:
            msg = f"messages.{i}.tool_call_id {m.tool_call_id!r} answers no earlier tool call"
            raise APIError(400, msg, param=f"messages.{i}.tool_call_id")


def _text_of(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise APIError(
                400,
                f"content part of type {part.get('type')!r} is not supported (text only)",
                param=f"messages.{index}.content",
                code="unsupported_content",
            )
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _history_arguments(arguments: str | dict[str, Any], as_text: bool) -> Any:
    value = _arguments(arguments)
    if as_text:
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return value


def _template_messages(
    request: ChatRequest, native: str | None, parser: ToolParser, tools_in_template: bool
) -> list[dict[str, Any]]:
    """The messages as the template reads them. `native`: how the template takes assistant
    `tool_calls` ("object" or "string" arguments; None: it cannot, they are written as text
    in the parser's format and tool results as user turns)."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_call_id -> function name
    for i, m in enumerate(request.messages):
        text = _text_of(m, i)
        role = "system" if m.role == "developer" else m.role
        entry: dict[str, Any] = {"role": role, "content": text}
        if m.role == "assistant" and m.tool_calls:
            for c in m.tool_calls:
                names[c.id or ""] = c.function.name
            if native:
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.function.name,
                            "arguments": _history_arguments(
                                c.function.arguments, native == "string"
                            ),
                        },
                    }
                    for c in m.tool_calls
                ]
            else:
                calls = [(c.function.name, _arguments(c.function.arguments)) for c in m.tool_calls]
                shown = calls_text(parser, calls)
                entry["content"] = f"{text}\n{shown}" if text else shown
        if m.role == "tool":
            name = m.name or names.get(m.tool_call_id or "", "tool")
            if native:
                entry.update(tool_call_id=m.tool_call_id, name=name)
            else:
                entry = {"role": "user", "content": f"Tool result ({name}): {text}"}
        out.append(entry)
    if request.tool_mode and not tools_in_template:
        tools_text = tools_system_text(request.tools, request.parallel, parser)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{tools_text}"}
        else:
            out.insert(0, {"role": "system", "content": tools_text})
    return out


_NATIVE: dict[str, str | None] = {}
_TOOLS: dict[str, bool] = {}
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_fn_x",
        "description": "d",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}


def renders_tool_calls(tokenizer: Any) -> str | None:
    """How the chat template writes assistant `tool_calls` (probed once per template):
    "object" (it serialises the arguments itself), "string" (it prints them as given), or
    None (it does not write them)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "tool_calls" not in template:
        return None
    if template not in _NATIVE:
        probe = [
            {"role": "user", "content": "u"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_probe",
                        "type": "function",
                        "function": {"name": "probe_fn_x", "arguments": {"a": 1}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_probe", "name": "probe_fn_x", "content": "r9"},
        ]
        try:
            text = tokenizer.apply_chat_template(probe, tokenize=False)
        except Exception:
            text = ""
        if "probe_fn_x" not in text or "r9" not in text:
            _NATIVE[template] = None
        elif "{'a': 1}" in text:
            _NATIVE[template] = "string"  # a dict printed as Python: it wants JSON text
        else:
            _NATIVE[template] = "object"
    return _NATIVE[template]


def renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template describes `tools` itself (probed once per template)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "tools" not in template:
        return False
    if template not in _TOOLS:
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "u"}], tools=[_PROBE_TOOL], tokenize=False
            )
            _TOOLS[template] = "probe_fn_x" in text
        except Exception:
            _TOOLS[template] = False
    return _TOOLS[template]


def _arguments(arguments: str | dict[str, Any]) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def template_kwargs(request: ChatRequest) -> dict[str, Any]:
    return dict(request.chat_template_kwargs or {})


def render_prompt(tokenizer: Any, request: ChatRequest, parser: ToolParser | None = None) -> str:
    """The prompt text for a chat request, ending where the assistant's answer begins:
    `apply_chat_template(messages, tools=tools, add_generation_prompt=True,
    **chat_template_kwargs)` when the template renders tools, else the messages with our
    tools text as a system turn."""
    parser = parser or JsonCallsParser()
    in_template = request.tool_mode and renders_tools(tokenizer)
    messages = _template_messages(request, renders_tool_calls(tokenizer), parser, in_template)
    if not getattr(tokenizer, "chat_template", None):
        lines = [f"{m['role'].capitalize()}: {m['content']}\n" for m in messages]
        return "".join(lines) + "Assistant: "
    kwargs = template_kwargs(request)
    if in_template:
        kwargs["tools"] = request.tools_for_template
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kwargs
        )
    except Exception as exc:  # the template's own checks (role order, ...)
        msg = f"chat template rejected the messages: {exc}"
        raise APIError(400, msg, param="messages") from exc


def response_format_constraint(request: ChatRequest, mode: str, pool: Any = None) -> dict[str, Any]:
    """Engine constraint keywords for the request's output format (`structured.py` reads every
    field that gives one). `response_format.json_schema.strict` true or false: the output is
    constrained either way, under `mode`. `pool`: the server's compile pool."""
    return openai_constraint(request, mode, pool).kwargs


def has_output_format(request: ChatRequest) -> bool:
    return constraint_field(request) is not None


def chat_constraint(request: ChatRequest, mode: str, pool: Any = None) -> dict[str, Any]:
    """The engine constraint of a chat request: its forced tool calls, or auto's alternation
    of calls and text (or of calls and the response_format), or its response_format."""
    from grammar import GrammarError, choices_to_regex, json_schema_to_regex
    from grammar.json_schema.schema import load_schema
    from grammar.json_schema.strict import apply_mode

    if request.tool_mode:
        check_tool_schemas(request.tools, mode, functools.partial(check_schema, pool=pool))
    forced = forced_tools(request.tools, request.tool_choice)
    if forced is not None:
        # a named function is one call, as OpenAI answers it; "required" may be several
        several = request.parallel and not isinstance(request.tool_choice, dict)
        lark = _recursive_calls(forced, several, mode, auto=False)
        if lark is not None:
            return {"grammar": lark}
        return {"json_schema": tool_call_schema(forced, several), "json_schema_mode": mode}
    fmt = response_format_constraint(request, mode, pool)
    if not request.tool_mode:
        return fmt
    if not fmt:
        lark = _recursive_calls(request.tools, request.parallel, mode, auto=True)
        if lark is not None:
            return {"grammar": lark}
    other = fmt.get("regex")
    if "choices" in fmt:
        other = choices_to_regex(fmt["choices"])
    if "ebnf" in fmt or "structural_tag" in fmt:
        raise APIError(
            400,
            f"{constraint_field(request)} cannot be combined with tools here; "
            'send tool_choice "none" or drop the tools',
            param=constraint_field(request),
        )
    if "json_schema" in fmt:
        try:
            other = json_schema_to_regex(apply_mode(load_schema(fmt["json_schema"]), mode))
        except GrammarError:
            return fmt  # a format the regex path cannot say (recursive): the format alone
    return {"regex": auto_tool_regex(request.tools, request.parallel, mode, other)}


@functools.lru_cache(maxsize=256)
def _recursive(params: str) -> bool:
    return is_recursive(json.loads(params))


def _recursive_calls(tools: list[Any], parallel: bool, mode: str, auto: bool) -> str | None:
    """Calls to tools whose parameters are recursive (a tree of nodes), as a lark grammar:
    the context-free path says them with no depth limit. None for other tools, and where the
    lark path cannot say a keyword (the regex path unrolls the recursion to its depth)."""
    if not any(_recursive(json.dumps(t.function.parameters)) for t in tools):
        return None
    return tool_call_lark(tools, parallel, mode, auto)


@dataclass(slots=True)
class ChatSetup:
    """How one chat request is prompted, constrained and read back."""

    prompt: str
    parser: ToolParser
    constraint: dict[str, Any]  # the engine constraint when the answer is one phase
    plan: Callable[[], AnswerPlan] | None  # else: a fresh plan of phases per choice
    reasoning: ReasoningSpec | None  # the reasoning to separate from the answer, if any
    buffer: bool  # tool calls and the response_format look alike: streamed whole at the end
    # the parsers' marker texts, spelled in the answer where they are special tokens
    markers: tuple[str, ...] = ()


def tool_parser_for(tokenizer: Any, name: str | None) -> ToolParser:
    """The server's `--tool-call-parser`, else the one the chat template's format asks for."""
    return get_parser(name or parser_for_template(getattr(tokenizer, "chat_template", None)))


def prepare_chat(
    tokenizer: Any, request: ChatRequest, mode: str, tool_parser: str | None,
    reasoning_parser: str | None, pool: Any = None,
) -> ChatSetup:  # fmt: skip
    """The prompt, the constraint or plan of phases, and the parsers of a chat request
    (`pool`: the server's compile pool, where its schemas are checked)."""
    parser = tool_parser_for(tokenizer, tool_parser)
    prompt = render_prompt(tokenizer, request, parser)
    spec = answer_spec(request, mode, parser, pool)
    reasoning = None
    if reasoning_parser is not None and request.thinking:
        rp = get_reasoning_parser(reasoning_parser)
        reasoning = ReasoningSpec(rp, rp.opens_in_prompt(prompt, True), request.reasoning_budget)
    plan = None
    if reasoning is not None and (spec.constraint or reasoning.budget is not None):
        plan = functools.partial(AnswerPlan, reasoning, spec)
    buffer = request.tool_mode and parser.trigger is None and has_output_format(request)
    separate = reasoning if request.separate_reasoning else None
    markers = parser.markers if request.tool_mode else ()
    if reasoning is not None:
        markers += (reasoning.parser.start, reasoning.parser.end)
    return ChatSetup(prompt, parser, spec.constraint, plan, separate, bool(buffer), markers)


def answer_spec(
    request: ChatRequest, mode: str, parser: ToolParser, pool: Any = None
) -> AnswerSpec:
    """The constraint of the answer (after any reasoning) in `parser`'s format."""
    if parser.name == "json" or not request.tool_mode:
        return AnswerSpec(chat_constraint(request, mode, pool))
    check_tool_schemas(request.tools, mode, functools.partial(check_schema, pool=pool))
    other = None
    if request.tool_choice == "auto" and has_output_format(request):
        fmt = response_format_constraint(request, mode, pool)
        other = _format_regex(request, fmt, mode)
    return tool_answer_spec(
        parser, request.tools, request.tool_choice, request.parallel, mode, other
    )


def _format_regex(request: ChatRequest, fmt: dict[str, Any], mode: str) -> str:
    """The response_format as a regex, to stand beside the calls (auto with tools)."""
    from grammar import GrammarError, choices_to_regex, json_schema_to_regex
    from grammar.json_schema.schema import load_schema
    from grammar.json_schema.strict import apply_mode

    field = constraint_field(request)
    if "regex" in fmt:
        return fmt["regex"]
    if "choices" in fmt:
        return choices_to_regex(fmt["choices"])
    if "json_schema" in fmt:
        try:
            return json_schema_to_regex(apply_mode(load_schema(fmt["json_schema"]), mode))
        except GrammarError as exc:
            msg = f"{field} cannot be combined with tools here: {exc}"
            raise APIError(400, msg, param=field, code="unsupported_schema_keyword") from exc
    raise APIError(
        400,
        f'{field} cannot be combined with tools here; send tool_choice "none" or drop the tools',
        param=field,
    )
