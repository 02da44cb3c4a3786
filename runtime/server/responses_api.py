"""OpenAI's Responses API: `POST /v1/responses` (streamed or not), `GET` / `DELETE
/v1/responses/{id}`, `GET /v1/responses/{id}/input_items`.

A request is read as the chat request it amounts to (`responses_input.to_chat`, with the
conversation of `previous_response_id` before it), runs through the chat route's phases
(`openai_api.chat_jobs`: the chat template, the tools' and `text.format`'s constraint, the
engine jobs; `chat_answer.ChatAnswer`: reasoning apart, calls parsed), and its answer is
written as Responses output items and events (`responses_output.ResponseItems`). With
`store` (the default) the response is kept in the server's bounded `response_store`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from runtime.scheduling.request import GenerateResult
from runtime.server.chat import ChatRequest
from runtime.server.chat_answer import ChatAnswer, ChoiceText
from runtime.server.errors import APIError
from runtime.server.generation import ChoiceStreams, SSEResponse
from runtime.server.openai_api import chat_jobs, closer, open_streams, run_jobs
from runtime.server.response_store import StoredResponse
from runtime.server.responses_input import ResponsesRequest, check_supported, input_items, to_chat
from runtime.server.responses_output import ResponseItems, new_id, usage
from runtime.server.state import ServerState, get_state

router = APIRouter()
# the id prefix of an input item of each type (OpenAI's)
_ID_PREFIX = {"function_call": "fc", "function_call_output": "fc_output", "reasoning": "rs"}


def _event(event: dict[str, Any]) -> str:
    """One server-sent event as OpenAI writes them: its type as the event name."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def _response_object(state: ServerState, body: ResponsesRequest, chat: ChatRequest) -> dict:
    """The response as it starts: the request's settings echoed, no output yet."""
    fmt = (body.text or {}).get("format") or {"type": "text"}
    effort = (body.reasoning or {}).get("effort")
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": None,
        "model": state.model_name,
        "output": [],
        "parallel_tool_calls": chat.parallel,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": effort, "summary": None},
        "service_tier": "default",
        "store": bool(body.store),
        "temperature": chat.temperature,
        "text": {"format": fmt, "verbosity": "medium"},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": list(body.tools or []),
        "top_logprobs": 0,
        "top_p": chat.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
        "metadata": dict(body.metadata or {}),
    }


def _deltas_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished chat message as the deltas `ResponseItems` reads."""
    out: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        out.append({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        out.append({"content": message["content"]})
    for k, call in enumerate(message.get("tool_calls") or []):
        out.append({"tool_calls": [{"index": k, **call}]})
    return out


def _reasoning_tokens(state: ServerState, items: ResponseItems) -> int:
    text = "".join(i["content"][0]["text"] for i in items.output if i["type"] == "reasoning")
    return len(state.tokenizer(text, add_special_tokens=False).input_ids) if text else 0


class _Turn:
    """One response being answered: what it needs to finish and to be stored."""

    def __init__(self, state: ServerState, body: ResponsesRequest, chat: ChatRequest,
                 answer: ChatAnswer, history: list[dict[str, Any]]) -> None:  # fmt: skip
        self.state = state
        self.body = body
        self.answer = answer
        # (each input item gets an id, as OpenAI lists them under input_items)
        own = [i if "id" in i else {"id": new_id(_ID_PREFIX.get(i.get("type"), "msg")), **i}
               for i in input_items(body)]  # fmt: skip
        self.inputs = [*history, *own]
        self.items = ResponseItems(_response_object(state, body, chat))

    def finish(self, result: GenerateResult, reason: str) -> list[dict[str, Any]]:
        self.state.record_usage([result], 1)
        events = self.items.finish(
            reason, usage([result], _reasoning_tokens(self.state, self.items))
        )
        if self.body.store:
            outputs = [dict(i) for i in self.items.output]
            self.state.responses.put(StoredResponse(self.items.response, self.inputs, outputs))
        return events

    def whole(self, result: GenerateResult) -> dict[str, Any]:
        message, reason = self.answer.message(result)
        for delta in _deltas_of(message):
            self.items.feed(delta)
        self.finish(result, reason)
        return self.items.response

    async def events(self, streams: ChoiceStreams, release: Any) -> AsyncIterator[str]:
        text = ChoiceText(self.answer)
        result: GenerateResult | None = None
        started = time.perf_counter()
        try:
            for event in self.items.start():
                yield _event(event)
            async for _, chunk in streams:
                if not chunk.finished:
                    text.text += chunk.text_delta
                    for delta in self.answer.deltas(text, final=False):
                        for event in self.items.feed(delta):
                            yield _event(event)
                    continue
                result = chunk.result
                deltas, reason = self.answer.last(text, result)
                for delta in deltas:
                    for event in self.items.feed(delta):
                        yield _event(event)
                for event in self.finish(result, reason):
                    yield _event(event)
        except APIError as exc:
            err = {"type": "error", "sequence_number": self.items.sequence, "code": exc.code,
                   "message": exc.message, "param": exc.param}  # fmt: skip
            yield _event(err)
        finally:
            if streams.cancelled or result is None:
                self.state.metrics.client_aborts += 1
            streams.close()
            release()
            self.state.metrics.record_stream_end(time.perf_counter() - started)


def _stored(state: ServerState, response_id: str, param: str | None = None) -> StoredResponse:
    stored = state.responses.get(response_id)
    if stored is None:
        raise APIError(404, f"no stored response with id {response_id!r}", param=param,
                       code="response_not_found")  # fmt: skip
    return stored


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request) -> Any:
    state = get_state(request)
    state.check_model(body.model)
    check_supported(body, state.reasoning_parser)
    history: list[dict[str, Any]] = []
    if body.previous_response_id:
        history = _stored(state, body.previous_response_id, "previous_response_id").conversation
    chat = to_chat(body, history)
    setup, jobs = await chat_jobs(state, chat)
    turn = _Turn(state, body, chat, ChatAnswer(state, chat, setup), history)
    admission = state.bridge.acquire(len(jobs))
    if body.stream:
        streams = await open_streams(state, jobs, admission)
        events = turn.events(streams, admission.release)
        return SSEResponse(events, on_close=closer(streams, admission))
    results = await run_jobs(state, jobs, request, admission)
    return turn.whole(results[0])


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> Any:
    return _stored(get_state(request), response_id).response


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Any:
    state = get_state(request)
    if not state.responses.delete(response_id):
        _stored(state, response_id)  # the 404
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def response_input_items(response_id: str, request: Request) -> Any:
    """The input items of a stored response (its chain's history and its own input), newest
    first as OpenAI lists them."""
    stored = _stored(get_state(request), response_id)
    data = list(reversed(stored.input_items))
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": False}  # fmt: skip
