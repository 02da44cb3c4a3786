"""The worker endpoints the SGLang Model Gateway (`sglang-router`) reads beyond the OpenAI API.

The server's app factory calls `add_worker_routes(app, engine)`; routes the app already has
are left alone (the first registered route wins). What the gateway does with each:

  GET  /server_info, /get_server_info   at registration: the worker's model id
       -> {"model_path", "tokenizer_path", "served_model_name", "context_length", ...}
       the gateway names the worker after `served_model_name` (else `model_path`) and lists
       that name in its own /v1/models; without it the worker is model "unknown"
  GET  /model_info                      at registration (falls back to /get_model_info)
       -> {"model_path", "tokenizer_path", "served_model_name", "is_generation": true}
  GET  /get_load                        polled by load-aware policies
       -> [{"dp_rank": 0, "num_reqs", "num_waiting_reqs", "num_tokens"}]
  POST /flush_cache                     fanned out by the gateway's own POST /flush_cache
       -> 200 {"flushed": bool} (false while running requests still hold cached pages)

GET /health, the OpenAI routes, /generate and /metrics come from the server itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request


def _served_name(app: FastAPI, engine: Any) -> str:
    # the server keeps its served model name on app.state.server; fall back to the folder name
    server = getattr(app.state, "server", None)
    return getattr(server, "model_name", None) or engine.model_path.name


def _info(app: FastAPI, engine: Any) -> dict[str, Any]:
    path = str(engine.model_path)
    return {
        "model_path": path,
        "tokenizer_path": path,
        "served_model_name": _served_name(app, engine),
        "is_generation": True,
        "context_length": int(engine.config.max_position_embeddings),
        "dp_size": 1,
        # prefill-decode disaggregation: this server's role and the KV it moved
        **engine.disaggregation.counters(),
        "disaggregation_bootstrap_port": engine.disaggregation.bootstrap_port,
    }


def add_worker_routes(app: FastAPI, engine: Any) -> None:
    """Add /server_info, /get_server_info, /model_info, /get_load and /flush_cache to `app`."""
    existing = {getattr(route, "path", None) for route in app.routes}

    def add(path: str, method: str, endpoint: Any) -> None:
        if path not in existing:
            app.add_api_route(path, endpoint, methods=[method])

    async def server_info() -> dict[str, Any]:
        return _info(app, engine)

    async def model_info() -> dict[str, Any]:
        return _info(app, engine)

    async def get_load(request: Request) -> list[dict[str, Any]]:
        # engine calls block on the scheduler thread: keep them off the event loop
        stats = await asyncio.to_thread(engine.stats)
        return [
            {
                "dp_rank": 0,
                "num_reqs": int(stats.get("running", 0)) + int(stats.get("waiting", 0)),
                "num_waiting_reqs": int(stats.get("waiting", 0)),
                "num_tokens": int(stats.get("pool_used_tokens", 0)),
            }
        ]

    async def flush_cache() -> dict[str, Any]:
        return {"flushed": bool(await asyncio.to_thread(engine.flush_cache))}

    add("/server_info", "GET", server_info)
    add("/get_server_info", "GET", server_info)
    add("/model_info", "GET", model_info)
    add("/get_load", "GET", get_load)
    add("/flush_cache", "POST", flush_cache)
