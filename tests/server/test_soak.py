"""A one-minute soak of one server (the tiny model) under the mixed load of
`benchmarks.reliability.soak`, with compile workers killed while it runs: nothing hangs, nothing
fails with a 5xx, every answer keeps its contract, and after `/flush_cache` the pool is empty and
its accounting consistent."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.reliability import topologies as soak_topologies
from benchmarks.reliability.soak import soak
from tests.support.server_process import tiny_model_dir


@pytest.mark.slow
def test_a_minute_of_mixed_load_with_faults_on_one_server():
    server = soak_topologies.start(
        "server", str(tiny_model_dir()), ["--grammar-compile-timeout", "6"]
    )
    args = argparse.Namespace(
        minutes=1.0, clients=6, hang_s=120.0, fault_every=10.0, warm_up_minutes=0.25
    )
    try:
        report = soak(server, args)
    finally:
        server.stop()
    # pytest cuts a long dict in its message: the parts that say what went wrong come first
    report = {k: report[k] for k in ("wrong", "failures", "by_kind")} | report
    assert report["hung"] == 0, report
    assert report["failed_5xx"] == 0, report
    assert report["n_wrong"] == 0, report
    assert report["answered_2xx"] > 0 and report["refused_4xx"] > 0, report
    assert report["pool_used_tokens_after_flush"] == 0, report
    assert report["integrity"] == "ok", report
    assert report["faults"] and report["recovered"], report  # compile workers killed, replaced
    # the warm-up (before the memory baseline) had its own fault, not counted in the run's
    warm = report["warm_up"]
    assert len(warm["faults"]) == 1 and warm["hung"] == 0 and warm["n_wrong"] == 0, report
    assert not set(warm["faults"]) & set(report["faults"]), report
