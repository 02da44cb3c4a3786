"""`device.runner.ModelRunner`: the one owner of the model at run time; nothing of the model
is read or set through it by attribute forwarding."""

from __future__ import annotations

import pytest
import torch

from runtime import Engine
from runtime.device import ModelRunner, RunnerStats
from runtime.models.loader import load_model_files
from runtime.models.registry import model_class

GREEDY = dict(max_new_tokens=4, temperature=0.0, ignore_eos=True)


def test_the_runner_owns_the_model_and_forwards_no_attribute(model_dir):
    with Engine(model_dir, page_size=4, max_total_tokens=1024, cuda_graph_bs=[1, 2]) as e:
        runner = e.runner
        assert runner.model is e.model and runner.config is e.config
        assert not hasattr(runner, "attention")  # the model's: read at e.model, not here
        assert hasattr(e.model, "attention")
        with pytest.raises(AttributeError):
            runner.absorb = False  # no attribute lands on the runner (or silently nowhere)
        with pytest.raises(AttributeError, match="'absorb'"):
            runner.set("absorb", False)  # a Llama has no such setting: named, not set
        e.generate(["a b c", "d e f"], **GREEDY)
        stats, engine_stats = runner.stats(), e.stats()
        assert isinstance(stats, RunnerStats) and not stats.parallel
        assert stats.device == "cpu" == engine_stats["device"]
        assert stats.graph_batch_sizes == (1, 2)
        assert stats.graph_replays == engine_stats["graph_replays"] > 0
        assert stats.threads == engine_stats["forward_threads"]
        assert runner.failed is None and not runner.restartable and runner.worker_pids == []


def test_set_reaches_the_model(deepseek_dir):
    loaded = load_model_files(deepseek_dir)
    model = model_class(loaded.config)(loaded.config, loaded.state_dict, torch.float32)
    runner = ModelRunner(model, None, torch.device("cpu"))
    assert model.absorb is True
    runner.set("absorb", False)
    assert model.absorb is False


class _Driver:
    """Stands in for `workers.driver.ParallelModel`: records what the runner asks of it."""

    def __init__(self) -> None:
        self.config = "config"
        self.failed: str | None = None
        self.calls: list = []
        self.restartable = True
        self.worker_pids = [11, 12]
        self.kv_bytes_per_token_per_rank = 64

    def forward(self, batch, pool):
        self.calls.append(("forward", batch, pool))
        return torch.ones(1, 3)

    def weight_bytes(self) -> int:
        return 1000

    def set(self, name, value) -> None:
        self.calls.append(("set", name, value))

    def restart(self) -> None:
        self.calls.append(("restart",))
        self.failed = None

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))


def test_a_parallel_runner_asks_the_driver():
    driver = _Driver()
    runner = ModelRunner.parallel(driver, torch.device("cpu"))
    assert runner.model is driver and runner.config == "config" and runner.is_parallel
    assert torch.equal(runner.forward("batch", "pool"), torch.ones(1, 3))
    runner.set("absorb", False)
    driver.failed = "rank 1 exited"
    assert runner.failed == "rank 1 exited" and runner.restartable
    runner.restart()
    runner.shutdown()
    assert driver.calls == [("forward", "batch", "pool"), ("set", "absorb", False), ("restart",),
                            ("shutdown",)]  # fmt: skip
    assert runner.failed is None and runner.weight_bytes() == 1000
    assert runner.worker_pids == [11, 12] and runner.kv_bytes_per_token_per_rank(8) == 64
    assert runner.expert_load() is None
    stats = runner.stats()
    assert stats.parallel and stats.graph_batch_sizes == () and stats.thread_choices == ()
