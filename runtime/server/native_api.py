"""Native endpoints: `/generate`, `/score`, and what the DSL's `RuntimeEndpoint` needs to know
about the model (`/get_model_info`, `/apply_chat_template`, `/stats`)."""

from __future__ import annotations

import asyncio
import functools
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Request

from runtime.scheduling.request import GenerateResult
from runtime.server.errors import APIError
from runtime.server.generation import ChoiceStreams, Job, SSEResponse, collect, sse, sse_error
from runtime.server.protocol import (
    ChatTemplateRequest,
    ConcatAppendRequest,
    GenerateRequest,
    ScoreRequest,
)
from runtime.server.state import get_state
from runtime.server.structured import OutputConstraint, logit_bias, native_constraint
from runtime.server.tools.plan import AnswerPlan, AnswerSpec, ReasoningSpec
from runtime.server.tools.reasoning import END as THINK_END
from runtime.server.tools.reasoning import START as THINK_START
from runtime.server.tools.reasoning import get_reasoning_parser

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
        "ebnf",  # a GBNF grammar, as SGLang reads it
        "structural_tag",  # XGrammar's or SGLang's shape, a dict or its JSON text
        "lark",  # a lark grammar (ours)
        "grammar",  # the same, under the name `gen(grammar=...)` has
        "logit_bias",  # token id -> bias in [-100, 100], as OpenAI's
        "jump_forward",
        "json_schema_mode",  # "strict" (objects emit only declared properties) or "exact"
        "token_healing",  # ours: heal the prompt's end (runtime/scheduling/healing.py)
        # SGLang's SamplingParams, honoured by the server on top of the engine
        "n",  # n engine requests per prompt
        "stop_regex",  # watched in the decoded text (generation.RegexStopStream)
        "no_stop_trim",  # the matched stop string stays in the text
        # SGLang's, accepted: they change nothing here (special tokens are skipped and never
        # spaced, the markers of docs/tools-and-reasoning.md aside; every chunk is streamed)
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stream_interval",
        "custom_params",
        "ebnf_full_assistant",
    )
)
# SGLang's SamplingParams fields this engine cannot honour: accepted when unset, else a 400
UNSUPPORTED_KEYS = ("watermark", "beam_width")
SERVER_KEYS = ("n", "stop_regex", "no_stop_trim", *UNSUPPORTED_KEYS)
SERVER_KEYS += ("skip_special_tokens", "spaces_between_special_tokens", "stream_interval")
SERVER_KEYS += ("custom_params", "ebnf_full_assistant")


def _logprob_entries(
    tok: Any, lps: list[float | None], ids: list[int], with_text: bool
) -> list[list[Any]]:
    """SGLang's `[logprob, token_id, text or None]` triples."""
    texts = [tok.decode([t]) for t in ids] if with_text else [None] * len(ids)
    return [[lp, t, x] for lp, t, x in zip(lps, ids, texts, strict=True)]


def _meta(
    result: GenerateResult, opts: dict[str, Any], tok: Any, input_lps: Any = None
) -> dict[str, Any]:
    reason: dict[str, Any] = {"type": result.finish_reason, "matched": result.matched_stop}
    if result.finish_reason == "length":
        reason["length"] = result.usage.completion_tokens
    meta: dict[str, Any] = {
        "id": opts["rid"],
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "cached_tokens": result.usage.cached_tokens,
        "decode_steps": result.usage.decode_steps,
        "finish_reason": reason,
    }
    if result.usage.spec_verify_ct:  # speculative decoding, SGLang's names
        meta["spec_verify_ct"] = result.usage.spec_verify_ct
        meta["spec_accept_length"] = result.usage.spec_accept_length
    if opts.get("constraint"):  # the field whose constraint the output obeys (ours)
        meta["constraint"] = opts["constraint"]
    top_n, sglang_shape, with_text = opts["top_n"], opts["sglang_shape"], opts["with_text"]
    if result.logprobs is not None:
        lps = list(result.logprobs)
        meta["output_token_logprobs"] = (
            _logprob_entries(tok, lps, result.token_ids, with_text) if sglang_shape else lps
        )
    if result.top_logprobs is not None and top_n:
        tops = [sorted(top.items(), key=lambda kv: -kv[1])[:top_n] for top in result.top_logprobs]
        if sglang_shape:
            meta["output_top_logprobs"] = [
                _logprob_entries(tok, [v for _, v in top], [t for t, _ in top], with_text)
                for top in tops
            ]
        else:
            meta["output_top_logprobs"] = [{str(t): v for t, v in top} for top in tops]
    if input_lps is not None:
        meta["input_token_logprobs"] = input_lps
        if top_n:
            meta["input_top_logprobs"] = [None] * len(input_lps)  # not computed by the engine
    return meta


