"""`Runtime`: the in-process `runtime.Engine` as a backend.

The async methods await `Engine.async_generate` / `Engine.async_score`: the scheduler thread
hands each result straight to the event loop, so no thread waits per request."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..chat_template import ChatTemplate
from ..errors import BackendError
from .base import Backend, GenChunk, GenOutput, logprob_triples

# gen() keyword -> Engine.generate keyword, where they differ
_ENGINE_NAMES = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "return_logprob": "logprobs",
}


class Runtime(Backend):
    """Start an engine in this process: `Runtime()` loads the default model.

    `engine_kwargs` go to `runtime.Engine` unchanged (`enable_radix_cache`, `dtype`, ...).
    An engine already built can be wrapped with `Runtime.from_engine(engine)`.
    """

    heals_tokens = True  # the engine's `token_healing` (see interpreter._healing)

    def __init__(self, model: str | None = None, **engine_kwargs: Any) -> None:
        from runtime import Engine  # the engine is heavy; import it only when asked for

        self._init(Engine(model=model, **engine_kwargs), owns_engine=True)

    @classmethod
    def from_engine(cls, engine: Any) -> Runtime:
        self = cls.__new__(cls)
        self._init(engine, owns_engine=False)
        return self

    def _init(self, engine: Any, owns_engine: bool) -> None:
        self.engine = engine
        self.has_prefix_cache = getattr(engine, "tree", True) is not None
        self._owns_engine = owns_engine
        self._template: ChatTemplate | None = None
        self._template_lock = threading.Lock()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def chat_template(self) -> ChatTemplate:
        with self._template_lock:
            if self._template is None:
                self._template = ChatTemplate.from_tokenizer(self.engine.tokenizer)
            return self._template

    def generate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        # the engine rejects an empty prompt; generating "after nothing" means after the BOS
        prompt = prompt or self.unconditional_prompt()
        try:
            result = self.engine.generate(prompt, **_engine_kwargs(params))
        except Exception as exc:
            raise BackendError(f"engine.generate failed: {exc}") from exc
        out = _to_output(result)
        split = _prompt_logprob_split(result, params)
        prompt_lps = None if split is None else self.score_ids(*split)
        self._add_logprobs(out, result, params, prompt_lps)
        return out

    async def agenerate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        if not hasattr(self.engine, "async_generate"):  # an engine with blocking calls only
            return await super().agenerate(prompt, params)
        prompt = prompt or self.unconditional_prompt()
        try:
            result = await self.engine.async_generate(prompt, **_engine_kwargs(params))
        except Exception as exc:
            raise BackendError(f"engine.async_generate failed: {exc}") from exc
        out = _to_output(result)
        split = _prompt_logprob_split(result, params)
        prompt_lps = None
        if split is not None:
            try:
                scored = await self.engine.async_score(split[0], [split[1]], True)
            except Exception as exc:
                raise BackendError(f"engine.async_score failed: {exc}") from exc
            prompt_lps = scored[0]
        self._add_logprobs(out, result, params, prompt_lps)
        return out

    def _add_logprobs(
        self, out: GenOutput, result: Any, params: dict[str, Any], prompt_lps: list | None
    ) -> None:
        """SGLang's logprob triples, and the prompt's from `logprob_start_len` (`prompt_lps`:
        the log-probs of the prompt tokens after `_prompt_logprob_split`'s split)."""
        decode = self.engine.tokenizer.decode if params.get("return_text_in_logprobs") else None
        if result.logprobs is not None:
            out.output_token_logprobs = logprob_triples(result.logprobs, result.token_ids, decode)
        top_n = params.get("top_logprobs_num") or 0
        if result.top_logprobs is not None and top_n:
            tops = [sorted(t.items(), key=lambda kv: -kv[1])[:top_n] for t in result.top_logprobs]
            out.output_top_logprobs = [
                logprob_triples([v for _, v in t], [i for i, _ in t], decode) for t in tops
            ]
        start = params.get("logprob_start_len")
        if not params.get("return_logprob") or start is None or start < 0:
            return
        ids = list(result.prompt_token_ids)
        lps: list[float | None] = list(prompt_lps or [])
        if start == 0:
            lps = [None, *lps]
        out.input_token_logprobs = logprob_triples(lps, ids[start:], decode)

    def chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> GenOutput:
        """A gen with tools, by the server's tool machinery run in this process: the prompt
        rendered with the tools by the chat template, the answer constrained to the template's
        call format (`prepare_chat`) and its calls read back by that format's parser."""
        setup, request, kwargs = self._chat_setup(messages, params)
        try:
            result = self.engine.generate(setup.prompt, **kwargs)
        except Exception as exc:
            raise BackendError(f"engine.generate failed: {exc}") from exc
        return _chat_output(result, setup, request)

    async def achat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> GenOutput:
        if not hasattr(self.engine, "async_generate"):
            return await super().achat(messages, params)
        setup, request, kwargs = self._chat_setup(messages, params)
        try:
            result = await self.engine.async_generate(setup.prompt, **kwargs)
        except Exception as exc:
            raise BackendError(f"engine.async_generate failed: {exc}") from exc
        return _chat_output(result, setup, request)

    def _chat_setup(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> tuple:
        from runtime.server.chat import ChatRequest, prepare_chat
        from runtime.server.errors import APIError

        sampling = {k: v for k, v in params.items() if k not in _CHAT_KEYS}
        mode = params.get("json_schema_mode") or (
            getattr(self.engine, "json_schema_mode", None) or "strict"
        )
        try:
            request = ChatRequest(
                messages=messages, tools=params["tools"], tool_choice=params.get("tool_choice")
            )
            request.prepare()
            setup = prepare_chat(self.engine.tokenizer, request, mode, None, None)
        except APIError as exc:  # a tool the call format cannot write, a malformed message
            raise BackendError(f"gen with tools: {exc.message}") from exc
        kwargs = _engine_kwargs(sampling)
        kwargs.update(setup.constraint)
        if setup.markers:
            kwargs["keep_markers"] = setup.markers
        return setup, request, kwargs

    def score_ids(self, prefix: list[int], rest: list[int]) -> list[float]:
        try:
            return self.engine.score(prefix, [rest], return_token_logprobs=True)[0]
        except Exception as exc:
            raise BackendError(f"engine.score failed: {exc}") from exc

    def generate_stream(self, prompt: str, params: dict[str, Any]) -> Iterator[GenChunk]:
        prompt = prompt or self.unconditional_prompt()
        try:
            chunks = self.engine.generate(prompt, stream=True, **_engine_kwargs(params))
        except Exception as exc:
            raise BackendError(f"engine.generate(stream=True) failed: {exc}") from exc
        try:
            for chunk in chunks:
                done = _to_output(chunk.result) if chunk.finished else None
                yield GenChunk(chunk.text_delta, done)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def score(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        try:
            return self.engine.score(prompt, continuations, return_token_logprobs=True)
        except Exception as exc:
            raise BackendError(f"engine.score failed: {exc}") from exc

    async def agenerate_stream(
        self, prompt: str, params: dict[str, Any]
    ) -> AsyncIterator[GenChunk]:
        if not hasattr(self.engine, "async_generate"):
            async for chunk in super().agenerate_stream(prompt, params):
                yield chunk
            return
        prompt = prompt or self.unconditional_prompt()
        try:
            chunks = await self.engine.async_generate(prompt, stream=True, **_engine_kwargs(params))
        except Exception as exc:
            raise BackendError(f"engine.async_generate(stream=True) failed: {exc}") from exc
        try:
            async for chunk in chunks:
                done = _to_output(chunk.result) if chunk.finished else None
                yield GenChunk(chunk.text_delta, done)
        finally:
            chunks.close()  # aborts the request when the caller stopped early

    async def ascore(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        if not hasattr(self.engine, "async_score"):
            return await super().ascore(prompt, continuations)
        try:
            return await self.engine.async_score(prompt, continuations, True)
        except Exception as exc:
            raise BackendError(f"engine.async_score failed: {exc}") from exc

    async def acommit_prefix(self, prefix: str) -> None:
        if prefix and self.has_prefix_cache:
            await self.agenerate(prefix, {"max_tokens": 0})

    def commit_prefix(self, prefix: str) -> None:
        if not prefix or not self.has_prefix_cache:
            return  # nothing to cache, or nowhere to keep it
        self.generate(prefix, {"max_tokens": 0})

    def unconditional_prompt(self) -> str:
        tok = self.engine.tokenizer
        return tok.bos_token or tok.eos_token or "\n"  # the engine rejects an empty prompt

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def flush_cache(self) -> bool:
        return bool(self.engine.flush_cache())

    def get_server_info(self) -> dict[str, Any]:
        engine = self.engine
        return {
            "model_path": str(engine.model_path),
            "context_length": int(engine.config.max_position_embeddings),
            "radix_cache": self.has_prefix_cache,
            "in_process": True,
            **engine.stats(),
        }

    def shutdown(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()


# SGLang's logprob options, answered by the backend from the engine's result
_LOGPROB_OPTIONS = ("logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


def _engine_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    kwargs = {
        _ENGINE_NAMES.get(k, k): v
        for k, v in params.items()
        if v is not None and k not in _LOGPROB_OPTIONS
    }
    if params.get("top_logprobs_num"):
        kwargs.update(logprobs=True, top_logprobs=int(params["top_logprobs_num"]))
    return kwargs


# a tool gen's params that are not the engine's sampling keywords
_CHAT_KEYS = ("tools", "tool_choice", "json_schema_mode", *_LOGPROB_OPTIONS)


def _chat_output(result: Any, setup: Any, request: Any) -> GenOutput:
    """The engine's answer to a tool gen, its calls parsed by the template's format."""
    out = _to_output(result)
    content, calls = result.text, []
    if request.tool_mode:
        content, calls = setup.parser.parse(result.text, request.tools or [])
    out.content = content if calls else result.text
    out.tool_calls = calls
    return out


def _prompt_logprob_split(result: Any, params: dict[str, Any]) -> tuple[list, list] | None:
    """(prefix ids, rest ids) whose scores are the prompt's log-probs SGLang's
    `logprob_start_len` asks for; None when none are asked for (or none can be scored)."""
    start = params.get("logprob_start_len")
    if not params.get("return_logprob") or start is None or start < 0:
        return None
    ids = list(result.prompt_token_ids)
    split = max(start, 1)
    return (ids[:split], ids[split:]) if split < len(ids) else None


def _to_output(result: Any) -> GenOutput:
    # a constraint cut short by max_new_tokens is not a failure: the text so far, "length"
    # (as SGLang returns it); only an aborted request raises
    if result.finish_reason == "abort" or (
        getattr(result, "error", None) and result.finish_reason != "length"
    ):
        raise BackendError(f"engine aborted the request: {result.error}")
    usage = result.usage
    return GenOutput(
        text=result.text,
        finish_reason=result.finish_reason,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        completion_tokens=usage.completion_tokens,
        logprobs=result.logprobs,
        matched_stop=result.matched_stop,
    )
