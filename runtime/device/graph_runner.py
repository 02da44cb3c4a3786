"""Decode steps through static, padded buffers: the bookkeeping CUDA graphs need, as plain
tensor code that runs (and is tested) on the CPU.

A CUDA graph replays fixed kernels on fixed addresses with fixed shapes. So a decode step of
`n` requests runs as a step of `bucket(n)` rows, the smallest captured batch size >= n, whose
inputs live in one static int64 tensor `state [max_bs, 4 + max_pages]`; per row:

    column 0: the input token      column 2: the KV slot it is written to
    column 1: its position         column 3: the sequence length (the new token counted)
    columns 4 ..: the request's page-table row, as wide as the longest context (`max_pages`)

Rows n .. bucket - 1 are padding: token 0 at position 0, written to slot 0 of page 0 (which
the pool never hands out, so no request reads it), sequence length 1; their logits are
dropped. A page-table row narrower than `max_pages` leaves older page ids in its last
columns: attention reads a row only up to its sequence length, so they are never read.

`DecodeGraphs.replay` writes a decode step's rows into the host copy of `state`, copies it to
the device in one transfer (none on the CPU, where the host copy is `state`), then runs the
bucket's step; every other step (an extend, more requests than the largest bucket, a page
table wider than `max_pages`) gets None and runs eagerly (`runner.ModelRunner` decides).
How a bucket's step is captured and replayed is a `Replayer`: `EagerReplayer` runs the same
step function again on the static buffers (on the CPU: what CI checks, the same tokens as the
unpadded step), and `cuda.CudaGraphReplayer` captures it once into a `torch.cuda.CUDAGraph` at
start-up.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.device import cuda
from runtime.memory.kv_pool import KVPool
from runtime.models.model import Model
from runtime.models.rope import RotaryEmbedding

logger = logging.getLogger(__name__)

TOKEN, POSITION, SLOT, LENGTH, PAGES = 0, 1, 2, 3, 4  # columns of the static state
Step = Callable[[], torch.Tensor]


class Replayer(Protocol):
    def capture(self, step: Step) -> Step:
        """Prepare `step` (a function of the static buffers only) and return what runs it."""
        ...


class EagerReplayer:
    """Runs the step function itself each time: the padded static-buffer path without a
    graph (the CPU's replayer, and the reference the CUDA one is checked against)."""

    def capture(self, step: Step) -> Step:
        return step


def default_batch_sizes(max_running: int) -> list[int]:
    """SGLang's buckets: 1, 2, 4, 8, then every 8 up to `max_running` (which is included)."""
    sizes = [s for s in (1, 2, 4) if s < max_running] + list(range(8, max_running, 8))
    return sorted(set(sizes) | {max_running})


def graph_blocker(model: Model) -> str | None:
    """Why this model's decode step cannot be captured, or None. Capture needs every op of a
    step on the device with shapes fixed by the batch size: the Triton backend's kernels do;
    mixture-of-experts routing groups tokens by expert on the host (a per-step sync)."""
    backend = getattr(getattr(model, "attention", None), "name", "")
    if backend != "triton":
        return f"attention backend {backend!r} (CUDA graphs need 'triton')"
    load = getattr(model, "expert_load", None)
    if load is not None and load.numel():
        return "mixture-of-experts layers (experts grouped on the host each step)"
    return None


def reserve_rotary(model: Model, positions: int) -> None:
    """Grow every rotary table of the model to `positions` and stop its per-step host check."""
    for value in vars(model).values():
        found = value.values() if isinstance(value, dict) else [value]
        for rotary in found:
            if isinstance(rotary, RotaryEmbedding):
                rotary.reserve(positions)


class DecodeGraphs:
    """Decode steps of up to `max(batch_sizes)` rows run through the captured buckets:
    `replay(batch)` gives a step's logits, or None for a step a bucket does not hold (the
    caller runs it eagerly). `forward` is the step a bucket captures (the runner's call of the
    model: the thread choice included); a replay's device is current on the calling thread
    (the runner binds it).

    Invariant: the logits of a replayed step are a view of the step's static output, valid
    until the next forward (the scheduler samples them before it runs another step)."""

    def __init__(
        self,
        forward: Callable[[ForwardBatch, KVPool], torch.Tensor | None],
        model: Model,
        pool: KVPool,
        device: torch.device,
        batch_sizes: Sequence[int],
        replayer: Replayer,
    ) -> None:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"batch sizes must be positive integers, got {list(batch_sizes)}")
        self.device = device
        self.batch_sizes = sorted(set(int(b) for b in batch_sizes))
        # the widest page table a request can have: its whole context, at most the whole pool
        max_positions = model.config.max_position_embeddings
        self.max_pages = min(-(-max_positions // pool.page_size), pool.num_pages)
        max_bs = self.batch_sizes[-1]
        self.state = torch.zeros(max_bs, PAGES + self.max_pages, dtype=torch.long, device=device)
        self._host = self.state if device.type == "cpu" else cuda.pinned(self.state.cpu())
        self._pad = torch.zeros(PAGES + self.max_pages, dtype=torch.long)
        self._pad[LENGTH] = 1  # a padding row attends to its own token in page 0, slot 0
        self.replayed = 0  # decode steps that ran through a bucket (for stats and tests)
        reserve_rotary(model, max_positions)
        self.replays: dict[int, Step] = {}
        self.state[:, LENGTH] = 1
        for bs in reversed(self.batch_sizes):  # largest first: the others reuse its memory
            self.replays[bs] = replayer.capture(self._step_function(bs, forward, pool))

    def _step_function(
        self, bs: int, forward: Callable[[ForwardBatch, KVPool], torch.Tensor | None],
        pool: KVPool,
    ) -> Step:  # fmt: skip
        """The decode step of the first `bs` rows of the static state, as a function of those
        buffers alone (what a graph captures)."""
        device, width = self.device, self.max_pages
        no_pages = torch.zeros(0, width, dtype=torch.int32, device=device)
        no_lens = torch.zeros(0, dtype=torch.int32, device=device)
        rows = torch.arange(bs, device=device)
        state = self.state

        def step() -> torch.Tensor:
            cols = state[:bs, :PAGES].t().contiguous()  # [4, bs]: each column contiguous
            batch = ForwardBatch(
                input_ids=cols[TOKEN], positions=cols[POSITION], out_slots=cols[SLOT],
                num_decode=bs, decode_page_table=state[:bs, PAGES:].to(torch.int32),
                decode_seq_lens=cols[LENGTH].to(torch.int32), extend_page_table=no_pages,
                extend_prefix_lens=no_lens, extend_lens=no_lens, logit_rows=rows,
            )  # fmt: skip
            return forward(batch, pool)  # type: ignore[return-value]

        return step

    def bucket(self, n: int) -> int | None:
        """The smallest captured batch size holding `n` rows (None: more than the largest)."""
        i = bisect.bisect_left(self.batch_sizes, n)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else None

    def load(self, batch: ForwardBatch, bs: int) -> None:
        """Write a decode batch's rows, then padding up to `bs` rows, into the static state."""
        n, host = batch.num_decode, self._host
        width = batch.decode_page_table.shape[1]
        host[:n, TOKEN] = batch.input_ids
        host[:n, POSITION] = batch.positions
        host[:n, SLOT] = batch.out_slots
        host[:n, LENGTH] = batch.decode_seq_lens
        host[:n, PAGES : PAGES + width] = batch.decode_page_table
        host[n:bs] = self._pad
        if host is not self.state:
            self.state[:bs].copy_(host[:bs], non_blocking=True)

    def replay(self, batch: ForwardBatch) -> torch.Tensor | None:
        """The step's logits from its bucket, or None: not a decode step a bucket holds (an
        extend, more rows than the largest bucket, a page table wider than `max_pages`)."""
        n = batch.num_decode
        bs = self.bucket(n) if n and n == batch.num_tokens else None
        if bs is None or batch.decode_page_table.shape[1] > self.max_pages:
            return None
        self.load(batch, bs)
        self.replayed += 1
        logits = self.replays[bs]()
        return logits if bs == n else logits[:n]


def decode_graphs(
    forward: Callable[[ForwardBatch, KVPool], torch.Tensor | None],
    model: Model,
    pool: KVPool,
    device: torch.device,
    *,
    disable_cuda_graph: bool,
    batch_sizes: Sequence[int] | None,
    max_running: int,
) -> DecodeGraphs | None:
    """A one-process engine's decode graphs, or None (every step eager). On the CPU: none
    unless `batch_sizes` is given (then decode steps run through the padded static buffers,
    eagerly: the graph bookkeeping checked without a GPU). On a GPU: decode steps replayed from
    CUDA graphs, one per batch size, unless graphs are disabled or the model's step cannot be
    captured (the log says why). The device must be current on the calling thread."""
    if device.type == "cpu":
        if batch_sizes is None or disable_cuda_graph:
            return None
        return DecodeGraphs(forward, model, pool, device, batch_sizes, EagerReplayer())
    reason = "disabled" if disable_cuda_graph else graph_blocker(model)
    if reason is None:
        sizes = batch_sizes or default_batch_sizes(max_running)
        try:
            replayer = cuda.CudaGraphReplayer(device)
            return DecodeGraphs(forward, model, pool, device, sizes, replayer)
        except Exception as exc:  # an op of the step that a graph cannot hold (a host sync)
            reason = f"capture failed: {type(exc).__name__}: {exc}"
    logger.info("CUDA graphs off (%s): decode steps run eagerly", reason)
    return None