def _output(
    result: GenerateResult, opts: dict[str, Any], tok: Any, input_lps: Any = None
) -> dict[str, Any]:
    text = result.text
    if opts["no_stop_trim"] and isinstance(result.matched_stop, str):
        text += result.matched_stop
    meta = _meta(result, opts, tok, input_lps)
    out = {"text": text, "output_ids": result.token_ids, "meta_info": meta}
    spec = opts.get("separate")
    if spec is not None:  # separate_reasoning: the answer in `text`, the reasoning apart
        out["reasoning_text"], out["text"] = spec.parser.split(text, spec.open_at_start)
    return out


def _reasoning(
    state: Any, body: GenerateRequest, prompt: str, constraint: dict[str, Any]
) -> tuple[Any, ReasoningSpec | None]:
    """(a plan of phases or None, the reasoning to separate or None) of one /generate prompt:
    `require_reasoning` starts the constraint after the reasoning, `max_thinking_tokens`
    forces `</think>` when spent, `separate_reasoning` splits the text (all three need the
    server's reasoning parser)."""
    asked = [
        name
        for name, on in (
            ("require_reasoning", body.require_reasoning),
            ("max_thinking_tokens", body.max_thinking_tokens is not None),
            ("separate_reasoning", body.separate_reasoning),
        )
        if on
    ]
    if not asked:
        return None, None
    if state.reasoning_parser is None:
        msg = f"{asked[0]} needs a reasoning parser: start the server with --reasoning-parser"
        raise APIError(400, msg, param=asked[0])
    rp = get_reasoning_parser(state.reasoning_parser)
    spec = ReasoningSpec(rp, rp.opens_in_prompt(prompt, True), body.max_thinking_tokens)
    plan = None
    if body.require_reasoning or body.max_thinking_tokens is not None:
        # without require_reasoning the constraint starts at the first token, as SGLang's
        answer = AnswerSpec(dict(constraint) if body.require_reasoning else {})
        if body.require_reasoning or not constraint:
            plan = functools.partial(AnswerPlan, spec, answer)
        else:
            msg = "max_thinking_tokens with a constraint needs require_reasoning: true"
            raise APIError(400, msg, param="max_thinking_tokens")
    return plan, (spec if body.separate_reasoning else None)


def _sampling(
    raw: dict[str, Any], return_logprob: bool, top_n: int, vocab_size: int, pool: Any = None
) -> tuple[dict[str, Any], OutputConstraint]:
    """Engine keywords from one `sampling_params` dict (SGLang's server-side keys removed),
    and its output constraint (whose engine keywords are among them)."""
    params = dict(raw)
    unknown = sorted(set(params) - SAMPLING_KEYS - set(UNSUPPORTED_KEYS))
    if unknown:
        raise APIError(
            400,
            f"unknown sampling parameter(s) {unknown}; known: {sorted(SAMPLING_KEYS)}",
            param="sampling_params",
        )
    for key in UNSUPPORTED_KEYS:
        if params.get(key) not in (None, {}, [], "", 1 if key == "beam_width" else None):
            raise APIError(400, f"sampling_params.{key} is not supported here", param=key)
    params = {k: v for k, v in params.items() if v is not None and k not in SERVER_KEYS}
    bias = logit_bias(params.pop("logit_bias", None), vocab_size)
    if bias:
        params["logit_bias"] = bias
    if "sampling_seed" in params:
        seed = params.pop("sampling_seed")
        if params.setdefault("seed", seed) != seed:
            raise APIError(400, "seed and sampling_seed differ", param="sampling_params")
    if "stop" in params and not params["stop"]:
        del params["stop"]  # SGLang's frontend sends [] for "no stop strings"
    if not isinstance(params.get("token_healing", False), bool):
        raise APIError(400, "token_healing must be true or false", param="token_healing")
    if params.get("json_schema_mode", "strict") not in ("strict", "exact"):
        raise APIError(
            400, "json_schema_mode must be 'strict' or 'exact'", param="json_schema_mode"
        )
    constraint = native_constraint(params, pool)
    params.update(constraint.kwargs)
    if return_logprob or top_n:
        params.update(logprobs=True, top_logprobs=top_n)
    return params, constraint


def _stop_regex(raw: dict[str, Any]) -> tuple[re.Pattern[str], ...]:
    given = raw.get("stop_regex") or ()
    try:
        return tuple(re.compile(p) for p in ([given] if isinstance(given, str) else given))
    except (re.error, TypeError) as exc:
        raise APIError(400, f"invalid stop_regex: {exc}", param="stop_regex") from exc


