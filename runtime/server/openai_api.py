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
from runtime.server.chat import ChatRequest, ChatSetup, CompletionsRequest, prepare_chat
from runtime.server.chat_answer import ChatAnswer
from runtime.server.errors import APIError
from runtime.server.generation import ChoiceStreams, Job, SSEResponse, collect, sse, sse_error
from runtime.server.protocol import BootstrapFields, SamplingFields
from runtime.server.state import ServerState, get_state
from runtime.server.structured import constraint_field, logit_bias, openai_constraint
from runtime.server.tools.request import forced_tools

router = APIRouter()

COMPLETION_DEFAULT_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint


def sampling_kwargs(body: SamplingFields, max_new_tokens: int, vocab_size: int) -> dict[str, Any]:
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    kwargs = {
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
    bias = logit_bias(body.logit_bias, vocab_size)
    if bias:
        kwargs["logit_bias"] = bias
    return kwargs


def _jobs(
    prompt_ids: list[int],
    kwargs: dict[str, Any],
    body: SamplingFields,
    field: str | None,
    plan: Any = None,
) -> list[Job]:
    # n samples with one seed would be n copies: give each choice its own seed
    seed = body.seed
    return [
        Job(
            prompt_ids,
            {**kwargs, "seed": None if seed is None else seed + i},
            constraint_field=field,
            plan=plan,
        )
        for i in range(body.n)
    ]


def with_room(jobs: list[Job], body: BootstrapFields) -> list[Job]:
    """PD mode: the gateway's bootstrap room goes with the request's one engine job."""
    boot = body.bootstrap()
    if boot:
        if len(jobs) != 1:
            raise APIError(
                400,
                f"a bootstrap_room names one generation, this request makes {len(jobs)} "
                "(several prompts or n > 1)",
                param="bootstrap_room",
            )
        jobs[0].kwargs.update(boot)
    return jobs


def closer(streams: ChoiceStreams, admission: Admission) -> Callable[[], None]:
    def close() -> None:
        streams.close()
        admission.release()

    return close


# ---- chat ----------------------------------------------------------------------------------
def json_schema_mode(state: ServerState, requested: str | None) -> str:
    """The request's mode, else the server's (`--json-schema-mode`), else "strict"."""
    return requested or getattr(state.engine, "json_schema_mode", None) or "strict"


async def chat_jobs(state: ServerState, body: ChatRequest) -> tuple[ChatSetup, list[Job]]:
    """A chat request's prompt, constraint and engine jobs (the Responses API's too)."""
    body.prepare()
    mode = json_schema_mode(state, body.json_schema_mode)
    bridge = state.bridge
    setup = await anyio.to_thread.run_sync(
        prepare_chat,
        state.tokenizer,
        body,
        mode,
        state.tool_parser,
        state.reasoning_parser,
        state.compile_pool,
    )
    prompt_ids = await bridge.encode_chat(setup.prompt)
    bridge.check_length(prompt_ids, "messages")
    forced = forced_tools(body.tools, body.tool_choice) is not None
    requested = (
        body.max_completion_tokens if body.max_completion_tokens is not None else (body.max_tokens)
    )
    max_new = bridge.clamp_max_tokens(len(prompt_ids), requested)
    kwargs = sampling_kwargs(body, max_new, state.engine.config.vocab_size)
    if setup.plan is None:
        kwargs.update(setup.constraint)
    if setup.markers:
        kwargs["keep_markers"] = setup.markers
    if body.logprobs or body.top_logprobs:
        kwargs.update(logprobs=True, top_logprobs=body.top_logprobs)
    field = "tools" if forced or (body.tool_mode and setup.plan) else constraint_field(body)
    return setup, with_room(_jobs(prompt_ids, kwargs, body, field, setup.plan), body)


async def open_streams(state: ServerState, jobs: list[Job], admission: Admission) -> ChoiceStreams:
    """The jobs' streams, started (a refused request fails here, before any byte is sent)."""
    try:
        streams = ChoiceStreams(state.bridge, jobs, param="messages")
        await streams.start()
        state.metrics.record_ttft(streams.ttft_s)
    except BaseException:
        admission.release()
        raise
    return streams


async def run_jobs(
    state: ServerState, jobs: list[Job], request: Request, admission: Admission
) -> list[GenerateResult]:
    try:
        return await collect(state.bridge, jobs, request, "messages", state.metrics_abort)
    finally:
        admission.release()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatRequest, request: Request) -> Any:
    state = get_state(request)
    state.check_model(body.requested_model())
    setup, jobs = await chat_jobs(state, body)
    chat = ChatAnswer(state, body, setup)
    admission = state.bridge.acquire(len(jobs))
    if body.stream:
        streams = await open_streams(state, jobs, admission)
        return SSEResponse(
            chat.events(streams, admission.release), on_close=closer(streams, admission)
        )
    return chat.response(await run_jobs(state, jobs, request, admission))


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
async def completions(body: CompletionsRequest, request: Request) -> Any:
    state = get_state(request)
    state.check_model(body.requested_model())
    if body.suffix:
        raise APIError(400, "suffix is not supported", param="suffix")
    bridge = state.bridge
    prompts = _prompts(body.prompt)
    mode = json_schema_mode(state, body.json_schema_mode)
    constraint = await anyio.to_thread.run_sync(openai_constraint, body, mode, state.compile_pool)
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
        max_new = bridge.clamp_max_tokens(len(ids), requested)
        kwargs = sampling_kwargs(body, max_new, state.engine.config.vocab_size)
        kwargs.update(constraint.kwargs)
        if body.logprobs is not None:
            kwargs.update(logprobs=True, top_logprobs=body.logprobs)
        jobs.extend(_jobs(ids, kwargs, body, constraint.param))
        prompt_texts.append(p if isinstance(p, str) else state.tokenizer.decode(p))
    with_room(jobs, body)
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
                        yield sse(R.with_usage(event, results, body))
                head = (rid, model, created)
                for line in R.closing_events(state, results, body.n, body, head,
                                             "text_completion"):  # fmt: skip
                    yield line
            except APIError as exc:
                yield sse_error(exc)
                yield sse("[DONE]")
            finally:
                if streams.cancelled or any(r is None for r in results):
                    state.metrics.client_aborts += 1
                streams.close()
                admission.release()
                state.metrics.record_stream_end(time.perf_counter() - started)

        return SSEResponse(events(), on_close=closer(streams, admission))
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
