"""Who is who in a parallel engine's process group.

Rank 0 is the driver (the engine's own process: scheduler, radix cache, sampling); ranks
1 .. W are the workers, W = pp_size x group with group = max(tp_size, ep_size). Worker
`1 + stage * group + g` holds position g of pipeline stage `stage`. Every process creates the
same stage groups in the same order (torch.distributed requires it). Over `nnodes` machines
the workers are dealt out in contiguous blocks: node 0 (with the driver) takes the first
W / nnodes, node 1 the next, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from runtime.parallel.comm import Comm
from runtime.parallel.shard import Shard, stage_layers


@dataclass(slots=True, frozen=True)
class Layout:
    tp_size: int
    pp_size: int
    ep_size: int
    num_layers: int
    nnodes: int = 1

    @property
    def group(self) -> int:
        return max(self.tp_size, self.ep_size)

    @property
    def world(self) -> int:
        return 1 + self.pp_size * self.group

    def stage_ranks(self, stage: int) -> list[int]:
        return [1 + stage * self.group + g for g in range(self.group)]

    def node_ranks(self, node: int) -> range:
        """The worker ranks machine `node` runs."""
        per = (self.world - 1) // self.nnodes
        return range(1 + node * per, 1 + (node + 1) * per)

    @property
    def logits_rank(self) -> int:
        """The worker that sends the logits back: position 0 of the last stage."""
        return self.stage_ranks(self.pp_size - 1)[0]

    def shard(self, rank: int) -> Shard:
        stage, g = divmod(rank - 1, self.group)
        start, end = stage_layers(self.num_layers, self.pp_size)[stage]
        return Shard(
            tp_rank=g if self.tp_size > 1 else 0, tp_size=self.tp_size,
            pp_rank=stage, pp_size=self.pp_size,
            ep_rank=g if self.ep_size > 1 else 0, ep_size=self.ep_size,
            layer_start=start, layer_end=end,
        )  # fmt: skip

    def local_rank(self, rank: int) -> int:
        """A worker's index among its machine's workers (its GPU there: `cuda:<local rank>`)."""
        return (rank - 1) % ((self.world - 1) // self.nnodes)

    def make_comm(self, rank: int, device: str = "cpu") -> Comm | None:
        """Create every stage group (all ranks must, in the same order); this rank's Comm
        (None for the driver). `device` "cuda": the stage groups and a group of every worker
        for the stage-to-stage sends are NCCL groups on `cuda:<local rank>` (the driver holds
        no GPU: it is in none of them); "cpu": gloo, the stage sends on the default group."""
        gpu = device == "cuda"
        backend = "nccl" if gpu else None  # None: the default group's (gloo)
        groups = [dist.new_group(self.stage_ranks(s), backend=backend)
                  for s in range(self.pp_size)]  # fmt: skip
        p2p = dist.new_group(list(range(1, self.world)), backend=backend) if gpu else None
        if rank == 0:
            return None
        stage, g = divmod(rank - 1, self.group)
        prev_rank = self.stage_ranks(stage - 1)[g] if stage > 0 else None
        next_rank = self.stage_ranks(stage + 1)[g] if stage < self.pp_size - 1 else None
        where = f"cuda:{self.local_rank(rank)}" if gpu else "cpu"
        return Comm(groups[stage], self.group, prev_rank, next_rank, p2p, where)