def _n(raw: dict[str, Any]) -> int:
    n = raw.get("n", 1)
    n = 1 if n is None else n
    if not isinstance(n, int) or not 1 <= n <= 64:
        raise APIError(422, "sampling_params.n must be an integer in [1, 64]", param="n")
    return n


def _pick(value: Any, i: int) -> Any:
    """A per-prompt value of SGLang's batch fields (one value, or one per prompt)."""
    return value[i] if isinstance(value, list) else value


async def _input_logprobs(
    state: Any, ids: list[int], start: int | None, with_text: bool
) -> list[list[Any]]:
    """SGLang's input_token_logprobs from `start` (-1 / None: none), scored through the
    engine's `score` (the prompt's own KV is in the cache by now); the first token's is None."""
    if start is None or start < 0 or start >= len(ids):
        return []
    lps: list[float | None] = []
    if len(ids) > max(start, 1):
        split = max(start, 1)
        scored = await state.bridge.run(
            lambda: state.engine.score(ids[:split], [ids[split:]], return_token_logprobs=True)
        )
        lps = list(scored[0])
    if start == 0:
        lps = [None, *lps]
    return _logprob_entries(state.tokenizer, lps, ids[start:], with_text)


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request) -> Any:
    state = get_state(request)
    bridge = state.bridge
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "give exactly one of text and input_ids", param="text")
    for media in ("image_data", "video_data", "audio_data"):
        if getattr(body, media) not in (None, [], ""):
            raise APIError(400, f"{media}: this server serves text-only models", param=media)
    raw = body.text if body.text is not None else body.input_ids
    single = isinstance(raw, str) or (bool(raw) and isinstance(raw[0], int))
    prompts = [raw] if single else list(raw or [])
    if not prompts:
        raise APIError(400, "no prompt given", param="text")
    raw_params = body.sampling_params if body.sampling_params is not None else {}
    if isinstance(raw_params, list) and len(raw_params) != len(prompts):
        raise APIError(400, "one sampling_params per prompt", param="sampling_params")
    per_prompt = [_pick(raw_params, i) for i in range(len(prompts))]
    counts = [_n(p) for p in per_prompt]
    # SGLang's shape: `[logprob, id, text]` triples (text None unless return_text_in_logprobs)
    sglang_shape = True
    param = "text" if body.text is not None else "input_ids"
    tok = state.tokenizer
    jobs, opts, input_starts = [], [], []
    for i, p in enumerate(prompts):
        top_n = _pick(body.top_logprobs_num, i) or 0
        if not isinstance(top_n, int) or not 0 <= top_n <= 20:
            raise APIError(422, "top_logprobs_num must be in [0, 20]", param="top_logprobs_num")
        want_lp = bool(_pick(body.return_logprob, i))
        vocab_size = state.engine.config.vocab_size
        params, constraint = await anyio.to_thread.run_sync(
            _sampling, per_prompt[i], want_lp, top_n, vocab_size, state.compile_pool
        )
        ids = await bridge.encode(p)
        bridge.check_length(ids, param)
        requested = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if not isinstance(requested, int) or requested < 0:
            raise APIError(400, "max_new_tokens must be an integer >= 0", param="max_new_tokens")
        kw = {**params, "max_new_tokens": bridge.clamp_max_tokens(len(ids), requested)}
        text = p if isinstance(p, str) else tok.decode(ids)
        plan, separate = _reasoning(state, body, text, constraint.kwargs)
        if plan is not None or separate is not None:
            kw["keep_markers"] = (THINK_START, THINK_END)
        rid = _pick(body.rid, i) or uuid.uuid4().hex
        for k in range(counts[i]):
            job = Job(ids, kw, _stop_regex(per_prompt[i]), constraint.param, plan)
            jobs.append((ids, job))
            opts.append(
                {
                    "rid": rid if counts[i] == 1 else f"{rid}-{k}",
                    "top_n": top_n,
                    "sglang_shape": sglang_shape,
                    "with_text": body.return_text_in_logprobs,
                    "no_stop_trim": bool(per_prompt[i].get("no_stop_trim")),
                    "constraint": constraint.param,
                    "separate": separate,
                }
            )
            # SGLang: with return_logprob, input logprobs from logprob_start_len (-1 or unset:
            # none, an empty list); without it, no input_token_logprobs at all
            start = _pick(body.logprob_start_len, i)
            input_starts.append((-1 if start is None else start) if want_lp else None)
    if body.bootstrap_room is not None:  # PD mode: one generation per room
        boot = body.bootstrap()  # (a 400 for several rooms)
        if len(jobs) != 1:
            raise APIError(
                400,
                f"a bootstrap_room names one generation, this request makes {len(jobs)} "
                "(a batch or n > 1)",
                param="bootstrap_room",
            )
        jobs[0][1].kwargs.update(boot)
    admission = bridge.acquire(len(jobs))
    if body.stream:
        return await _stream(state, [j for _, j in jobs], param, opts, admission)
    try:
        results = await collect(bridge, [j for _, j in jobs], request, param, state.metrics_abort)
        inputs = await asyncio.gather(
            *(
                # the prompt the engine ran: token healing backs its end off
                _input_logprobs(state, list(r.prompt_token_ids) or ids, start, o["with_text"])
                for r, (ids, _), o, start in zip(results, jobs, opts, input_starts, strict=True)
            )
        )  # one engine score request each, batched by the scheduler
        outputs = [
            _output(result, o, tok, lps if start is not None else None)
            for result, o, start, lps in zip(results, opts, input_starts, inputs, strict=True)
        ]
    finally:
        admission.release()
    state.record_usage(results, 1)
    return outputs[0] if single and len(outputs) == 1 else outputs


