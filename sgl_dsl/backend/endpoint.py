"""`RuntimeEndpoint`: a `runtime.server` process as a backend, over HTTP (httpx).

Generation goes to the server's native `/generate` (streamed as server-sent events when asked),
`select` to `/score` (all choices in one request), fork prefixes to `/generate` with
`max_new_tokens: 0`. The async methods send the same requests through one
`httpx.AsyncClient` per event loop, so `run_batch_async` keeps hundreds of requests in flight
without a thread each.

The same code works through the SGLang Model Gateway (`runtime.cluster`), which routes only
`/generate`, `/v1/completions` and `/v1/chat/completions` and re-parses `/generate` bodies with
SGLang's types. So: `choices` and `dtype` are sent as the `regex` the server would build from
them (the gateway drops those keys, and an unconstrained answer must never pass for a
constrained one); `seed` is sent also as SGLang's `sampling_seed` (the gateway drops `seed`);
and when `/score` answers 404, scoring goes to `/v1/completions` instead (all choices as one
batch, `echo` + `logprobs` + `max_tokens: 0`), remembered for later calls.

`server="sglang"` speaks SGLang's own server instead of this project's ("runtime"; unset, the
server's `/get_model_info` tells which): no lark grammar (refused
by name), `seed` only as `sampling_seed`, and no check of `meta_info.constraint` (SGLang does
not report it). A gen with tools goes to `/v1/chat/completions` with `tools` (`chat`).

The chat template's role markers are derived exactly as for the
in-process backend, by rendering sentinel messages, here through `/apply_chat_template`; where
that path is not routed (a gateway in front of the server answers 404) the template text from
`/get_model_info` is rendered locally with jinja2, the way `transformers` renders it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from ..chat_template import ChatTemplate
from ..errors import BackendError
from .base import Backend, GenChunk, GenOutput, NoPromptLogprobs, in_fallback_pool
from .chat_calls import chat_tools_body, chat_tools_output

# gen() keyword -> /generate sampling_params key, where they differ
_SERVER_NAMES = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    # lark text has no SGLang name (SGLang's `ebnf` is GBNF, sent as `ebnf`): the SGLang Model
    # Gateway drops `lark`, so a lark gen() through it fails (see `_check_constraint_reached`)
    "grammar": "lark",
}


# gen() keywords sent beside sampling_params, as SGLang's frontend sends them
_TOP_LEVEL = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


def as_regex(sampling: dict[str, Any]) -> dict[str, Any]:
    """Replace `choices` / `dtype` with the `regex` they mean (in place; returns `sampling`),
    as our server maps them: for servers that take a regex but not those keywords."""
    choices = sampling.pop("choices", None)
    if choices is not None:
        if not choices:
            raise BackendError("gen(choices=...) needs at least one choice")
        from grammar import choices_to_regex  # the server's own mapping

        sampling["regex"] = choices_to_regex([str(c) for c in choices])
    name = sampling.pop("dtype", None)
    if name is not None:
        from grammar import DTYPE_NAMES, dtype_to_regex  # the server's own mapping

        if name not in DTYPE_NAMES:
            raise BackendError(f"dtype must be one of {sorted(DTYPE_NAMES)}, got {name!r}")
        sampling["regex"] = dtype_to_regex(name)
    return sampling


class RuntimeEndpoint(Backend):
    """A backend for a server started with `python -m runtime.server`.

    `url` is the server's base URL (e.g. "http://127.0.0.1:30000"); `api_key` is sent as
    `Authorization: Bearer` when the server was started with `--api-key`. The constructor
    contacts the server once (`/get_model_info`) and raises `BackendError` if it cannot.
    One connection pool is shared by every thread (httpx.Client is thread-safe).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: str | bool | None = None,
        chat_template_name: str | None = None,
        *,
        timeout: float | None = 600.0,
        max_connections: int = 256,
        server: str | None = None,
        transport: Any = None,
    ) -> None:
        # SGLang's signature; `verify` is the TLS CA bundle (or False), and roles always come
        # from the served model's own chat template, so `chat_template_name` must stay unset
        if chat_template_name is not None:
            raise BackendError(
                "RuntimeEndpoint(chat_template_name=...): roles come from the served model's "
                "own chat template here; leave it unset"
            )
        if server is not None and server not in ENDPOINT_SERVERS:
            raise BackendError(
                f"RuntimeEndpoint(server={server!r}): the server is one of {ENDPOINT_SERVERS}"
            )
        self.url = self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        client_options = dict(
            base_url=self.url,
            headers=headers,
            verify=True if verify is None else verify,
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64),
        )
        if transport is not None:  # e.g. httpx.MockTransport
            client_options["transport"] = transport
        self._client = httpx.Client(**client_options)
        self._async_clients = AsyncClients(client_options)
        self.model_info: dict[str, Any] = self._request("GET", "/get_model_info")
        if server is None:  # ours says whether it has a chat template; SGLang's does not
            server = "runtime" if "has_chat_template" in self.model_info else "sglang"
        self.server = server
        self.has_prefix_cache = bool(self.model_info.get("radix_cache", True))
        # our server heals prompt ends (`token_healing` in sampling_params); SGLang's does not,
        # nor does the SGLang Model Gateway pass the field on (it answers /get_model_info from a
        # worker, so it is asked apart: only the gateway serves GET /workers)
        self.heals_tokens = bool(self.model_info.get("token_healing", False))
        if self.heals_tokens and self._behind_gateway():
            self.heals_tokens = False
        self._template: ChatTemplate | None = None
        self._template_lock = threading.Lock()
        self._render_remotely = True
        self._local_template: Any = None
        self._score_routed = False  # True once /score answered 404 (behind a gateway)

    def _behind_gateway(self) -> bool:
        try:
            response = self._client.get("/workers")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    # ---- HTTP -------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise BackendError(f"{method} {self.url}{path} failed: {exc}") from exc
        return _answer(path, response)

    async def _arequest(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = await self._async_clients.get().request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise BackendError(f"{method} {self.url}{path} failed: {exc}") from exc
        return _answer(path, response)

    # ---- Backend ------------------------------------------------------------------------------
    def chat_template(self) -> ChatTemplate:
        with self._template_lock:
            if self._template is None:
                if not self.model_info.get("has_chat_template"):
                    self._template = ChatTemplate.plain()
                else:
                    self._template = ChatTemplate.derive(self._render)
            return self._template

    async def achat_template(self) -> ChatTemplate:
        if self._template is not None:
            return self._template
        return await in_fallback_pool(self.chat_template)  # once: it asks the server

    def _render(self, messages: list[dict[str, str]]) -> str:
        if not self._render_remotely:
            return self._render_locally(messages)
        try:
            return self._request("POST", "/apply_chat_template", {"messages": messages})["text"]
        except _StatusError as exc:
            if exc.status != 404 or not self.model_info.get("chat_template"):
                raise
            self._render_remotely = False  # not routed here: render the template ourselves
            return self._render_locally(messages)

    def _render_locally(self, messages: list[dict[str, str]]) -> str:
        """Render `/get_model_info`'s template text as `transformers` does (sandboxed jinja2,
        trim_blocks and lstrip_blocks, `raise_exception`, the BOS / EOS strings)."""
        if self._local_template is None:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.globals["raise_exception"] = raise_exception
            self._local_template = env.from_string(self.model_info["chat_template"])
        return self._local_template.render(
            messages=messages,
            add_generation_prompt=False,
            bos_token=self.model_info.get("bos_token") or "",
            eos_token=self.model_info.get("eos_token") or "",
        )

    def _body(self, prompt: str, params: dict[str, Any], stream: bool) -> dict[str, Any]:
        if self.server == "sglang":
            _check_sglang(params)
        sampling = {
            _SERVER_NAMES.get(k, k): v
            for k, v in params.items()
            if v is not None and k not in _TOP_LEVEL
        }
        as_regex(sampling)
        if "seed" in sampling:
            sampling["sampling_seed"] = sampling["seed"]
            if self.server == "sglang":  # SGLang's name only (its SamplingParams has no seed)
                del sampling["seed"]
        body = {
            # the server rejects an empty prompt; generating "after nothing" means after BOS
            "text": prompt or self.unconditional_prompt(),
            "sampling_params": sampling,
            "return_logprob": bool(params.get("return_logprob")),
            "stream": stream,
        }
        if params.get("return_logprob") or params.get("top_logprobs_num"):
            # SGLang's triples come back when one of its logprob options is sent
            body["return_text_in_logprobs"] = bool(params.get("return_text_in_logprobs"))
            for key in ("logprob_start_len", "top_logprobs_num"):
                if params.get(key) is not None:
                    body[key] = params[key]
        return body

    def generate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        answer = self._request("POST", "/generate", self._body(prompt, params, False))
        self._check_reached(params, answer["meta_info"])
        return _to_output(answer)

    def _check_reached(self, params: dict[str, Any], meta: dict[str, Any]) -> None:
        if self.server == "runtime":  # SGLang does not name the constraint it applied
            _check_constraint_reached(params, meta)

    def generate_stream(self, prompt: str, params: dict[str, Any]) -> Iterator[GenChunk]:
        body = self._body(prompt, params, True)
        try:
            with self._client.stream("POST", "/generate", json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise BackendError(
                        _error_text("/generate", response.status_code, response.text)
                    )
                # leaving this block early (the caller closed the iterator) closes the
                # connection, which makes the server abort the request and free its pages
                for line in response.iter_lines():
                    chunk = _stream_event(line, params, self.server)
                    if chunk is _DONE:
                        return
                    if chunk is not None:
                        yield chunk
        except httpx.HTTPError as exc:
            raise BackendError(f"POST {self.url}/generate (stream) failed: {exc}") from exc

    async def agenerate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        answer = await self._arequest("POST", "/generate", self._body(prompt, params, False))
        self._check_reached(params, answer["meta_info"])
        return _to_output(answer)

    async def agenerate_stream(
        self, prompt: str, params: dict[str, Any]
    ) -> AsyncIterator[GenChunk]:
        body = self._body(prompt, params, True)
        client = self._async_clients.get()
        try:
            async with client.stream("POST", "/generate", json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise BackendError(
                        _error_text("/generate", response.status_code, response.text)
                    )
                async for line in response.aiter_lines():  # leaving early aborts, as above
                    chunk = _stream_event(line, params, self.server)
                    if chunk is _DONE:
                        return
                    if chunk is not None:
                        yield chunk
        except httpx.HTTPError as exc:
            raise BackendError(f"POST {self.url}/generate (stream) failed: {exc}") from exc

    def chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> GenOutput:
        """A gen with tools: `/v1/chat/completions` with `tools` (see `chat_calls`). Not
        `/generate` with a structural tag: the prompt must be the conversation rendered WITH the
        tools by the server's template, and the calls read back by the server's parser (its
        `--tool-call-parser`); the chat endpoint does both, as it does for any client."""
        body = self._chat_body(messages, params)
        return chat_tools_output(self._request("POST", "/v1/chat/completions", body))

    async def achat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> GenOutput:
        body = self._chat_body(messages, params)
        return chat_tools_output(await self._arequest("POST", "/v1/chat/completions", body))

    def _chat_body(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict:
        return chat_tools_body(
            self._model_name(), messages, params, extras=True,
            backend=f"RuntimeEndpoint(server={self.server!r})", ours=self.server == "runtime",
        )  # fmt: skip

    def score(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        prompt = prompt or self.unconditional_prompt()
        if not self._score_routed:
            body = {"prompt": prompt, "continuations": continuations}
            try:
                return self._request("POST", "/score", body)["token_logprobs"]
            except _StatusError as exc:
                if exc.status not in (404, 405):
                    raise
                self._score_routed = True  # a gateway: /score is not routed
        return self._score_by_completions(prompt, continuations)

    def _score_by_completions(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        try:
            return score_by_completions(
                self._request, "/v1/completions", self._model_name(), prompt, continuations
            )
        except NoPromptLogprobs:
            self.scores_text = False  # select answers by a constrained choice from now on
            raise

    async def ascore(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        prompt = prompt or self.unconditional_prompt()
        if not self._score_routed:
            body = {"prompt": prompt, "continuations": continuations}
            try:
                return (await self._arequest("POST", "/score", body))["token_logprobs"]
            except _StatusError as exc:
                if exc.status not in (404, 405):
                    raise
                self._score_routed = True
        body = completions_score_body(self._model_name(), prompt, continuations)
        reply = await self._arequest("POST", "/v1/completions", body)
        try:
            return completions_scores("/v1/completions", reply, continuations)
        except NoPromptLogprobs:
            self.scores_text = False
            raise

    def _model_name(self) -> Any:
        return self.model_info.get("served_model_name")

    def commit_prefix(self, prefix: str) -> None:
        if not prefix or not self.has_prefix_cache:
            return  # nothing to cache; an empty prefill is not a request
        self._request(
            "POST", "/generate", {"text": prefix, "sampling_params": {"max_new_tokens": 0}}
        )

    async def acommit_prefix(self, prefix: str) -> None:
        if not prefix or not self.has_prefix_cache:
            return
        body = {"text": prefix, "sampling_params": {"max_new_tokens": 0}}
        await self._arequest("POST", "/generate", body)

    def unconditional_prompt(self) -> str:
        info = self.model_info
        return info.get("bos_token") or info.get("eos_token") or "\n"

    def stats(self) -> dict[str, Any]:
        return self._request("GET", "/stats")

    def flush_cache(self) -> bool:
        return bool(self._request("POST", "/flush_cache").get("flushed", True))

    def get_server_info(self) -> dict[str, Any]:
        return self._request("GET", "/server_info")

    def get_model_name(self) -> str:
        return self.model_info["model_path"]

    def shutdown(self) -> None:
        self._client.close()
        self._async_clients.close()


class AsyncClients:
    """One `httpx.AsyncClient` per event loop (a client's connections belong to the loop that
    opened them), made on first use from the same options as the blocking client."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._clients = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None or client.is_closed:
                client = self._clients[loop] = httpx.AsyncClient(**self._options)
            return client

    def close(self) -> None:
        """Forget the clients; a loop still running closes its own (others are gone)."""
        with self._lock:
            clients, self._clients = dict(self._clients), weakref.WeakKeyDictionary()
        for loop, client in clients.items():
            if not loop.is_closed() and loop.is_running():
                with contextlib.suppress(RuntimeError):
                    asyncio.run_coroutine_threadsafe(client.aclose(), loop)


class _StatusError(BackendError):
    """The server answered an HTTP error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error_text(path: str, status: int, text: str) -> str:
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text[:500]
    return f"{path} answered {status}: {message}"


# the servers whose /generate this backend speaks: this project's, and SGLang's own
ENDPOINT_SERVERS = ("runtime", "sglang")


def _check_sglang(params: dict[str, Any]) -> None:
    """What SGLang's /generate cannot take, refused by name (rather than dropped there)."""
    if params.get("grammar") is not None:
        raise BackendError(
            "RuntimeEndpoint(server='sglang'): SGLang's /generate has no lark grammar "
            "(gen(grammar=...)); write it in GBNF as gen(ebnf=...)"
        )
    if params.get("json_schema_mode") is not None:
        raise BackendError(
            "RuntimeEndpoint(server='sglang'): json_schema_mode is this project's server's "
            "field; SGLang has no such option"
        )




def _check_constraint_reached(params: dict[str, Any], meta: dict[str, Any]) -> None:
    """The server names the field its output was constrained by (`meta_info.constraint`);
    an answer to a constrained gen that names none was generated without the constraint: a
    gateway in between dropped a field SGLang's types do not have (`lark`) or that it does not
    pass on (`structural_tag`). Refuse it rather than pass free text for constrained output."""
    from grammar.constraint import given_kinds  # the constraint keywords of every entry point

    sent = given_kinds(params)  # (gen()'s `choices` / `dtype` travel as `regex`)
    if sent and not meta.get("constraint"):
        hint = " (write the grammar in GBNF: gen(ebnf=...))" if sent[0] == "grammar" else ""
        raise BackendError(
            f"the server answered without the {sent[0]} constraint: something between this "
            f"backend and the server (a gateway) dropped the field{hint}"
        )


def _answer(path: str, response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise _StatusError(
            response.status_code, _error_text(path, response.status_code, response.text)
        )
    return response.json()


_DONE = GenChunk("")  # the end of a /generate event stream ("data: [DONE]")


def _stream_event(line: str, params: dict[str, Any], server: str) -> GenChunk | None:
    """One line of `/generate`'s event stream as a chunk; None for a line that carries none,
    `_DONE` at the end."""
    if not line.startswith("data: "):
        return None
    payload = line[len("data: ") :]
    if payload == "[DONE]":
        return _DONE
    event = json.loads(payload)
    if "error" in event:
        raise BackendError(f"/generate stream failed: {event['error']['message']}")
    meta = event.get("meta_info") or {}
    done = None
    if meta.get("finish_reason"):
        if server == "runtime":
            _check_constraint_reached(params, meta)
        done = _to_output(event)
    return GenChunk(event.get("delta", ""), done)


def _to_output(body: dict[str, Any]) -> GenOutput:
    meta = body["meta_info"]
    reason = meta["finish_reason"]
    if reason["type"] == "abort":
        raise BackendError("the server aborted the request")
    out_lps = meta.get("output_token_logprobs")
    triples = out_lps if out_lps and isinstance(out_lps[0], list) else None
    return GenOutput(
        text=body["text"],
        finish_reason=reason["type"],
        prompt_tokens=meta["prompt_tokens"],
        cached_tokens=meta["cached_tokens"],
        completion_tokens=meta["completion_tokens"],
        logprobs=[t[0] for t in triples] if triples else out_lps,
        matched_stop=reason.get("matched"),
        output_token_logprobs=triples,
        output_top_logprobs=meta.get("output_top_logprobs") if triples else None,
        input_token_logprobs=meta.get("input_token_logprobs"),
        id=meta.get("id"),
    )


def completions_score_body(model: Any, prompt: str, continuations: list[str]) -> dict[str, Any]:
    """The `/v1/completions` request that scores each continuation after `prompt` in one call.

    The batch is the prompt alone, then prompt + each continuation, echoed with their
    tokens' log-probs and nothing generated (read back by `completions_scores`)."""
    return {
        "model": model,
        "prompt": [prompt] + [prompt + c for c in continuations],
        "echo": True,
        "logprobs": 0,
        "max_tokens": 0,
    }


def completions_scores(path: str, reply: Any, continuations: list[str]) -> list[list[float]]:
    """Per-token log-probs of each continuation from the reply to `completions_score_body`.

    A continuation's log-probs are those after the prompt's own tokens, which is what
    `/score` computes whenever the prompt's tokens begin the joint text's tokens and the rest
    are the continuation's tokens on its own (the usual case, e.g. a continuation that starts
    a new word). Where the joint text's tokens cross the boundary, the scored tokens start at
    the first one that differs from the prompt's (that token spans the end of the prompt and
    the start of the continuation).
    """
    choices = sorted(reply["choices"], key=lambda c: c["index"])
    if len(choices) != len(continuations) + 1 or any(c["logprobs"] is None for c in choices):
        raise NoPromptLogprobs(f"{path} did not echo the prompts' log-probs")
    base = choices[0]["logprobs"]["tokens"]
    out = []
    for choice in choices[1:]:
        tokens = choice["logprobs"]["tokens"]
        start = 0
        while start < min(len(base), len(tokens)) and base[start] == tokens[start]:
            start += 1
        if start == len(tokens):
            raise BackendError("cannot score an empty continuation")
        out.append([float(lp) for lp in choice["logprobs"]["token_logprobs"][max(start, 1) :]])
    return out


def score_by_completions(
    request: Any, path: str, model: Any, prompt: str, continuations: list[str]
) -> list[list[float]]:
    """Score through `/v1/completions` with a blocking `request(method, path, body)`."""
    reply = request("POST", path, completions_score_body(model, prompt, continuations))
    return completions_scores(path, reply, continuations)
