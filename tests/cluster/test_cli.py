"""`python -m runtime.cluster` start-up failures and signals before the router serves."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.support.cluster_process import alive, descendants, launch, replica_pids, wait_for
from tests.support.server_process import tiny_model_dir

pytestmark = pytest.mark.timeout(180)


def test_missing_model_exits_1_with_the_replica_log(tmp_path):
    proc = launch(tmp_path / "no-such-model", "cache_aware", tmp_path, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 1
    assert out == ""  # no router line
    assert "replica" in err and "exited with status" in err
    assert "no-such-model" in err  # the tail of the replica's own log says what was wrong


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_signal_while_starting_stops_every_replica(tmp_path, sig):
    proc = launch(tiny_model_dir(), "cache_aware", tmp_path, stderr=subprocess.DEVNULL)
    wait_for(lambda: len(replica_pids(proc.pid)) == 2, 60, "both replicas to be started")
    children = descendants(proc.pid)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == ""
    wait_for(lambda: not any(alive(p) for p in children), 10, "replicas to exit")


def test_killed_cluster_process_leaves_no_orphans(tmp_path):
    proc = launch(tiny_model_dir(), "cache_aware", tmp_path, stderr=subprocess.DEVNULL)
    wait_for(lambda: len(replica_pids(proc.pid)) == 2, 60, "both replicas to be started")
    children = descendants(proc.pid)
    proc.kill()  # SIGKILL: no handler runs; the kernel's parent-death signal stops the children
    proc.wait()
    wait_for(lambda: not any(alive(p) for p in children), 30, "orphaned replicas to exit")


@pytest.mark.parametrize("counts", [("1", "0"), ("0", "2")], ids=["no-decode", "no-prefill"])
def test_pd_mode_needs_both_roles(tmp_path, counts):
    extra = ("--prefill", counts[0], "--decode", counts[1])
    proc = launch(tiny_model_dir(), "cache_aware", tmp_path, extra=extra, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and out == ""
    assert "needs at least one prefill and one decode server" in err
