"""The SGLang Model Gateway (PyPI `sglang-router`) as a child process, and its worker API.

The gateway is a Rust router. Started with `--worker-urls`, it registers each worker (GET
/health, then /server_info or /get_server_info and /model_info or /get_model_info for the
served model's name), routes `/generate`, `/v1/completions`, `/v1/chat/completions` and the
rest to one worker by its policy, health-checks the workers every few seconds (taking a
failing one out of rotation and putting it back once it answers again), retries a request
that failed on one worker, and answers `/v1/models` itself from the workers' model names.
Workers are added and removed at run time through its HTTP API: POST /workers {"url": ...},
DELETE /workers/{worker_id}, GET /workers.

In PD mode (`--pd-disaggregation --prefill URL BOOTSTRAP_PORT ... --decode URL ...`) it sends
each request to one prefill and one decode worker at once, with `bootstrap_host`,
`bootstrap_port` and `bootstrap_room` added, and answers with the decode worker's response; a
worker added at run time then says which it is: {"url", "worker_type", "bootstrap_port"}.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from runtime.cluster.errors import ClusterError
from runtime.cluster.process import ChildProcess, free_port

logger = logging.getLogger(__name__)

POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
API_TIMEOUT_S = 5.0


@dataclass(slots=True)
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "cache_aware"
    health_check_interval_s: int = 5
    health_check_timeout_s: int = 5
    health_failure_threshold: int = 2
    shutdown_grace_s: int = 5
    log_level: str = "warn"


@dataclass(slots=True)
class WorkerInfo:
    """One worker as the gateway lists it."""

    worker_id: str
    url: str
    healthy: bool
    model_id: str


class Gateway:
    def __init__(self, settings: GatewaySettings, log_dir: Path) -> None:
        if importlib.util.find_spec("sglang_router") is None:
            raise ClusterError(
                "the cluster needs the SGLang Model Gateway: pip install sglang-router"
            )
        if settings.policy not in POLICIES:
            raise ClusterError(f"unknown policy {settings.policy!r}; expected one of {POLICIES}")
        self.settings = settings
        self.log_path = log_dir / "router.log"
        self.process: ChildProcess | None = None
        self.metrics_port = free_port(settings.host)

    @property
    def url(self) -> str:
        host = self.settings.host
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.settings.port}"

    def argv(
        self, worker_urls: list[str], prefill: list[tuple[str, int]] | None = None
    ) -> list[str]:
        """`prefill` (URL, bootstrap port) pairs: PD mode, `worker_urls` being the decoders."""
        s = self.settings
        if prefill is None:
            workers = ["--worker-urls", *worker_urls]
        else:
            workers = ["--pd-disaggregation"]
            for url, port in prefill:
                workers += ["--prefill", url, str(port)]
            for url in worker_urls:
                workers += ["--decode", url]
        return [
            sys.executable, "-m", "sglang_router.launch_router",
            "--host", s.host,
            "--port", str(s.port),
            "--policy", s.policy,
            *workers,
            "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(self.metrics_port),
            "--health-check-interval-secs", str(s.health_check_interval_s),
            "--health-check-timeout-secs", str(s.health_check_timeout_s),
            "--health-failure-threshold", str(s.health_failure_threshold),
            "--health-success-threshold", "1",
            "--worker-startup-check-interval", "1",
            "--shutdown-grace-period-secs", str(s.shutdown_grace_s),
            "--log-level", s.log_level,
        ]  # fmt: skip

    def start(self, worker_urls: list[str], prefill: list[tuple[str, int]] | None = None) -> None:
        self.process = ChildProcess("router", self.argv(worker_urls, prefill), self.log_path)
        self.process.start()

    def is_running(self) -> bool:
        return self.process is not None and self.process.is_running()

    def wait_ready(self, worker_urls: list[str], timeout_s: float) -> None:
        """Block until the gateway serves and lists every URL as a healthy worker."""
        deadline = time.monotonic() + timeout_s
        missing = set(worker_urls)
        while time.monotonic() < deadline:
            if not self.is_running():
                raise ClusterError(self.failure("exited during startup"))
            try:
                healthy = {w.url for w in self.workers() if w.healthy}
                missing = set(worker_urls) - healthy
                if not missing:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.25)
        raise ClusterError(
            self.failure(f"did not list {sorted(missing)} as healthy within {timeout_s:.0f} s")
        )

    def workers(self) -> list[WorkerInfo]:
        reply = self._call("GET", "/workers")
        return [
            WorkerInfo(w["id"], w["url"], bool(w.get("is_healthy")), w.get("model_id", ""))
            for w in reply.get("workers", [])
        ]

    def add_worker(
        self, url: str, worker_type: str | None = None, bootstrap_port: int | None = None
    ) -> None:
        """Register `url` (the gateway checks its /health and reads its model info first); in
        PD mode with its `worker_type` ("prefill" with its bootstrap port, or "decode")."""
        body: dict[str, Any] = {"url": url}
        if worker_type is not None:
            body["worker_type"] = worker_type
        if bootstrap_port is not None:
            body["bootstrap_port"] = bootstrap_port
        self._call("POST", "/workers", json=body)
        logger.info("router: added worker %s", url)

    def remove_worker(self, url: str) -> bool:
        """Take `url` out of rotation; False when the gateway does not list it."""
        for worker in self.workers():
            if worker.url == url:
                self._call("DELETE", f"/workers/{worker.worker_id}")
                logger.info("router: removed worker %s", url)
                return True
        return False

    def stop(self, grace_s: float) -> None:
        if self.process is not None:
            self.process.stop(grace_s)

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        reply = httpx.request(method, self.url + path, timeout=API_TIMEOUT_S, **kwargs)
        if reply.status_code >= 400:
            raise ClusterError(
                f"router {method} {path} answered {reply.status_code}: {reply.text[:500]}"
            )
        return reply.json() if reply.content else {}

    def failure(self, what: str) -> str:
        tail = self.process.log_tail() if self.process is not None else ""
        return f"router ({self.url}) {what}; log {self.log_path} ends with:\n{tail}"
