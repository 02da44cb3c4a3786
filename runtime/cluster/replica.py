"""One `python -m runtime.server` replica: its port, its process, its health, its restarts."""

from __future__ import annotations

import enum
import logging
import sys
import time
from pathlib import Path

import httpx

from runtime.cluster.errors import ClusterError
from runtime.cluster.process import ChildProcess

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 2.0
MAX_RESTART_DELAY_S = 30.0
STABLE_AFTER_S = 60.0  # a replica that ran this long before dying restarts after the least delay


class ReplicaState(enum.Enum):
    STARTING = "starting"  # process started, /health not yet answered
    SERVING = "serving"  # healthy and registered with the gateway
    DEAD = "dead"  # process ended; waiting for its restart time


class Replica:
    """A server process bound to a fixed loopback port, so a restart keeps its URL.

    Invariant: `state` is SERVING only while the gateway lists `url` as a worker; the
    cluster moves a replica out of SERVING (and the URL out of the gateway) before restarting.
    """

    def __init__(
        self,
        index: int,
        port: int,
        *,
        host: str = "127.0.0.1",
        model: str | None = None,
        server_args: list[str] | None = None,
        server_module: str = "runtime.server",
        log_dir: Path,
        role: str | None = None,
        bootstrap_port: int | None = None,
    ) -> None:
        self.index = index
        self.role = role  # PD mode: "prefill" or "decode"; None: a plain replica
        self.bootstrap_port = bootstrap_port  # a prefill replica's KV bootstrap port
        self.host = host
        self.port = port
        self.model = model
        self.server_args = list(server_args or [])
        self.server_module = server_module
        self.log_path = log_dir / f"{role or 'replica'}-{index}.log"
        self.state = ReplicaState.STARTING
        self.restarts = 0  # in total
        self.quick_failures = 0  # deaths in a row, each within STABLE_AFTER_S of its start
        self.restart_at = 0.0  # monotonic time of the next restart while DEAD
        self.started_at = 0.0  # monotonic time of the last start
        self.process: ChildProcess | None = None

    @property
    def name(self) -> str:
        return f"{self.role or 'replica'} {self.index}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", self.server_module, "--host", self.host]
        argv += ["--port", str(self.port)]
        if self.model is not None:
            argv += ["--model", self.model]
        if self.role is not None:
            argv += ["--disaggregation-mode", self.role]
        if self.bootstrap_port is not None:
            argv += ["--disaggregation-bootstrap-port", str(self.bootstrap_port)]
        return argv + self.server_args

    def start(self) -> None:
        self.process = ChildProcess(self.name, self.argv(), self.log_path)
        self.process.start()
        self.started_at = time.monotonic()
        self.state = ReplicaState.STARTING

    def is_running(self) -> bool:
        return self.process is not None and self.process.is_running()

    def is_healthy(self) -> bool:
        """True when /health answers 200 within HEALTH_TIMEOUT_S."""
        try:
            return httpx.get(f"{self.url}/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float) -> None:
        """Block until /health answers; ClusterError if the process ends or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.is_running():
                raise ClusterError(self._failure(f"exited with status {self._exit_code()}"))
            if self.is_healthy():
                return
            time.sleep(0.25)
        raise ClusterError(self._failure(f"did not answer /health within {timeout_s:.0f} s"))

    def mark_dead(self, now: float) -> None:
        """Record the death and schedule the restart: after 1 s, doubling up to 30 s while the
        replica keeps dying soon after each start."""
        if now - self.started_at < STABLE_AFTER_S:
            self.quick_failures += 1
        else:
            self.quick_failures = 1
        self.state = ReplicaState.DEAD
        delay = 2.0 ** min(self.quick_failures - 1, 5)
        self.restart_at = now + min(MAX_RESTART_DELAY_S, delay)
        logger.warning(
            "%s (%s) exited with status %s; restarting in %.0f s (log: %s)",
            self.name,
            self.url,
            self._exit_code(),
            self.restart_at - now,
            self.log_path,
        )

    def restart(self) -> None:
        self.restarts += 1
        logger.info("%s: restart %d on %s", self.name, self.restarts, self.url)
        self.start()

    def stop(self, grace_s: float) -> None:
        if self.process is not None:
            self.process.stop(grace_s)

    def _exit_code(self) -> int | None:
        return None if self.process is None else self.process.exit_code()

    def _failure(self, what: str) -> str:
        tail = self.process.log_tail() if self.process is not None else ""
        return f"{self.name} ({self.url}) {what}; log {self.log_path} ends with:\n{tail}"
