"""The FastAPI application: routes, bearer auth, request counting, shutdown of in-flight work."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from runtime.scheduling import compile_pool
from runtime.server import native_api, openai_api, responses_api, tool_routes
from runtime.server.bridge import EngineBridge
from runtime.server.errors import APIError, install_error_handlers
from runtime.server.state import ServerState, get_state

logger = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/health"})
KNOWN_PATHS = frozenset(
    {
        "/health",
        "/metrics",
        "/stats",
        "/v1/models",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/generate",
        "/score",
        "/get_model_info",
        "/apply_chat_template",
        "/flush_cache",
        "/server_info",
        "/get_server_info",
        "/model_info",
        "/get_load",
        "/concate_and_append_request",
        "/parse_function_call",
        "/separate_reasoning",
    }
)


class GateMiddleware:
    """Bearer auth on every path but /health, and a count of every answer by path and status.

    A plain ASGI middleware (not BaseHTTPMiddleware) so streaming bodies and client
    disconnects pass through untouched.
    """

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app = app
        self.state = state

    def _authorized(self, scope: dict[str, Any]) -> bool:
        if self.state.api_key is None or scope["path"] in PUBLIC_PATHS:
            return True
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    token.strip().encode(), self.state.api_key.encode()
                )
        return False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in KNOWN_PATHS else "other"
        started = time.perf_counter()
        # a pathological constraint's compile budget counts from here (the body not read yet)
        compile_pool.arrival.set(time.monotonic())
        status, streaming = 500, False

        async def send_counted(message: dict[str, Any]) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    if name == b"content-type" and value.startswith(b"text/event-stream"):
                        streaming = True
            await send(message)

        try:
            if self._authorized(scope):
                await self.app(scope, receive, send_counted)
            else:
                err = APIError(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                )
                await err.response()(scope, receive, send_counted)
        finally:
            elapsed = None if streaming else time.perf_counter() - started
            self.state.metrics.record_request(path, status, elapsed)


ROOM_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})


class RoomRejectMiddleware:
    """On a prefill server: a request with a `bootstrap_room` that is answered with an error
    status (invalid, refused, server busy) fails that room at once, so the decode server asking
    for it is told now instead of after the hand-off timeout."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app = app
        self.disaggregation = state.engine.disaggregation

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in ROOM_PATHS:
            await self.app(scope, receive, send)
            return
        body: list[bytes] = []
        status = 0

        async def receive_copy() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
            return message

        async def send_watch(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400:
                self._reject(b"".join(body), status, message.get("body", b""))
                status = 0  # once
            await send(message)

        await self.app(scope, receive_copy, send_watch)

    def _reject(self, request: bytes, status: int, answer: bytes) -> None:
        try:
            room = json.loads(request).get("bootstrap_room")
        except (ValueError, AttributeError):
            return  # not a JSON object: it carried no room we could know
        try:
            detail = json.loads(answer)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = answer[:200].decode(errors="replace")
        for one in room if isinstance(room, list) else [room]:  # (a list: one per generation)
            if isinstance(one, int):
                self.disaggregation.reject(
                    one, f"the prefill server answered the request with {status}: {detail}"
                )


def create_app(state: ServerState) -> FastAPI:
    """The app for one engine; the engine's lifetime is the caller's."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.bridge.loop = asyncio.get_running_loop()
        yield
        state.bridge.draining = True
        cancelled = state.bridge.cancel_all()
        if cancelled:
            logger.info("shutdown: cancelled %d running requests", cancelled)

    app = FastAPI(title="sgl runtime server", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)
    app.include_router(openai_api.router)
    app.include_router(responses_api.router)
    app.include_router(native_api.router)
    app.include_router(tool_routes.router)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        bridge = get_state(request).bridge
        if bridge.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        s = get_state(request)
        card = {
            "id": s.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "sgl",
            "root": str(s.engine.model_path),
            "max_model_len": s.bridge.context_len,
        }
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        s = get_state(request)
        s.check_model(model_id)
        return {"id": s.model_name, "object": "model", "created": 0, "owned_by": "sgl"}

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        s = get_state(request)
        engine_stats = await s.bridge.run(s.engine.stats)
        text = s.metrics.render(engine_stats, s.bridge.in_flight)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    _add_gateway_routes(app, state)
    if state.engine.disaggregation.mode == "prefill":
        app.add_middleware(RoomRejectMiddleware, state=state)
    app.add_middleware(GateMiddleware, state=state)
    return app


def _add_gateway_routes(app: FastAPI, state: ServerState) -> None:
    """The worker routes the SGLang Model Gateway reads (runtime/server/worker_routes.py)."""
    from runtime.server.worker_routes import add_worker_routes

    add_worker_routes(app, state.engine)


def build_state(
    engine: Any,
    *,
    model_name: str | None = None,
    api_key: str | None = None,
    max_queue: int = 256,
    max_running: int = 64,
    compile_pool: Any = None,
) -> ServerState:
    """`compile_pool`: where request checks compile constraints (default: the engine's own,
    `Engine.compile_pool`; an engine without one: checked in-process)."""
    bridge = EngineBridge(engine, max_running=max_running, max_queue=max_queue)
    name = model_name or engine.model_path.name
    if compile_pool is None:
        compile_pool = getattr(engine, "compile_pool", None)
    return ServerState(bridge=bridge, model_name=name, api_key=api_key, compile_pool=compile_pool)
