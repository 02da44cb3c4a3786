"""The engine's side of a parallel model: starts the worker ranks, sends each step's batch to
all of them, and receives the logits from the last stage.

The engine's process is rank 0 of a `torch.distributed` group (gloo) whose other ranks are
`python -m runtime.workers.worker` processes on loopback, one per rank, each with its share of
the CPU threads. The scheduler, the radix cache and the page allocator stay here; a step's plan
(token ids, positions, out slots, page tables) is broadcast, so every rank writes the same
pages of its own pool. If any rank dies, the others are stopped and every step from then on
raises `WorkerError`; the scheduler then calls `restart()`, which starts fresh ranks (on one
machine; their KV pools empty) and requeues the requests that were running (see the
scheduler's `_recover_ranks`). `shutdown()` stops them all.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from runtime.attention.forward_batch import ForwardBatch
from runtime.attention.kv_calibration import KVCalibration
from runtime.config import ModelConfig
from runtime.errors import ParallelConfigError, WorkerError
from runtime.parallel.shard import validate
from runtime.workers.layout import Layout
from runtime.workers.microbatch import split
from runtime.workers.worker import PEER_LOST, spawn

logger = logging.getLogger(__name__)
START_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ParallelModel:
    """Stands in for a model in the scheduler: `forward(batch, pool) -> logits`."""

    def __init__(self, path: Path, config: ModelConfig, dtype: torch.dtype, *, tp_size: int,
                 pp_size: int, ep_size: int, num_pages: int, page_size: int, nnodes: int = 1,
                 dist_init_addr: str | None = None,
                 attention_backend: str = "cpu",
                 kv_dtype: torch.dtype | None = None, device: str = "cpu",
                 kv_calibration: KVCalibration | None = None) -> None:  # fmt: skip
        """`device`: "cpu" (gloo everywhere) or "cuda" (each rank on `cuda:<local rank>`,
        its stage's collectives over NCCL; this process talks to the ranks over gloo)."""
        validate(config, tp_size, pp_size, ep_size)
        if dist.is_initialized():
            raise WorkerError("a parallel engine is already running in this process")
        self.config = config
        self.layout = Layout(tp_size, pp_size, ep_size, config.num_layers, nnodes)
        self.failed: str | None = None
        self._lock = threading.Lock()
        if (self.layout.world - 1) % nnodes:
            raise ParallelConfigError(
                f"{self.layout.world - 1} worker ranks do not split over nnodes {nnodes}"
            )
        if nnodes > 1 and not dist_init_addr:
            raise ParallelConfigError("nnodes > 1 needs dist_init_addr (host:port of node 0)")
        self.setup = {"dtype": str(dtype).replace("torch.", ""), "pages": (num_pages, page_size),
                      "attention": attention_backend,
                      "kv_dtype": str(kv_dtype or dtype).replace("torch.", ""),
                      # the fp8 pool's measured scales and offsets, every layer and head (each
                      # rank keeps its own: KVCalibration.select)
                      "kv_calibration": kv_calibration}  # fmt: skip
        self.device = device
        self.path = str(path)
        self.dist_init_addr = dist_init_addr
        self.restarts = 0
        self.procs: list[subprocess.Popen] = []
        atexit.register(self._kill)
        self._start_ranks()

    def _start_ranks(self) -> None:
        addr = f"tcp://{self.dist_init_addr or f'127.0.0.1:{_free_port()}'}"
        spawned = spawn(self.layout, self.layout.node_ranks(0), addr, self.path, self.device)
        self.procs = [proc for proc, _ in spawned]
        self.logs = [log for _, log in spawned]
        try:
            self._join(addr)
        except BaseException:
            self._kill()
            raise
        self._monitor = threading.Thread(
            target=self._watch, args=(self.procs,), name="sgl-workers", daemon=True
        )
        self._monitor.start()

    @property
    def restartable(self) -> bool:
        """Whether `restart` can bring the ranks back: every rank on this machine, on CPU (a
        restart of GPU ranks is not tried yet)."""
        return self.layout.nnodes == 1 and str(self.device) == "cpu"

    def restart(self) -> None:
        """After a rank failed: stop every rank, leave the process group and start fresh ranks
        (their KV pools empty: the caller drops what it cached). Raises WorkerError when the
        new ranks do not start."""
        with self._lock:
            if not self.restartable:
                raise WorkerError(f"parallel engine: {self.failed} (ranks on other machines)")
            self.failed = self.failed or "restarting"
            self._kill()
            for log in self.logs:  # the dead ranks' stderr (read by `_dead_worker` already)
                log.close()
            if dist.is_initialized():
                dist.destroy_process_group()
            self._start_ranks()
            self.failed = None
            self.restarts += 1
            logger.warning("parallel engine: ranks restarted (%d so far)", self.restarts)

    # ---- start-up ----------------------------------------------------------------------------
    def _join(self, addr: str) -> None:
        """rank 0's init (in a thread, so that a worker dying at start-up is seen at once)."""
        outcome: list[BaseException | None] = []

        def init() -> None:
            try:
                dist.init_process_group("gloo", init_method=addr, rank=0,
                                        world_size=self.layout.world,
                                        timeout=timedelta(seconds=START_TIMEOUT_S))  # fmt: skip
                self.layout.make_comm(0, self.device)
                dist.broadcast_object_list([self.setup], src=0)
                reports: list = [None] * self.layout.world
                dist.gather_object(None, reports, dst=0)
                self.reports = reports[1:]
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=init, daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while thread.is_alive():
            dead = self._dead_worker()
            if dead:
                raise WorkerError(f"a worker failed to start: {dead}")
            if time.monotonic() > deadline:
                raise WorkerError(f"workers did not start within {START_TIMEOUT_S} s")
            thread.join(0.2)
        if outcome and outcome[0] is not None:
            raise WorkerError(f"joining the workers failed: {outcome[0]!r}") from outcome[0]

    def _dead_worker(self, wait: float = 0.0) -> str | None:
        """Which rank has exited and how (waiting up to `wait` s for one to be seen). A rank
        that exited because a peer's connection closed (`PEER_LOST`) is named only when no
        other rank has exited: the one that died first is the cause."""
        deadline = time.monotonic() + wait
        while True:
            codes = [proc.poll() for proc in self.procs]
            causes = [c for c in codes if c is not None and c != PEER_LOST]
            if causes or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        exited = [(rank, code) for rank, code in enumerate(codes, 1) if code is not None]
        if not exited:
            return None
        rank, code = min(exited, key=lambda rc: rc[1] == PEER_LOST)  # a cause, else the first
        proc, log = self.procs[rank - 1], self.logs[rank - 1]
        try:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:].strip()
        except (OSError, ValueError):  # closed by a restart meanwhile
            tail = ""
        return f"rank {rank} (pid {proc.pid}) exited with {code}: {tail}"

    def _watch(self, procs: list[subprocess.Popen]) -> None:
        """Any rank dying stops the others: a step in flight then fails instead of waiting.
        (`procs`: the ranks it watches; a restart starts a new watcher for the new ones.)"""
        while self.failed is None and self.procs is procs:
            # a PEER_LOST rank seen alone: the rank that caused it gets a moment to be seen too
            exited = any(proc.poll() is not None for proc in procs)
            dead = self._dead_worker(wait=1.0) if exited else None
            if dead and self.failed is None and self.procs is procs:
                self.failed = dead
                logger.error("parallel engine: %s; stopping the other ranks", dead)
                self._kill()
                return
            time.sleep(0.2)

    # ---- what the scheduler calls ------------------------------------------------------------
    @property
    def worker_pids(self) -> list[int]:
        """Every rank's process id (those on other machines too)."""
        return [r["pid"] for r in self.reports]

    def weight_bytes(self) -> int:
        return sum(r["weight_bytes"] for r in self.reports)

    @property
    def kv_bytes_per_token_per_rank(self) -> int:
        return max(r["kv_bytes_per_token"] for r in self.reports)

    def forward(self, batch: ForwardBatch, pool: object) -> torch.Tensor:
        with self._lock:
            self._check()
            # pipeline stages overlap on micro-batches (one per stage)
            parts = split(batch, self.layout.pp_size) if self.layout.pp_size > 1 else [batch]
            try:
                dist.broadcast_object_list([("forward", parts)], src=0)
                outs = []
                for part in parts:
                    logits = torch.empty(len(part.logit_rows), self.config.vocab_size)
                    dist.recv(logits, src=self.layout.logits_rank)
                    outs.append(logits)
                logits = outs[0] if len(outs) == 1 else torch.cat(outs)
            except Exception as exc:
                self.failed = (
                    self.failed or self._dead_worker(wait=2.0) or f"a step failed: {exc!r}"
                )
                self._kill()
                raise WorkerError(f"parallel engine: {self.failed}") from exc
            return logits

    def set(self, name: str, value: object) -> None:
        """Set a model attribute on every rank (e.g. MLA's `absorb`)."""
        with self._lock:
            self._check()
            dist.broadcast_object_list([("set", name, value)], src=0)

    def comm_seconds(self) -> list[float]:
        """Seconds each rank has spent in collectives and sends so far."""
        with self._lock:
            self._check()
            dist.broadcast_object_list([("comm_seconds",)], src=0)
            out: list = [None] * self.layout.world
            dist.gather_object(0.0, out, dst=0)
            return out[1:]

    def _check(self) -> None:
        if self.failed:
            raise WorkerError(f"parallel engine: {self.failed}")

    def shutdown(self) -> None:
        with self._lock:
            if self.failed is None:
                self.failed = "shut down"
                try:
                    dist.broadcast_object_list([("stop",)], src=0)
                    for proc in self.procs:
                        proc.wait(timeout=30)
                except Exception:  # a rank already gone: stop the rest below
                    pass
            self._kill()
            if dist.is_initialized():
                dist.destroy_process_group()

    def _kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
