"""Replica failure and recovery behind the gateway (round-robin), and a clean SIGTERM.

The module's tests share one cluster, handed out only while it runs with both replicas healthy
(else a fresh one is started), so the tests pass in any order or alone: a replica is killed,
the other keeps serving, the supervisor restarts the dead one and it rejoins (the cluster is
whole again); SIGTERM stops everything (the next test gets a new cluster).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from tests.support.cluster_process import ClusterProcess, alive, completions_answered, wait_for
from tests.support.server_process import tiny_model_dir

pytestmark = pytest.mark.timeout(300)


class Clusters:
    """The module's round-robin cluster: `live()` returns it while its process runs and the
    router sees both replicas healthy, else stops it and starts a fresh one."""

    def __init__(self) -> None:
        self.current: ClusterProcess | None = None

    def live(self) -> ClusterProcess:
        c = self.current
        if c is not None and (c.proc.poll() is not None or len(healthy_urls(c)) != 2):
            self.close()
        if self.current is None:
            self.current = ClusterProcess(tiny_model_dir(), "round_robin")
        return self.current

    def close(self) -> None:
        if self.current is not None:
            c, self.current = self.current, None
            c.stop(signal.SIGKILL if c.proc.poll() is None else signal.SIGTERM)


@pytest.fixture(scope="module")
def clusters():
    held = Clusters()
    yield held
    held.close()


def model_of(cluster: ClusterProcess) -> str:
    replica = cluster.replica_urls()[0]
    return httpx.get(f"{replica}/v1/models", timeout=10).json()["data"][0]["id"]


def complete(cluster, model: str, prompt: str, max_tokens: int = 2) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    return httpx.post(f"{cluster.url}/v1/completions", json=body, timeout=120)


def healthy_urls(cluster) -> set[str]:
    return {w["url"] for w in cluster.workers() if w["is_healthy"]}


def test_round_robin_spreads_a_shared_prefix(clusters):
    cluster = clusters.live()
    model, replicas = model_of(cluster), cluster.replica_urls()
    before = {r: completions_answered(r) for r in replicas}
    for i in range(4):
        assert complete(cluster, model, f"Shared prefix, request {i}").status_code == 200
    assert [completions_answered(r) - before[r] for r in replicas] == [2, 2]


def test_killed_replica_leaves_the_other_serving_then_rejoins(clusters):
    cluster = clusters.live()
    model = model_of(cluster)
    pids = cluster.replica_pids()
    victim, survivor = sorted(pids)
    outcomes: list[tuple[int, str]] = []
    stop = threading.Event()

    def traffic() -> None:
        # requests keep flowing while the replica dies: each must end with an answer
        i = 0
        while not stop.is_set():
            reply = complete(cluster, model, f"Background request {i}", max_tokens=8)
            outcomes.append((reply.status_code, reply.text))
            i += 1

    sender = threading.Thread(target=traffic)
    sender.start()
    wait_for(lambda: len(outcomes) >= 2, 60, "background requests")
    os.killpg(pids[victim], signal.SIGKILL)
    wait_for(lambda: victim not in healthy_urls(cluster), 30, "the router to drop the replica")
    n_before = len(outcomes)
    wait_for(lambda: len(outcomes) >= n_before + 4, 60, "requests after the kill")
    stop.set()
    sender.join(timeout=120)

    before = completions_answered(survivor)
    for i in range(4):
        assert complete(cluster, model, f"After the kill {i}").status_code == 200
    assert completions_answered(survivor) - before == 4
    # during the kill a request may fail, but with an error status and a message, never hang
    failures = [(s, t) for s, t in outcomes if s != 200]
    assert all(s >= 500 and t for s, t in failures), failures
    assert len(failures) <= 2, failures
    assert outcomes[-1][0] == 200

    # the supervisor restarts the dead replica, and the router sends to it again
    url, old_pid = victim, pids[victim]

    def rejoined() -> bool:
        pid = cluster.replica_pids().get(url)
        return pid is not None and pid != old_pid and url in healthy_urls(cluster)

    wait_for(rejoined, 180, "the restarted replica to rejoin")
    for i in range(4):
        assert complete(cluster, model, f"After the restart {i}").status_code == 200
    assert completions_answered(url) >= 1  # a fresh process: every count is new


def test_sigterm_stops_the_cluster_and_every_child(clusters):
    cluster = clusters.live()
    children = cluster.descendants()
    assert len(children) >= 3, children  # two replicas and the router
    started = time.monotonic()
    assert cluster.stop(signal.SIGTERM, timeout=60) == 0, cluster.logs()
    assert time.monotonic() - started < 45
    wait_for(lambda: not any(alive(p) for p in children), 10, "children to exit")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{cluster.url}/health", timeout=5)
