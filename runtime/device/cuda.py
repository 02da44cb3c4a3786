"""The lines of the engine that only a GPU runs, kept here so that they are few and in one
place (docs/engine.md, "The GPU path", lists them with how to check them on a GPU):
which GPU is current, binding a thread to one, pinned host memory, and capturing / replaying a
decode step as a `torch.cuda.CUDAGraph` (`CudaGraphReplayer`, the GPU's `Replayer` for
`graph_runner.DecodeGraphs`). Every function here is a no-op or unreachable on the CPU:
nothing in it is called unless the engine's device is a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)


def current() -> torch.device:
    """The current GPU (`cuda:N`)."""
    return torch.device("cuda", torch.cuda.current_device())


def bind(device: torch.device) -> None:
    """Make `device` the calling thread's current GPU (Triton launches on the current one)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def pinned(t: torch.Tensor) -> torch.Tensor:
    """`t` in page-locked host memory, so a copy to the GPU does not wait for the host."""
    return t.pin_memory()


class CudaGraphReplayer:
    """Captures a step function into a CUDA graph and returns the function that replays it.

    All graphs of one runner share one memory pool (captured largest batch first, so the
    smaller ones fit in what the largest left); only one graph runs at a time, so their
    outputs may share memory: a replay's output is valid until the next replay."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._mempool = None
        self._stream = torch.cuda.Stream(device)

    def capture(self, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        # warm-up outside the graph: Triton compiles its kernels, cuBLAS picks its algorithms,
        # the caching allocator settles (none of which may happen during a capture)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            step()
            step()
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool, stream=self._stream):
            out = step()
        if self._mempool is None:
            self._mempool = graph.pool()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay
