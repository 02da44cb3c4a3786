"""SGLang's helper endpoints for a finished text: `/parse_function_call` (the calls in a
model's format) and `/separate_reasoning` (its thinking apart from its answer)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from runtime.server.errors import APIError
from runtime.server.protocol import _Body
from runtime.server.state import get_state
from runtime.server.tools.reasoning import ReasoningParserError, get_reasoning_parser
from runtime.server.tools.registry import ToolParserError, get_parser
from runtime.server.tools.request import parse_tools

router = APIRouter()


class ParseFunctionCallRequest(_Body):
    text: str
    tool_call_parser: str | None = None
    tools: list[Any] = []


class SeparateReasoningRequest(_Body):
    text: str
    reasoning_parser: str | None = None


@router.post("/parse_function_call")
async def parse_function_call(body: ParseFunctionCallRequest, request: Request) -> Any:
    """`{"normal_text", "calls": [{"tool_index", "name", "parameters"}]}` as SGLang answers;
    the parser is the request's, else the server's."""
    state = get_state(request)
    name = body.tool_call_parser or state.tool_parser
    if name is None:
        from runtime.server.tools.registry import parser_for_template

        name = parser_for_template(getattr(state.tokenizer, "chat_template", None))
    try:
        parser = get_parser(name)
    except ToolParserError as exc:
        raise APIError(400, str(exc), param="tool_call_parser") from exc
    tools = parse_tools(body.tools) or []
    content, calls = parser.parse(body.text, tools)
    index = {t.function.name: i for i, t in enumerate(tools)}
    return {
        "normal_text": content or "",
        "calls": [
            {
                "tool_index": index[c["function"]["name"]],
                "name": c["function"]["name"],
                "parameters": c["function"]["arguments"],
            }
            for c in calls
        ],
    }


@router.post("/separate_reasoning")
async def separate_reasoning(body: SeparateReasoningRequest, request: Request) -> Any:
    """`{"text", "reasoning_text"}`: the answer and its reasoning, as SGLang answers."""
    state = get_state(request)
    name = body.reasoning_parser or state.reasoning_parser
    if name is None:
        raise APIError(400, "no reasoning parser given or served", param="reasoning_parser")
    try:
        parser = get_reasoning_parser(name)
    except ReasoningParserError as exc:
        raise APIError(400, str(exc), param="reasoning_parser") from exc
    reasoning, text = parser.split(body.text, parser.forced)
    return {"text": text, "reasoning_text": (reasoning or "").strip()}
