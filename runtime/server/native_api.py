"""Native endpoints: `/generate`, `/score`, and what the DSL's `RuntimeEndpoint` needs to know
about the model (`/get_model_info`, `/apply_chat_template`, `/stats`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Request

from runtime.scheduling.request import GenerateResult
from runtime.server.chat import check_schema
from runtime.server.errors import APIError
from runtime.server.generation import ChoiceStreams, Job, SSEResponse, collect, sse, sse_error
from runtime.server.protocol import ChatTemplateRequest, GenerateRequest, ScoreRequest
from runtime.server.state import get_state

router = APIRouter()

DEFAULT_MAX_NEW_TOKENS = 128
SAMPLING_KEYS = frozenset(
    (
        "max_new_tokens",
        "min_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
        "seed",
        "sampling_seed",  # SGLang's name for `seed` (the gateway keeps it, drops `seed`)
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "regex",
        "json_schema",
        "choices",
        "dtype",
        "grammar",
        "ebnf",  # SGLang's name for a grammar field (the gateway keeps it); lark text here
        "jump_forward",
    )
)


def _meta(result: GenerateResult, top_n: int) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "cached_tokens": result.usage.cached_tokens,
        "decode_steps": result.usage.decode_steps,
        "finish_reason": {"type": result.finish_reason, "matched": result.matched_stop},
    }
    if result.logprobs is not None:
        meta["output_token_logprobs"] = list(result.logprobs)
    if result.top_logprobs is not None and top_n:
        meta["output_top_logprobs"] = [
            {str(t): v for t, v in sorted(top.items(), key=lambda kv: -kv[1])[:top_n]}
            for top in result.top_logprobs
        ]
    return meta


def _output(result: GenerateResult, top_n: int) -> dict[str, Any]:
    return {"text": result.text, "output_ids": result.token_ids, "meta_info": _meta(result, top_n)}


def _sampling(body: GenerateRequest) -> dict[str, Any]:
    params = dict(body.sampling_params)
    unknown = sorted(set(params) - SAMPLING_KEYS)
    if unknown:
        raise APIError(
            400,
            f"unknown sampling parameter(s) {unknown}; known: {sorted(SAMPLING_KEYS)}",
            param="sampling_params",
        )
    params = {k: v for k, v in params.items() if v is not None}
    if "ebnf" in params:
        lark_text = params.pop("ebnf")
        if params.setdefault("grammar", lark_text) != lark_text:
            raise APIError(400, "grammar and ebnf differ", param="sampling_params")
    if "sampling_seed" in params:
        seed = params.pop("sampling_seed")
        if params.setdefault("seed", seed) != seed:
            raise APIError(400, "seed and sampling_seed differ", param="sampling_params")
    if body.return_logprob or body.top_logprobs_num:
        params.update(logprobs=True, top_logprobs=body.top_logprobs_num)
    return params


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request) -> Any:
    state = get_state(request)
    bridge = state.bridge
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "give exactly one of text and input_ids", param="text")
    raw = body.text if body.text is not None else body.input_ids
    single = isinstance(raw, str) or (bool(raw) and isinstance(raw[0], int))
    prompts = [raw] if single else list(raw or [])
    if not prompts:
        raise APIError(400, "no prompt given", param="text")
    if body.stream and not single:
        raise APIError(400, "stream=true takes one prompt", param="stream")
    params = _sampling(body)
    if "json_schema" in params:
        await anyio.to_thread.run_sync(check_schema, params["json_schema"], "json_schema")
    param = "text" if body.text is not None else "input_ids"
    jobs = []
    for p in prompts:
        ids = await bridge.encode(p)
        bridge.check_length(ids, param)
        requested = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if not isinstance(requested, int) or requested < 0:
            raise APIError(400, "max_new_tokens must be an integer >= 0", param="max_new_tokens")
        kw = {**params, "max_new_tokens": bridge.clamp_max_tokens(len(ids), requested)}
        jobs.append(Job(ids, kw))
    admission = bridge.acquire(len(jobs))
    top_n = body.top_logprobs_num
    if body.stream:
        try:
            streams = ChoiceStreams(bridge, jobs, param=param)
            await streams.start()
            state.metrics.record_ttft(streams.ttft_s)
        except BaseException:
            admission.release()
            raise

        async def events() -> AsyncIterator[str]:
            text, done, started = "", False, time.perf_counter()
            try:
                async for _, chunk in streams:
                    text += chunk.text_delta
                    event: dict[str, Any] = {
                        "text": text,
                        "delta": chunk.text_delta,
                        "token_ids": chunk.token_ids,
                    }
                    if chunk.finished:
                        done = True
                        event.update(_output(chunk.result, top_n))
                        state.record_usage([chunk.result], 1)
                    yield sse(event)
                yield sse("[DONE]")
            except APIError as exc:
                yield sse_error(exc)
                yield sse("[DONE]")
            finally:
                if not done:
                    state.metrics.client_aborts += 1
                streams.close()
                admission.release()
                state.metrics.record_stream_end(time.perf_counter() - started)

        def close() -> None:
            streams.close()
            admission.release()

        return SSEResponse(events(), on_close=close)
    try:
        results = await collect(bridge, jobs, request, param, state.metrics_abort)
    finally:
        admission.release()
    state.record_usage(results, 1)
    outputs = [_output(r, top_n) for r in results]
    return outputs[0] if single else outputs


@router.post("/score")
async def score(body: ScoreRequest, request: Request) -> Any:
    state = get_state(request)
    bridge = state.bridge
    prompt_ids = await bridge.encode(body.prompt)
    bridge.check_length(prompt_ids, "prompt")
    tok = state.tokenizer

    def longest_continuation() -> int:
        return max(
            len(tok(c, add_special_tokens=False).input_ids) if isinstance(c, str) else len(c)
            for c in body.continuations
        )

    longest = await anyio.to_thread.run_sync(longest_continuation)
    bridge.check_length([0] * (len(prompt_ids) + longest), "continuations")
    admission = bridge.acquire(len(body.continuations))
    try:
        per_token = await bridge.run(
            lambda: state.engine.score(prompt_ids, body.continuations, return_token_logprobs=True)
        )
    finally:
        admission.release()
    return {
        "token_logprobs": per_token,
        "logprobs": [float(sum(lps)) for lps in per_token],
        "prompt_tokens": len(prompt_ids),
    }


@router.get("/get_model_info")
async def model_info(request: Request) -> dict[str, Any]:
    state = get_state(request)
    tok = state.tokenizer
    template = getattr(tok, "chat_template", None)
    return {
        "model_path": str(state.engine.model_path),
        "served_model_name": state.model_name,
        "context_length": state.bridge.context_len,
        "vocab_size": state.engine.config.vocab_size,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "has_chat_template": bool(template),
        "radix_cache": getattr(state.engine, "tree", None) is not None,
        "chat_template": template if isinstance(template, str) else None,
    }


@router.post("/apply_chat_template")
async def apply_chat_template(body: ChatTemplateRequest, request: Request) -> dict[str, Any]:
    """Render raw messages with the model's template (how `RuntimeEndpoint` learns roles)."""
    tok = get_state(request).tokenizer
    if not getattr(tok, "chat_template", None):
        raise APIError(400, "the model has no chat template", code="no_chat_template")
    try:
        text = tok.apply_chat_template(
            body.messages, tokenize=False, add_generation_prompt=body.add_generation_prompt
        )
    except Exception as exc:
        msg = f"chat template rejected the messages: {exc}"
        raise APIError(400, msg, param="messages") from exc
    return {"text": text}


@router.post("/flush_cache")
async def flush_cache(request: Request) -> dict[str, Any]:
    """Drop every cached page no running request uses (for benchmarks and tests)."""
    state = get_state(request)
    return {"flushed": bool(await state.bridge.run(state.engine.flush_cache))}


@router.get("/stats")
async def stats(request: Request) -> dict[str, Any]:
    state = get_state(request)
    engine_stats = await state.bridge.run(state.engine.stats)
    return {
        **engine_stats,
        "server_in_flight": state.bridge.in_flight,
        "server_capacity": state.bridge.capacity,
        "draining": state.bridge.draining,
        "client_aborts": state.metrics.client_aborts,
    }
