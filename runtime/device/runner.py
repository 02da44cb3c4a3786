"""`ModelRunner`: the one owner of an engine's model at run time.

It holds the model (or, for a parallel engine, the driver of its worker ranks), the device it
runs on, the thread choice (`models.threads.ThreadChooser`, CPU only) and the decode graphs
(`graph_runner.DecodeGraphs`); the scheduler, the engine's stats and the speculative code call
its methods, none of which forwards attribute reads to the model. One forward:

    runner.forward(batch, pool)
      parallel:     the driver broadcasts the batch to the ranks, receives the logits
      decode graph: a decode step a bucket holds replays the bucket (the model's call inside)
      otherwise:    the batch copied to the device (not on the CPU), then the model's forward,
                    with the chooser's thread count when there is a chooser

`stats()` says what it chose and ran (`RunnerStats`). The model itself is `runner.model` (tests
and benchmarks read its internals there); a model setting that every rank must see (MLA's
`absorb`) goes through `runner.set(name, value)`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.config import ModelConfig
from runtime.device import cuda
from runtime.device.graph_runner import DecodeGraphs, decode_graphs
from runtime.memory.kv_pool import KVPool
from runtime.models.model import Model
from runtime.models.threads import ThreadChooser, WaitChoice


class Driver(Protocol):
    """A parallel engine's worker ranks as the runner sees them (`workers.driver.ParallelModel`:
    built by the engine, handed over; this layer imports nothing of the workers)."""

    config: ModelConfig
    failed: str | None

    def forward(self, batch: ForwardBatch, pool: object) -> torch.Tensor: ...
    def weight_bytes(self) -> int: ...
    def set(self, name: str, value: object) -> None: ...
    def restart(self) -> None: ...
    def shutdown(self) -> None: ...

    @property
    def restartable(self) -> bool: ...
    @property
    def worker_pids(self) -> list[int]: ...
    @property
    def kv_bytes_per_token_per_rank(self) -> int: ...


@dataclass(frozen=True)
class RunnerStats:
    """What the runner chose and ran so far."""

    device: str  # where the forward runs ("cpu", "cuda:0"; a parallel engine's rank device)
    parallel: bool  # the forward runs on worker ranks
    threads: int  # torch threads of the forward now (the chooser's current choice)
    thread_choices: tuple[int, ...]  # what the chooser measures between; () without one
    thread_switches: int  # times the chooser changed its choice
    graph_batch_sizes: tuple[int, ...]  # decode batch sizes replayed; () without graphs
    graph_replays: int  # decode steps that ran through a bucket
    decode_path: str | None  # how the model decodes (its `decode_path`), if it says
    omp_wait_switches: int = 0  # times the per-step OpenMP wait choice changed (WaitChoice)


class ModelRunner:
    """The model, its placement, thread choice, graph replay and parallel driver (see above).
    Built by `local` (one process) or `parallel` (worker ranks)."""

    __slots__ = ("_bound", "_chooser", "_driver", "_graphs", "_model", "_waits", "device", "pool")

    def __init__(
        self,
        model: Model | None,
        pool: KVPool | None,
        device: torch.device,
        *,
        chooser: ThreadChooser | None = None,
        driver: Driver | None = None,
    ) -> None:
        self._model, self._driver, self._chooser = model, driver, chooser
        self.pool, self.device = pool, device
        self._graphs: DecodeGraphs | None = None
        self._bound: set[int] = set()  # threads already bound to the device
        self._waits: WaitChoice | None = None  # libgomp's wait chosen per step (dense CPU)

    @classmethod
    def local(
        cls,
        model: Model,
        pool: KVPool,
        device: torch.device,
        *,
        chooser: ThreadChooser | None,
        disable_cuda_graph: bool,
        batch_sizes: Sequence[int] | None,
        max_running: int,
    ) -> ModelRunner:
        """A one-process engine's runner; decode graphs captured here when the device and the
        options call for them (`graph_runner.decode_graphs`)."""
        runner = cls(model, pool, device, chooser=chooser)
        runner._bind_thread()
        runner._graphs = decode_graphs(
            runner._forward_model, model, pool, device, disable_cuda_graph=disable_cuda_graph,
            batch_sizes=batch_sizes, max_running=max_running,
        )  # fmt: skip
        return runner

    @classmethod
    def parallel(cls, driver: Driver, device: torch.device) -> ModelRunner:
        """A parallel engine's runner: every forward runs on the driver's worker ranks."""
        return cls(None, None, device, driver=driver)

    # ---- what the scheduler calls ------------------------------------------------------------
    @property
    def model(self) -> Any:
        """The model this process holds (a parallel engine: the driver of its ranks)."""
        return self._driver if self._driver is not None else self._model

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def is_parallel(self) -> bool:
        return self._driver is not None

    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor | None:
        """Logits [len(batch.logit_rows), vocab] for the batch's wanted rows; its K/V written."""
        if self._driver is not None:
            return self._driver.forward(batch, pool)
        if self.device.type != "cpu":
            self._bind_thread()
        if self._graphs is not None:
            logits = self._graphs.replay(batch)
            if logits is not None:
                return logits
        if self.device.type != "cpu":
            batch = batch.to(self.device)
        return self._forward_model(batch, pool)

    def _forward_model(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor | None:
        assert self._model is not None
        if self._waits is not None:
            self._waits.step(batch)
        if self._chooser is not None:
            return self._chooser.forward(self._model, batch, pool)
        return self._model.forward(batch, pool)

    def _bind_thread(self) -> None:
        """Make the device current on the calling thread (the scheduler's or the overlap
        model thread: a new thread starts on GPU 0), once per thread."""
        ident = threading.get_ident()
        if ident not in self._bound:
            cuda.bind(self.device)
            self._bound.add(ident)

    @property
    def failed(self) -> str | None:
        """Why the worker ranks stopped (None: running, or a one-process engine)."""
        return self._driver.failed if self._driver is not None else None

    @property
    def restartable(self) -> bool:
        """Whether `restart` can bring failed ranks back."""
        return self._driver is not None and bool(self._driver.restartable)

    def restart(self) -> None:
        if self._driver is None:
            raise RuntimeError("a one-process engine has no ranks to restart")
        self._driver.restart()

    def shutdown(self) -> None:
        """Stop the worker ranks (a one-process engine: the per-step wait choice's thread)."""
        if self._driver is not None:
            self._driver.shutdown()
        if self._waits is not None:
            self._waits.close()

    def choose_waits_per_step(self) -> None:
        """Choose libgomp's wait per step (`threads.WaitChoice`): a dense model on the CPU,
        whose decode steps run on the kernels' own pool and whose prompts on OpenMP."""
        if self._driver is None and self.device.type == "cpu" and self._waits is None:
            self._waits = WaitChoice()

    # ---- what the engine reads ---------------------------------------------------------------
    def set(self, name: str, value: object) -> None:
        """Set a model setting (e.g. MLA's `absorb`): on the model, or on every rank. An
        attribute the model does not have is an AttributeError naming it."""
        if self._driver is not None:
            self._driver.set(name, value)
            return
        if not hasattr(self._model, name):
            raise AttributeError(f"the model has no setting {name!r}")
        setattr(self._model, name, value)

    def weight_bytes(self) -> int:
        """Bytes of weights a forward reads (every rank's, for a parallel engine)."""
        return self.model.weight_bytes()

    @property
    def worker_pids(self) -> list[int]:
        return list(self._driver.worker_pids) if self._driver is not None else []

    def kv_bytes_per_token_per_rank(self, pool_bytes_per_token: int) -> int:
        """The KV bytes one rank stores per token (one process: the pool's own)."""
        if self._driver is None:
            return pool_bytes_per_token
        return self._driver.kv_bytes_per_token_per_rank

    def expert_load(self) -> tuple[list, list] | None:
        """MoE models: routed (token, expert) pairs per MoE layer and expert, in the last
        step and since start (None: no MoE layers here)."""
        load = getattr(self._model, "expert_load", None)
        if load is None or load.numel() == 0:
            return None
        return load.tolist(), self._model.expert_load_total.tolist()  # type: ignore[union-attr]

    @property
    def chooser(self) -> ThreadChooser | None:
        """The thread choice (None: the thread count is fixed)."""
        return self._chooser

    @property
    def graphs(self) -> DecodeGraphs | None:
        """The decode graphs (None: every step runs eagerly)."""
        return self._graphs

    def stats(self) -> RunnerStats:
        chooser, graphs = self._chooser, self._graphs
        return RunnerStats(
            device=str(self.device),
            parallel=self._driver is not None,
            threads=chooser.threads if chooser is not None else torch.get_num_threads(),
            thread_choices=tuple(chooser.choices) if chooser is not None else (),
            thread_switches=chooser.switches if chooser is not None else 0,
            graph_batch_sizes=tuple(graphs.batch_sizes) if graphs is not None else (),
            graph_replays=graphs.replayed if graphs is not None else 0,
            decode_path=getattr(self._model, "decode_path", None),
            omp_wait_switches=self._waits.switches if self._waits is not None else 0,
        )
