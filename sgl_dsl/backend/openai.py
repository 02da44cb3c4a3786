"""`OpenAI`: any OpenAI-compatible server as a backend (OpenAI, vLLM, our own `/v1`), as SGLang's
`sgl.OpenAI`.

Chat models (the default) get the program's role blocks as chat messages: the template's role
markers are private sentinels, and each generate call turns the text back into messages, so a
`gen` must come right after `sgl.assistant(` opens (as in SGLang, a chat API cannot continue a
half-written answer). Completion models (`is_chat_model=False`, or a model SGLang knows as one)
get the text with plain `Role: ` lines.

Constraints: `json_schema` goes as `response_format` (chat) or `json_schema` (completions, our
server's extra field); `regex` as the `regex` extra field; `choices` and `dtype` as the regex they
mean; `ebnf` as vLLM's `structured_outputs.grammar`; `structural_tag` as a `response_format` of
type `structural_tag` (vLLM's and SGLang's, both shapes). Engine extras (`top_k`, `min_p`,
`min_tokens`, `stop_token_ids`, `ignore_eos`) are sent only when set. A server that refuses
one answers 400, raised as `BackendError` naming the field.
`select` scores through `/completions` with `echo` + `logprobs` (completion models only: chat
models have no way to score a given text, and SGLang refuses it there too).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from ..chat_template import ChatTemplate
from ..errors import BackendError
from .base import Backend, GenChunk, GenOutput
from .endpoint import (
    AsyncClients,
    as_regex,
    completions_score_body,
    completions_scores,
    score_by_completions,
)

INSTRUCT_MODEL_NAMES = ("gpt-3.5-turbo-instruct",)  # SGLang's list of completion-only models
_ROLES = ("system", "user", "assistant")
_BEGIN = {r: f"\x1e<{r}>\x1f" for r in _ROLES}
_END = {r: f"\x1e</{r}>\x1f" for r in _ROLES}
# gen() keyword -> OpenAI field; the extras are the OpenAI-compatible servers' own fields
_FIELDS = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "seed": "seed",
    "top_k": "top_k",
    "min_p": "min_p",
    "min_tokens": "min_tokens",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "regex": "regex",
}
_REFUSED = ("grammar", "logprob_start_len")


@dataclass(slots=True)
class TokenUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def reset(self) -> None:
        self.prompt_tokens = self.completion_tokens = 0


class OpenAI(Backend):
    """`OpenAI(model, base_url=None, api_key=None, is_chat_model=None)`.

    `base_url` defaults to `$OPENAI_BASE_URL` or https://api.openai.com/v1 (for our server:
    "http://HOST:PORT/v1"); `api_key` to `$OPENAI_API_KEY`. `token_usage` counts what the
    server reported, as SGLang's does.
    """

    has_prefix_cache = False

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        is_chat_model: bool | None = None,
        *,
        timeout: float | None = 600.0,
    ) -> None:
        from sgl_dsl import settings  # here: reading it imports grammar's settings kinds

        self.model = self.model_name = model
        self.base_url = (base_url or settings.OPENAI_BASE_URL.get()).rstrip("/")
        key = api_key or settings.OPENAI_API_KEY.get()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client_options = dict(
            base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0)
        )
        self._client = httpx.Client(**client_options)
        self._async_clients = AsyncClients(client_options)
        if is_chat_model is None:
            is_chat_model = model not in INSTRUCT_MODEL_NAMES
        self.is_chat_model = is_chat_model
        self.token_usage = TokenUsage()
        if is_chat_model:
            self._template = ChatTemplate(dict(_BEGIN), dict(_END), source="openai-chat")
        else:
            self._template = ChatTemplate.plain()

    def chat_template(self) -> ChatTemplate:
        return self._template

    # ---- requests ----------------------------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            response = self._client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise BackendError(f"POST {self.base_url}{path} failed: {exc}") from exc
        if response.status_code >= 400:
            raise BackendError(_refusal(path, response.status_code, response.text, body))
        return response.json()

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        return self._post(path, body)

    async def _apost(self, path: str, body: dict[str, Any]) -> Any:
        try:
            response = await self._async_clients.get().post(path, json=body)
        except httpx.HTTPError as exc:
            raise BackendError(f"POST {self.base_url}{path} failed: {exc}") from exc
        if response.status_code >= 400:
            raise BackendError(_refusal(path, response.status_code, response.text, body))
        return response.json()

    def _body(self, prompt: str, params: dict[str, Any], stream: bool) -> tuple[str, dict]:
        refused = [k for k in _REFUSED if params.get(k) is not None]
        if refused:
            raise BackendError(f"OpenAI backend: {refused} not supported by the OpenAI API")
        body: dict[str, Any] = {"model": self.model, "stream": stream}
        params = as_regex(dict(params))
        for key, field in _FIELDS.items():
            if params.get(key) is not None:
                body[field] = params[key]
        if params.get("return_logprob") or params.get("top_logprobs_num"):
            top = int(params.get("top_logprobs_num") or 0)
            if self.is_chat_model:
                body.update(logprobs=True, top_logprobs=top)
            else:
                body["logprobs"] = top
        if params.get("ebnf") is not None:
            body["structured_outputs"] = {"grammar": params["ebnf"]}
        if params.get("structural_tag") is not None:
            body["response_format"] = {
                "type": "structural_tag",
                **json.loads(params["structural_tag"]),
            }
        schema = params.get("json_schema")
        if self.is_chat_model:
            body["messages"] = self._messages(prompt)
            if schema is not None:
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": json.loads(schema)},
                }
            return "/chat/completions", body
        body["prompt"] = prompt
        if schema is not None:
            body["json_schema"] = schema
        return "/completions", body

    def _messages(self, prompt: str) -> list[dict[str, str]]:
        """The chat messages a prompt of sentinel-marked role blocks stands for."""
        messages: list[dict[str, str]] = []
        rest = prompt
        while rest:
            role = next((r for r in _ROLES if rest.startswith(_BEGIN[r])), None)
            if role is None:
                raise BackendError(
                    "OpenAI chat backend: text outside a role block; write the program with "
                    "sgl.system / sgl.user / sgl.assistant (or use is_chat_model=False)"
                )
            rest = rest[len(_BEGIN[role]) :]
            end = rest.find(_END[role])
            if end < 0:
                if role != "assistant" or rest.strip():
                    raise BackendError(
                        "OpenAI chat backend: a gen must come right after sgl.assistant( opens "
                        "(a chat API cannot continue a half-written message)"
                    )
                return messages
            messages.append({"role": role, "content": rest[:end]})
            rest = rest[end + len(_END[role]) :]
        raise BackendError("OpenAI chat backend: a gen must be inside sgl.assistant(...)")

    def _count(self, usage: Any) -> None:
        if usage:
            self.token_usage.prompt_tokens += usage.get("prompt_tokens", 0)
            self.token_usage.completion_tokens += usage.get("completion_tokens", 0)

    def generate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        path, body = self._body(prompt, params, stream=False)
        return self._reply_output(self._post(path, body))

    async def agenerate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        path, body = self._body(prompt, params, stream=False)
        return self._reply_output(await self._apost(path, body))

    def _reply_output(self, reply: dict[str, Any]) -> GenOutput:
        self._count(reply.get("usage"))
        choice = reply["choices"][0]
        text = choice["message"]["content"] if self.is_chat_model else choice["text"]
        return _output(text or "", choice, reply.get("usage") or {}, self.is_chat_model)

    def generate_stream(self, prompt: str, params: dict[str, Any]) -> Iterator[GenChunk]:
        path, body = self._body(prompt, params, stream=True)
        body["stream_options"] = {"include_usage": True}
        reader = _StreamReader(self.is_chat_model)
        try:
            with self._client.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise BackendError(_refusal(path, response.status_code, response.text, body))
                for line in response.iter_lines():
                    yield from reader.chunks(line)
        except httpx.HTTPError as exc:
            raise BackendError(f"POST {self.base_url}{path} (stream) failed: {exc}") from exc
        self._count(reader.usage)
        yield reader.last()

    async def agenerate_stream(
        self, prompt: str, params: dict[str, Any]
    ) -> AsyncIterator[GenChunk]:
        path, body = self._body(prompt, params, stream=True)
        body["stream_options"] = {"include_usage": True}
        reader = _StreamReader(self.is_chat_model)
        try:
            async with self._async_clients.get().stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise BackendError(_refusal(path, response.status_code, response.text, body))
                async for line in response.aiter_lines():
                    for chunk in reader.chunks(line):
                        yield chunk
        except httpx.HTTPError as exc:
            raise BackendError(f"POST {self.base_url}{path} (stream) failed: {exc}") from exc
        self._count(reader.usage)
        yield reader.last()

    def score(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        self._check_scorable()
        return score_by_completions(
            self._request, "/completions", self.model, prompt, continuations
        )

    async def ascore(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        self._check_scorable()
        body = completions_score_body(self.model, prompt, continuations)
        return completions_scores(
            "/completions", await self._apost("/completions", body), continuations
        )

    def _check_scorable(self) -> None:
        if self.is_chat_model:
            raise BackendError(
                "OpenAI backend: select / gen(choices=...) needs a completion model "
                "(is_chat_model=False) on a server whose /completions echoes log-probs; chat "
                "models cannot score given text"
            )

    def commit_prefix(self, prefix: str) -> None:
        return None  # no prefix cache to fill through the OpenAI API

    async def acommit_prefix(self, prefix: str) -> None:
        return None

    async def achat_template(self) -> ChatTemplate:
        return self._template

    def get_server_info(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "model": self.model, "is_chat_model": self.is_chat_model}

    def shutdown(self) -> None:
        self._client.close()
        self._async_clients.close()


class _StreamReader:
    """Reads an OpenAI event stream line by line: text deltas, then the finish reason and the
    usage for the last chunk."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.text, self.finish, self.usage = "", None, {}

    def chunks(self, line: str) -> list[GenChunk]:
        if not line.startswith("data: ") or line == "data: [DONE]":
            return []
        event = json.loads(line[len("data: ") :])
        self.usage = event.get("usage") or self.usage
        out = []
        for choice in event.get("choices") or []:
            delta = _delta(choice, self.chat)
            self.finish = choice.get("finish_reason") or self.finish
            if delta:
                self.text += delta
                out.append(GenChunk(delta))
        return out

    def last(self) -> GenChunk:
        return GenChunk(
            "", _output(self.text, {"finish_reason": self.finish}, self.usage, self.chat)
        )


def _delta(choice: dict[str, Any], chat: bool) -> str | None:
    return (choice.get("delta") or {}).get("content") if chat else choice.get("text")


def _output(text: str, choice: dict, usage: dict, chat: bool) -> GenOutput:
    reason = choice.get("finish_reason") or "stop"
    lps = None
    logprobs = choice.get("logprobs")
    if logprobs:
        if chat:
            lps = [t["logprob"] for t in logprobs.get("content") or []]
        else:
            lps = [float(lp) for lp in logprobs.get("token_logprobs") or []]
    return GenOutput(
        text=text,
        finish_reason="length" if reason == "length" else "stop",
        prompt_tokens=usage.get("prompt_tokens", 0),
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        logprobs=lps,
    )


def _refusal(path: str, status: int, text: str, body: dict[str, Any]) -> str:
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text[:500]
    extras = [f for f in ("regex", "json_schema", "top_k", "min_p", "min_tokens") if f in body]
    hint = f" (this request used the extra field(s) {extras}, which the server may lack)"
    return f"{path} answered {status}: {message}" + (hint if extras and status == 400 else "")
