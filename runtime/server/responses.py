"""OpenAI response objects (completions, chat completions, their stream chunks) as dicts
(`chat_answer.py` builds a chat completion or its stream from them)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from runtime.scheduling.request import GenerateResult
from runtime.server.generation import sse
from runtime.server.state import ServerState, token_counts


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def usage_of(results: list[GenerateResult], per_prompt: int) -> dict[str, Any]:
    """Usage of `results` (`state.token_counts`: a prompt shared by n choices counts once)."""
    return usage(*token_counts(results, per_prompt))


def finish_reason(result: GenerateResult) -> str:
    """OpenAI's finish_reason; "abort" when the server cancelled the request (shutdown)."""
    return result.finish_reason if result.finish_reason in ("length", "abort") else "stop"


def _token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id])


def chat_logprobs(tokenizer: Any, result: GenerateResult, top_n: int) -> dict[str, Any] | None:
    """`choices[i].logprobs` of a chat completion: one entry per generated token."""
    if result.logprobs is None:
        return None
    content = []
    tops = result.top_logprobs or [{}] * len(result.logprobs)
    for tok, lp, top in zip(result.token_ids, result.logprobs, tops, strict=False):
        text = _token_text(tokenizer, tok)
        alternatives = sorted(top.items(), key=lambda kv: -kv[1])[:top_n]
        content.append(
            {
                "token": text,
                "logprob": lp,
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {
                        "token": _token_text(tokenizer, t),
                        "logprob": v,
                        "bytes": list(_token_text(tokenizer, t).encode()),
                    }
                    for t, v in alternatives
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    tokenizer: Any, result: GenerateResult, top_n: int, offset: int = 0
) -> dict[str, Any] | None:
    """`choices[i].logprobs` of a (legacy) completion: tokens, token_logprobs, ..."""
    if result.logprobs is None:
        return None
    tokens = [_token_text(tokenizer, t) for t in result.token_ids[: len(result.logprobs)]]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    tops = result.top_logprobs or [{}] * len(tokens)
    return {
        "tokens": tokens,
        "token_logprobs": list(result.logprobs),
        "top_logprobs": [
            {
                _token_text(tokenizer, t): v
                for t, v in sorted(top.items(), key=lambda kv: -kv[1])[:top_n]
            }
            for top in tops
        ],
        "text_offset": offsets,
    }


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    index: int,
    delta: dict[str, Any],
    finish: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        ],
    }


def completion_chunk(
    rid: str,
    model: str,
    created: int,
    index: int,
    text: str,
    finish: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }


def usage_chunk(rid: str, model: str, created: int, obj: str, usage_: dict) -> dict[str, Any]:
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def closing_events(
    state: ServerState, results: list[Any], n: int, body: Any, head: tuple[str, str, int], obj: str
) -> list[str]:
    """The end of an OpenAI stream once every choice finished: usage recorded, the usage
    chunk if `stream_options.include_usage` asked for it, then [DONE]. `head`: (id, model,
    created) of the stream's chunks; `obj`: their `object`."""
    done = [r for r in results if r is not None]
    state.record_usage(done, n)
    events = []
    if body.include_usage_chunk():
        events.append(sse(usage_chunk(*head, obj, usage_of(done, n))))
    return [*events, sse("[DONE]")]


def with_usage(event: dict[str, Any], results: list[Any], body: Any) -> dict:
    """The last finish chunk carries the usage, unless a separate usage chunk was asked for."""
    if not body.include_usage_chunk() and all(r is not None for r in results):
        event["usage"] = usage_of(results, body.n)
    return event