async def _stream(
    state: Any, jobs: list[Job], param: str, opts: list[dict[str, Any]], admission: Any
) -> SSEResponse:
    """SGLang's stream: every event has the cumulative `text` and `meta_info` (finish_reason
    null until the last), plus our `delta` / `token_ids`; several prompts or `n` > 1 add the
    output's `index` (prompt-major, as a plain answer lists them); then `data: [DONE]`."""
    try:
        streams = ChoiceStreams(state.bridge, jobs, param=param)
        await streams.start()
        state.metrics.record_ttft(streams.ttft_s)
    except BaseException:
        admission.release()
        raise
    tok, many = state.tokenizer, len(jobs) > 1

    async def events() -> AsyncIterator[str]:
        texts, counts, started = [""] * len(jobs), [0] * len(jobs), time.perf_counter()
        left = len(jobs)
        try:
            async for i, chunk in streams:
                texts[i] += chunk.text_delta
                counts[i] += len(chunk.token_ids)
                event: dict[str, Any] = {
                    "text": texts[i],
                    "delta": chunk.text_delta,
                    "token_ids": chunk.token_ids,
                    "meta_info": {
                        "id": opts[i]["rid"],
                        "prompt_tokens": len(jobs[i].prompt_ids),
                        "completion_tokens": counts[i],
                        "cached_tokens": 0,
                        "finish_reason": None,
                    },
                }
                if many:
                    event["index"] = i
                spec = opts[i]["separate"]
                if spec is not None:  # the reasoning so far apart, as the last event has it
                    reasoning, answer, _ = spec.parser.scan(texts[i], spec.open_at_start, False)
                    event.update(text=answer, reasoning_text=reasoning)
                if chunk.finished:
                    left -= 1
                    event.update(_output(chunk.result, opts[i], tok))
                    state.record_usage([chunk.result], 1)
                yield sse(event)
            yield sse("[DONE]")
        except APIError as exc:
            yield sse_error(exc)
            yield sse("[DONE]")
        finally:
            if left:
                state.metrics.client_aborts += 1
            streams.close()
            admission.release()
            state.metrics.record_stream_end(time.perf_counter() - started)

    def close() -> None:
        streams.close()
        admission.release()

    return SSEResponse(events(), on_close=close)


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
        "token_healing": True,  # sampling_params.token_healing is honoured (RuntimeEndpoint)
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


@router.post("/concate_and_append_request")
async def concate_and_append(body: ConcatAppendRequest) -> dict[str, Any]:
    """SGLang's parallel-encoding join: the frontend appends the forks' text to the parent
    itself, so the parent's next /generate sends (and the radix cache finds) exactly that text.
    Nothing to do here; request ids this server never saw are not an error."""
    return {"success": True, "src_rids": body.src_rids, "dst_rid": body.dst_rid}


@router.post("/flush_cache")
async def flush_cache(request: Request) -> dict[str, Any]:
    """Drop every cached page no running request uses (for benchmarks and tests); `integrity`
    says whether the pool's, the tree's and the running requests' page accounting agree."""
    state = get_state(request)
    flushed = bool(await state.bridge.run(state.engine.flush_cache))
    try:
        await state.bridge.run(state.engine.check_integrity)
        integrity = "ok"
    except AssertionError as exc:
        integrity = f"failed: {exc}"
    return {"flushed": flushed, "integrity": integrity}


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
