"""`/v1/completions` and `/v1/chat/completions`, answered from the engine."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from fastapi import APIRouter, Request

from runtime.scheduling.request import GenerateResult
from runtime.server import responses as R
from runtime.server.bridge import Admission
from runtime.server.chat import check_schema, render_prompt, response_format_constraint
from runtime.server.errors import APIError
from runtime.server.generation import ChoiceStreams, Job, SSEResponse, collect, sse, sse_error
from runtime.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from runtime.server.state import ServerState, get_state
from runtime.server.tools import (
    auto_tool_regex,
    forced_tools,
    parse_tool_call,
    tool_call_schema,
)

router = APIRouter()

COMPLETION_DEFAULT_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint


def sampling_kwargs(body: SamplingFields, max_new_tokens: int) -> dict[str, Any]:
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    return {
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": min(body.min_tokens, max_new_tokens),
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
        "stop": stop or None,
        "stop_token_ids": body.stop_token_ids,
        "ignore_eos": body.ignore_eos,
    }


def _jobs(prompt_ids: list[int], kwargs: dict[str, Any], n: int, seed: int | None) -> list[Job]:
    # n samples with one seed would be n copies: give each choice its own seed
    return [
        Job(prompt_ids, {**kwargs, "seed": None if seed is None else seed + i}) for i in range(n)
    ]


def _closer(streams: ChoiceStreams, admission: Admission) -> Callable[[], None]:
    def close() -> None:
        streams.close()
        admission.release()

    return close


def _with_usage(event: dict[str, Any], results: list[Any], body: SamplingFields) -> dict:
    """The last finish chunk carries the usage, unless a separate usage chunk was asked for."""
    if not body.include_usage_chunk() and all(r is not None for r in results):
        event["usage"] = R.usage_of(results, body.n)
    return event


# ---- chat ----------------------------------------------------------------------------------
@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    state = get_state(request)
    state.check_model(body.model)
    bridge = state.bridge
    prompt = render_prompt(state.tokenizer, body)
    prompt_ids = await bridge.encode(prompt)
    bridge.check_length(prompt_ids, "messages")
    forced = forced_tools(body)
    tool_mode = bool(body.tools) and body.tool_choice != "none"
    if forced is not None:
        schema = tool_call_schema(forced)
        await anyio.to_thread.run_sync(check_schema, schema, "tools")
        constraint: dict[str, Any] = {"json_schema": schema}
    else:
        constraint = await anyio.to_thread.run_sync(response_format_constraint, body)
        if tool_mode and not constraint and body.tool_choice in (None, "auto"):
            regex = await anyio.to_thread.run_sync(auto_tool_regex, body.tools)
            constraint = {"regex": regex} if regex else {}
    requested = (
        body.max_completion_tokens if body.max_completion_tokens is not None else (body.max_tokens)
    )
    kwargs = sampling_kwargs(body, bridge.clamp_max_tokens(len(prompt_ids), requested))
    kwargs.update(constraint)
    if body.logprobs or body.top_logprobs:
        kwargs.update(logprobs=True, top_logprobs=body.top_logprobs)
    jobs = _jobs(prompt_ids, kwargs, body.n, body.seed)
    chat = _Chat(state, body, tool_mode)
    admission = bridge.acquire(len(jobs))
    if body.stream:
        try:
            streams = ChoiceStreams(bridge, jobs, param="messages")
            await streams.start()
            state.metrics.record_ttft(streams.ttft_s)
        except BaseException:
            admission.release()
            raise
        return SSEResponse(
            chat.events(streams, admission.release), on_close=_closer(streams, admission)
        )
    try:
        results = await collect(bridge, jobs, request, "messages", state.metrics_abort)
    finally:
        admission.release()
    return chat.response(results)


class _Chat:
    """Builds a chat completion (or its chunks) from engine results."""

    def __init__(self, state: ServerState, body: ChatCompletionRequest, tool_mode: bool) -> None:
        self.state = state
        self.body = body
        self.tool_mode = tool_mode
        self.rid = R.new_id("chatcmpl")
        self.created = R.now()

    def _message(self, result: GenerateResult) -> tuple[dict[str, Any], str]:
        reason = R.finish_reason(result)
        call = parse_tool_call(result.text, self.body.tools or []) if self.tool_mode else None
        if call is not None:
            return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        return {"role": "assistant", "content": result.text}, reason

    def response(self, results: list[GenerateResult]) -> dict[str, Any]:
        self.state.record_usage(results, self.body.n)
        choices = []
        for i, result in enumerate(results):
            message, reason = self._message(result)
            lp = R.chat_logprobs(self.state.tokenizer, result, self.body.top_logprobs)
            choices.append(
                {"index": i, "message": message, "logprobs": lp, "finish_reason": reason}
            )
        return {
            "id": self.rid,
            "object": "chat.completion",
            "created": self.created,
            "model": self.state.model_name,
            "choices": choices,
            "usage": R.usage_of(results, self.body.n),
        }

    async def events(self, streams: ChoiceStreams, release: Any) -> AsyncIterator[str]:
        model, rid, created = self.state.model_name, self.rid, self.created
        results: list[GenerateResult | None] = [None] * self.body.n
        started = time.perf_counter()
        try:
            for i in range(self.body.n):
                yield sse(
                    R.chat_chunk(rid, model, created, i, {"role": "assistant", "content": ""})
                )
            async for index, chunk in streams:
                if chunk.text_delta and not self.tool_mode:
                    yield sse(
                        R.chat_chunk(rid, model, created, index, {"content": chunk.text_delta})
                    )
                if not chunk.finished:
                    continue
                result = chunk.result
                results[index] = result
                delta: dict[str, Any] = {}
                reason = R.finish_reason(result)
                if self.tool_mode:
                    message, reason = self._message(result)
                    if message.get("tool_calls"):
                        delta = {"tool_calls": [{"index": 0, **message["tool_calls"][0]}]}
                    else:
                        delta = {"content": result.text}
                lp = R.chat_logprobs(self.state.tokenizer, result, self.body.top_logprobs)
                event = R.chat_chunk(rid, model, created, index, delta, reason, lp)
                yield sse(_with_usage(event, results, self.body))
            done = [r for r in results if r is not None]
            self.state.record_usage(done, self.body.n)
            if self.body.include_usage_chunk():
                usage = R.usage_of(done, self.body.n)
                yield sse(R.usage_chunk(rid, model, created, "chat.completion.chunk", usage))
            yield sse("[DONE]")
        except APIError as exc:
            yield sse_error(exc)
            yield sse("[DONE]")
        finally:
            if streams.cancelled or any(r is None for r in results):
                self.state.metrics.client_aborts += 1
            streams.close()
            release()
            self.state.metrics.record_stream_end(time.perf_counter() - started)


# ---- completions ---------------------------------------------------------------------------
def _prompts(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt is empty", param="prompt")
    if isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Any:
    state = get_state(request)
    state.check_model(body.model)
    if body.suffix:
        raise APIError(400, "suffix is not supported", param="suffix")
    bridge = state.bridge
    prompts = _prompts(body.prompt)
    constraint: dict[str, Any] = {}
    if body.json_schema is not None:
        await anyio.to_thread.run_sync(check_schema, body.json_schema, "json_schema")
        constraint["json_schema"] = body.json_schema
    elif body.regex is not None:
        constraint["regex"] = body.regex
    jobs: list[Job] = []
    prompt_texts: list[str] = []
    prompt_ids: list[list[int]] = []
    for p in prompts:
        ids = await bridge.encode(p)
        bridge.check_length(ids, "prompt")
        prompt_ids.append(ids)
        requested = (
            body.max_tokens if body.max_tokens is not None else (COMPLETION_DEFAULT_MAX_TOKENS)
        )
        kwargs = sampling_kwargs(body, bridge.clamp_max_tokens(len(ids), requested))
        kwargs.update(constraint)
        if body.logprobs is not None:
            kwargs.update(logprobs=True, top_logprobs=body.logprobs)
        jobs.extend(_jobs(ids, kwargs, body.n, body.seed))
        prompt_texts.append(p if isinstance(p, str) else state.tokenizer.decode(p))
    rid, created, model = R.new_id("cmpl"), R.now(), state.model_name
    admission = bridge.acquire(len(jobs))

    def prefix(index: int) -> str:
        return prompt_texts[index // body.n] if body.echo else ""

    def logprobs(result: GenerateResult, index: int) -> dict[str, Any] | None:
        return R.completion_logprobs(
            state.tokenizer, result, body.logprobs or 0, len(prefix(index))
        )

    if body.stream:
        try:
            streams = ChoiceStreams(bridge, jobs, param="prompt")
            await streams.start()
            state.metrics.record_ttft(streams.ttft_s)
        except BaseException:
            admission.release()
            raise

        async def events() -> AsyncIterator[str]:
            results: list[GenerateResult | None] = [None] * len(jobs)
            started = time.perf_counter()
            try:
                for i in range(len(jobs)):
                    if prefix(i):
                        yield sse(R.completion_chunk(rid, model, created, i, prefix(i)))
                async for index, chunk in streams:
                    if chunk.text_delta:
                        yield sse(R.completion_chunk(rid, model, created, index, chunk.text_delta))
                    if chunk.finished:
                        result = results[index] = chunk.result
                        lp = logprobs(result, index)
                        reason = R.finish_reason(result)
                        event = R.completion_chunk(rid, model, created, index, "", reason, lp)
                        yield sse(_with_usage(event, results, body))
                done = [r for r in results if r is not None]
                state.record_usage(done, body.n)
                if body.include_usage_chunk():
                    usage = R.usage_of(done, body.n)
                    yield sse(R.usage_chunk(rid, model, created, "text_completion", usage))
                yield sse("[DONE]")
            except APIError as exc:
                yield sse_error(exc)
                yield sse("[DONE]")
            finally:
                if streams.cancelled or any(r is None for r in results):
                    state.metrics.client_aborts += 1
                streams.close()
                admission.release()
                state.metrics.record_stream_end(time.perf_counter() - started)

        return SSEResponse(events(), on_close=_closer(streams, admission))
    echoed: list[dict[str, Any]] = []
    try:
        if body.echo and body.logprobs is not None:
            # echo + logprobs: the prompt's tokens and their log-probs come first (OpenAI's
            # legacy behaviour; `max_tokens: 0` makes it a scoring call)
            for ids in prompt_ids:
                echoed.append(await _prompt_logprobs(state, ids))
        results = await collect(bridge, jobs, request, "prompt", state.metrics_abort)
    finally:
        admission.release()
    state.record_usage(results, body.n)
    choices = [
        {
            "index": i,
            "text": prefix(i) + r.text,
            "logprobs": _prepend(echoed[i // body.n], logprobs(r, i)) if echoed else logprobs(r, i),
            "finish_reason": R.finish_reason(r),
        }
        for i, r in enumerate(results)
    ]
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": R.usage_of(results, body.n),
    }


async def _prompt_logprobs(state: ServerState, ids: list[int]) -> dict[str, Any]:
    """`logprobs` entries for the prompt's own tokens (the first has none: nothing precedes it),
    computed as `/score` computes a continuation's: each token given the ones before it."""
    lps: list[float] = []
    if len(ids) > 1:
        lps = (
            await state.bridge.run(
                lambda: state.engine.score(ids[:1], [ids[1:]], return_token_logprobs=True)
            )
        )[0]
    tokens = [state.tokenizer.decode([t]) for t in ids]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [None, *lps],
        "top_logprobs": [None] * len(tokens),  # alternatives are not computed for the prompt
        "text_offset": offsets,
    }


def _prepend(prompt: dict[str, Any], generated: dict[str, Any] | None) -> dict[str, Any]:
    if generated is None:
        return prompt
    return {key: prompt[key] + generated[key] for key in prompt}
