"""The collectives a sharded forward pass calls, over `torch.distributed` process groups.

One group per pipeline stage joins the stage's ranks: tensor-parallel all-reduces (after the
attention output and MLP down projections, and the vocab-parallel embedding), the LM head's
all-gather, and the expert-parallel sum of each rank's experts all run in it. Stages pass
activations to the next stage's rank of the same position with point-to-point send / recv.
`LOCAL` is the single-process stand-in: every collective is the identity.

On GPUs (`backend` "nccl") the stage groups and the point-to-point group are NCCL groups over
the ranks' `cuda:<local rank>` tensors; on CPUs they are gloo groups, as the default group is.
The driver (rank 0) talks to the ranks over the default group (gloo) either way.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class Comm:
    """Collectives of one rank; `group` None with `size` 1 is a single process."""

    def __init__(self, group=None, size: int = 1, prev_rank: int | None = None,
                 next_rank: int | None = None, p2p_group=None,
                 device: torch.device | str = "cpu") -> None:  # fmt: skip
        """`p2p_group`: the group stage-to-stage sends use (None: the default group);
        `device`: where received activations are put."""
        self.group = group
        self.size = size
        self.prev_rank = prev_rank
        self.next_rank = next_rank
        self.p2p_group = p2p_group
        self.device = torch.device(device)
        self.seconds = 0.0  # time spent in communication, for the benchmark

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the stage's ranks, in place (identity for one rank)."""
        if self.size > 1:
            self._timed(dist.all_reduce, x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """The stage ranks' `x` concatenated along the last dimension, in rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._timed(dist.all_gather, parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def send_next(self, x: torch.Tensor) -> None:
        self._timed(dist.send, x.contiguous(), dst=self.next_rank, group=self.p2p_group)

    def recv_prev(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype, device=self.device)
        self._timed(dist.recv, out, src=self.prev_rank, group=self.p2p_group)
        return out

    def _timed(self, fn, *args, **kwargs) -> None:
        import time

        start = time.perf_counter()
        fn(*args, **kwargs)
        self.seconds += time.perf_counter() - start


LOCAL = Comm()
