"""N server replicas behind the gateway, and the supervisor loop that keeps them serving.

A replica is watched two ways. The gateway health-checks every worker (GET /health every
few seconds) and stops routing to one that fails twice, which also covers a replica that
hangs. The supervisor here watches the processes: when one exits it removes that URL from
the gateway at once (so no request waits for a health check to notice), restarts the process
on the same port after a back-off, and adds the URL back once /health answers.

With `prefill` / `decode` counts the cluster is disaggregated: that many prefill servers
(each with its own KV bootstrap port) and decode servers, behind the gateway in PD mode; a
restarted one goes back in with its role.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from runtime.cluster.errors import ClusterError
from runtime.cluster.gateway import Gateway, GatewaySettings
from runtime.cluster.process import free_port
from runtime.cluster.replica import Replica, ReplicaState

logger = logging.getLogger(__name__)

SUPERVISE_INTERVAL_S = 0.5


@dataclass(slots=True)
class ClusterConfig:
    replicas: int = 2
    model: str | None = None
    policy: str = "cache_aware"
    host: str = "127.0.0.1"  # where the gateway listens; replicas always bind loopback
    port: int = 30000  # the gateway's port; 0 picks a free one
    server_args: list[str] = field(default_factory=list)  # extra `runtime.server` flags
    log_dir: Path | None = None  # None: a temporary folder, removed after a clean stop
    startup_timeout_s: float = 600.0
    stop_grace_s: float = 15.0
    health_check_interval_s: int = 5
    server_module: str = "runtime.server"
    prefill: int = 0  # PD mode when prefill or decode > 0 (then `replicas` is not used)
    decode: int = 0

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0 or self.decode > 0


class Cluster:
    """Start with `start()`, keep alive with `supervise()` (or `serve_forever()`), `stop()`."""

    def __init__(self, config: ClusterConfig) -> None:
        if config.disaggregated and (config.prefill < 1 or config.decode < 1):
            raise ClusterError(
                f"PD mode needs at least one prefill and one decode server, got --prefill "
                f"{config.prefill} --decode {config.decode}"
            )
        if config.replicas < 1 and not config.disaggregated:
            raise ClusterError(f"--replicas must be at least 1, got {config.replicas}")
        if config.policy == "power_of_two" and config.replicas < 2 and not config.disaggregated:
            raise ClusterError("the power_of_two policy needs at least 2 replicas")
        self.config = config
        self._own_log_dir = config.log_dir is None
        self.log_dir = Path(config.log_dir or tempfile.mkdtemp(prefix="sgl-cluster-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port = config.port or free_port(config.host)
        settings = GatewaySettings(
            host=config.host,
            port=port,
            policy=config.policy,
            health_check_interval_s=config.health_check_interval_s,
        )
        self.gateway = Gateway(settings, self.log_dir)
        if config.disaggregated:
            roles = [("prefill", i) for i in range(config.prefill)]
            roles += [("decode", i) for i in range(config.decode)]
        else:
            roles = [(None, i) for i in range(config.replicas)]
        self.replicas = [
            Replica(
                i,
                free_port(),
                model=config.model,
                server_args=config.server_args,
                server_module=config.server_module,
                log_dir=self.log_dir,
                role=role,
                bootstrap_port=free_port() if role == "prefill" else None,
            )
            for role, i in roles
        ]
        self._stopped = False
        self._lock = threading.Lock()

    @property
    def router_url(self) -> str:
        return self.gateway.url

    def start(self) -> None:
        """Start every replica, wait for their /health, then start the gateway in front."""
        logger.info("logs in %s", self.log_dir)
        try:
            for replica in self.replicas:
                replica.start()
            for replica in self.replicas:
                replica.wait_healthy(self.config.startup_timeout_s)
                logger.info("%s serves on %s", replica.name, replica.url)
            urls = [r.url for r in self.replicas]
            if self.config.disaggregated:
                prefill = [(r.url, r.bootstrap_port) for r in self.replicas if r.role == "prefill"]
                decode = [r.url for r in self.replicas if r.role == "decode"]
                self.gateway.start(decode, prefill)  # type: ignore[arg-type]
            else:
                self.gateway.start(urls)
            self.gateway.wait_ready(urls, self.config.startup_timeout_s)
        except BaseException:
            self.stop(keep_logs=True)
            raise
        for replica in self.replicas:
            replica.state = ReplicaState.SERVING
        logger.info("router %s (%s) in front of %s", self.router_url, self.config.policy, urls)

    def supervise(self) -> None:
        """One pass: notice dead replicas, restart them when due, re-add the healthy ones."""
        with self._lock:
            if self._stopped:
                return
            if not self.gateway.is_running():
                raise ClusterError(self.gateway.failure("exited"))
            now = time.monotonic()
            for replica in self.replicas:
                self._supervise_replica(replica, now)

    def _supervise_replica(self, replica: Replica, now: float) -> None:
        if replica.state is ReplicaState.SERVING and not replica.is_running():
            replica.mark_dead(now)
            self._remove_from_gateway(replica)
        elif replica.state is ReplicaState.DEAD and now >= replica.restart_at:
            replica.restart()
        elif replica.state is ReplicaState.STARTING:
            if now - replica.started_at > self.config.startup_timeout_s:
                logger.warning("%s did not become healthy in time: killing it", replica.name)
                replica.stop(grace_s=1.0)
            if not replica.is_running():
                replica.mark_dead(now)
            elif replica.is_healthy():
                try:
                    self.gateway.add_worker(replica.url, replica.role, replica.bootstrap_port)
                except (ClusterError, httpx.HTTPError) as exc:
                    logger.warning("could not add %s to the router: %s", replica.url, exc)
                    return  # still STARTING: tried again on the next pass
                replica.state = ReplicaState.SERVING
                logger.info("%s is back in rotation on %s", replica.name, replica.url)

    def _remove_from_gateway(self, replica: Replica) -> None:
        try:
            self.gateway.remove_worker(replica.url)
        except (ClusterError, httpx.HTTPError) as exc:
            # the gateway's own health checks take the URL out a few seconds later anyway
            logger.warning("could not remove %s from the router: %s", replica.url, exc)

    def serve_forever(self, stop: threading.Event) -> None:
        """Supervise until `stop` is set (by a signal handler); the caller then calls stop()."""
        while not stop.wait(SUPERVISE_INTERVAL_S):
            self.supervise()

    def stop(self, keep_logs: bool = False) -> None:
        """Stop the gateway first (no new requests), then every replica; idempotent.

        A temporary log folder is removed unless `keep_logs` (set after a failure).
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        grace = self.config.stop_grace_s
        self.gateway.stop(grace)
        # SIGTERM every replica first so they drain in parallel, then wait for each
        for replica in self.replicas:
            if replica.process is not None:
                replica.process.terminate()
        for replica in self.replicas:
            replica.stop(grace)
        if self._own_log_dir and not keep_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        logger.info("cluster stopped")
