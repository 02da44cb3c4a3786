"""`OpenAI`: any OpenAI-compatible server as a backend (OpenAI, vLLM, our own `/v1`), as SGLang's
`sgl.OpenAI`.

Chat models (the default) get the program's role blocks as chat messages: the template's role
markers are private sentinels, and each generate call turns the text back into messages, so a
`gen` must come right after `sgl.assistant(` opens (as in SGLang, a chat API cannot continue a
half-written answer). Completion models (`is_chat_model=False`, or a model SGLang knows as one)
get the text with plain `Role: ` lines.

Constraints go in the fields of the server's own dialect, `server=`: "openai"
(`response_format` json_schema, strict), "vllm" (`structured_outputs`), "vllm-guided"
(`guided_*`, vLLM before 0.12), "sglang" (`regex`, `ebnf`, `response_format`, `json_schema` on
completions) and "runtime" (SGLang's plus this project's `json_schema_mode`); see
`_constraint_fields`. Unset, it is "openai" for api.openai.com and otherwise asked of the server
once (`_detect_server`; "openai", the fewest fields, when the server does not say). A constraint
or option the server cannot take is a `BackendError` naming it and the server before anything is
sent (never dropped); a server that refuses a field answers 400, raised as `BackendError`.
`select` scores through `/completions` with `echo` + `logprobs` on completion models; chat models
cannot score given text (nor a server that echoes no log-probs), so there it is a constrained
choice (`interpreter._choice_call`).
A gen with tools sends the native `tools` field (`chat_calls`).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from ..chat_template import ChatTemplate
from ..errors import BackendError
from .base import Backend, GenChunk, GenOutput, NoPromptLogprobs
from .chat_calls import chat_tools_body, chat_tools_output
from .endpoint import (
    AsyncClients,
    as_regex,
    completions_score_body,
    completions_scores,
    score_by_completions,
)

_CONSTRAINTS = ("regex", "json_schema", "choices", "dtype", "grammar", "ebnf", "structural_tag")
INSTRUCT_MODEL_NAMES = ("gpt-3.5-turbo-instruct",)  # SGLang's list of completion-only models
_ROLES = ("system", "user", "assistant")
_BEGIN = {r: f"\x1e<{r}>\x1f" for r in _ROLES}
_END = {r: f"\x1e</{r}>\x1f" for r in _ROLES}
# gen() keyword -> OpenAI field: OpenAI's own, then the engines' extras (vLLM's, SGLang's)
_FIELDS = ("max_tokens", "temperature", "top_p", "stop", "frequency_penalty", "presence_penalty",
           "seed")  # fmt: skip
_EXTRAS = ("top_k", "min_p", "min_tokens", "stop_token_ids", "ignore_eos")
_REFUSED = ("logprob_start_len",)
# the servers (`server=`) whose fields this backend speaks; see `_constraint_fields`
SERVERS = ("openai", "vllm", "vllm-guided", "sglang", "runtime")
# the field `select` is answered by on a chat model, read back by `_unwrap_choice`
_CHOICE_KEY = "choice"


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
        server: str | None = None,
        transport: Any = None,
    ) -> None:
        from sgl_dsl import settings  # here: reading it imports grammar's settings kinds

        self.model = self.model_name = model
        self.base_url = (base_url or settings.OPENAI_BASE_URL.get()).rstrip("/")
        if server is not None and server not in SERVERS:
            raise BackendError(f"OpenAI(server={server!r}): the server is one of {SERVERS}")
        key = api_key or settings.OPENAI_API_KEY.get()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client_options = dict(
            base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0)
        )
        if transport is not None:  # e.g. httpx.MockTransport
            client_options["transport"] = transport
        self._client = httpx.Client(**client_options)
        self._async_clients = AsyncClients(client_options)
        if server is None:
            server = "openai" if "api.openai.com" in self.base_url else self._detect_server()
        self.server = server
        if is_chat_model is None:
            is_chat_model = model not in INSTRUCT_MODEL_NAMES
        self.is_chat_model = is_chat_model
        self.token_usage = TokenUsage()
        self._echoes = True  # False once /completions returned no prompt log-probs
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

    def _detect_server(self) -> str:
        """Which server this is, asked once: this project's or SGLang's answer
        `/get_model_info` (ours with `has_chat_template`), vLLM answers `/version` (0.12+ takes
        `structured_outputs`, older `guided_*`); any other is taken as OpenAI's API, whose
        fields are the fewest, so that no constraint is sent where it would be ignored."""
        root = self.base_url.removesuffix("/v1")
        try:
            answer = self._client.get(root + "/get_model_info", timeout=5.0)
            if answer.status_code == 200 and isinstance(answer.json(), dict):
                return "runtime" if "has_chat_template" in answer.json() else "sglang"
            answer = self._client.get(root + "/version", timeout=5.0)
            if answer.status_code == 200:
                version = str(answer.json().get("version", ""))
                numbers = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
                return "vllm" if numbers >= (0, 12) else "vllm-guided"
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        return "openai"

    @property
    def scores_text(self) -> bool:  # type: ignore[override]
        """Completion models score choices (`/completions` echoes the prompt's log-probs);
        chat models cannot, nor a server that echoes none: `select` is a constrained choice."""
        return not self.is_chat_model and self._echoes

    def _where(self) -> str:
        return f"OpenAI(server={self.server!r})"

    def _body(self, prompt: str, params: dict[str, Any], stream: bool) -> tuple[str, dict]:
        refused = [k for k in _REFUSED if params.get(k) is not None]
        if refused:
            raise BackendError(f"{self._where()}: {refused} not supported by the OpenAI API")
        body: dict[str, Any] = {"model": self.model, "stream": stream}
        for key in _FIELDS:
            if params.get(key) is not None:
                body[key] = params[key]
        for key in _EXTRAS:
            if params.get(key) is not None:
                if self.server == "openai":
                    raise BackendError(f"{self._where()}: OpenAI's API has no {key}")
                body[key] = params[key]
        if params.get("return_logprob") or params.get("top_logprobs_num"):
            top = int(params.get("top_logprobs_num") or 0)
            if self.is_chat_model:
                body.update(logprobs=True, top_logprobs=top)
            else:
                body["logprobs"] = top
        body.update(self._constraint_fields(params, stream))
        if self.is_chat_model:
            body["messages"] = self._messages(prompt)
            return "/chat/completions", body
        body["prompt"] = prompt
        return "/completions", body

    def _constraint_fields(self, params: dict[str, Any], stream: bool) -> dict[str, Any]:
        """The request fields of the gen's constraint in the server's own dialect; one it
        cannot take is a `BackendError` naming the constraint and the server (never dropped).

        openai: `response_format` json_schema (strict; chat models), choices as a strict
        schema `{"choice": <enum>}` read back to the choice; vllm: `structured_outputs`
        {json, regex, choice, grammar (GBNF), structural_tag}; vllm-guided: `guided_json` /
        `guided_regex` / `guided_choice` / `guided_grammar` (vLLM before 0.12); sglang and
        runtime: `response_format` (chat) or `json_schema` (completions), `regex`, `ebnf`,
        `response_format` structural_tag, choices and dtype as their regex; runtime also
        `json_schema_mode` (this project's server)."""
        server, chat = self.server, self.is_chat_model
        where = self._where()
        if params.get("json_schema_mode") is not None and server != "runtime":
            raise BackendError(f"{where}: json_schema_mode is this project's server's field "
                               "(use server='runtime' against it)")  # fmt: skip
        given = [k for k in _CONSTRAINTS if params.get(k) is not None]
        if not given:
            return {}
        key = named = given[0]  # `named`: the gen's own keyword, for the errors
        value = params[key]
        if key == "grammar":
            raise BackendError(f"{where}: lark grammars (gen(grammar=...)) are not sent to "
                               "OpenAI-compatible servers; write the grammar in GBNF as "
                               "gen(ebnf=...)")  # fmt: skip
        if key == "dtype" or (key == "choices" and server in ("sglang", "runtime")):
            key, value = "regex", as_regex({key: value})["regex"]
        out: dict[str, Any] = {}
        if params.get("json_schema_mode") is not None:
            out["json_schema_mode"] = params["json_schema_mode"]
        if server == "vllm":
            field = {"json_schema": "json", "regex": "regex", "choices": "choice",
                     "ebnf": "grammar", "structural_tag": "structural_tag"}[key]  # fmt: skip
            loaded = json.loads(value) if key == "json_schema" else value
            return {**out, "structured_outputs": {field: loaded}}
        if server == "vllm-guided" and key != "structural_tag":
            field = {"json_schema": "guided_json", "regex": "guided_regex",
                     "choices": "guided_choice", "ebnf": "guided_grammar"}[key]  # fmt: skip
            return {**out, field: json.loads(value) if key == "json_schema" else value}
        if key == "json_schema" and chat:
            fmt = {"name": "output", "schema": json.loads(value)}
            if server == "openai":
                fmt["strict"] = True
            return {**out, "response_format": {"type": "json_schema", "json_schema": fmt}}
        if key == "structural_tag" and server != "openai":  # chat and completions alike
            return {**out, "response_format": {"type": "structural_tag", **json.loads(value)}}
        if server == "openai":
            if key == "choices" and chat:
                schema = {"type": "object", "additionalProperties": False,
                          "properties": {_CHOICE_KEY: {"type": "string", "enum": value}},
                          "required": [_CHOICE_KEY]}  # fmt: skip
                fmt = {"name": _CHOICE_KEY, "schema": schema, "strict": True}
                if stream:
                    raise BackendError(f"{where}: a choice cannot be streamed from OpenAI's API")
                return {"response_format": {"type": "json_schema", "json_schema": fmt}}
            raise BackendError(f"{where}: OpenAI's API cannot constrain to {named}"
                               f"{'' if chat else ' on a completion model'}")  # fmt: skip
        if key in ("regex", "ebnf"):
            return {**out, key: value}
        if key == "json_schema":  # completions: SGLang's and this project's own field
            return {**out, "json_schema": value}
        raise BackendError(f"{where}: {named} cannot be sent to /completions here")

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
        return self._unwrap_choice(body, self._reply_output(self._post(path, body)))

    async def agenerate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        path, body = self._body(prompt, params, stream=False)
        return self._unwrap_choice(body, self._reply_output(await self._apost(path, body)))

    def _unwrap_choice(self, body: dict[str, Any], out: GenOutput) -> GenOutput:
        """A choice asked of OpenAI's API as `{"choice": ...}`: the output is the choice."""
        fmt = (body.get("response_format") or {}).get("json_schema") or {}
        if fmt.get("name") != _CHOICE_KEY or self.server != "openai":
            return out
        try:
            out.text = json.loads(out.text)[_CHOICE_KEY]
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendError(f"{self._where()}: the choice came back as {out.text!r}") from exc
        return out

    def chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> GenOutput:
        """A gen with tools: the native `tools` field of `/chat/completions` (`chat_calls`)."""
        reply = self._post("/chat/completions", self._chat_body(messages, params))
        self._count(reply.get("usage"))
        return chat_tools_output(reply)

    async def achat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> GenOutput:
        reply = await self._apost("/chat/completions", self._chat_body(messages, params))
        self._count(reply.get("usage"))
        return chat_tools_output(reply)

    def _chat_body(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict:
        if not self.is_chat_model:
            raise BackendError(f"{self._where()}: a gen with tools needs a chat model")
        body = chat_tools_body(
            self.model, messages, params, extras=self.server != "openai",
            backend=self._where(), ours=self.server == "runtime",
        )  # fmt: skip
        return body

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
        try:
            return score_by_completions(
                self._request, "/completions", self.model, prompt, continuations
            )
        except NoPromptLogprobs:
            self._echoes = False
            raise

    async def ascore(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        self._check_scorable()
        body = completions_score_body(self.model, prompt, continuations)
        try:
            return completions_scores(
                "/completions", await self._apost("/completions", body), continuations
            )
        except NoPromptLogprobs:
            self._echoes = False
            raise

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
