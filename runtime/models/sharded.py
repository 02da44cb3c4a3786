"""Tensor-parallel layers: what one rank holds of each matrix and how its output is completed.

A model builds its matrices through these and calls their `reduce` / `embed` / `gather`; none of
them branches on the parallel size in model code. One process is the degenerate case: every span
is the whole dimension and `reduce` returns its input.

- `ColumnParallel`: a fused projection's output rows (q | k | v heads, gate | up columns), each
  part cut to this rank's span; the output stays split (it feeds this rank's attention heads or
  MLP columns).
- `RowParallel`: a projection whose input is split (o after the heads, down after the MLP
  columns): this rank's input columns; its output is a partial sum, completed by `reduce` (an
  all-reduce over the stage's tensor ranks). Its bias is added once, after the sum.
- `VocabParallel`: the embedding's and LM head's vocabulary rows: `embed` looks up this rank's
  rows and sums the ranks' lookups; `gather` joins the ranks' logits (padded to equal widths).
- Routed experts (`TensorParallel.experts`): split over the expert parallel ranks, or over the
  tensor parallel ones; each rank runs its experts for every token and `experts_reduce` sums the
  stage's ranks.

Which heads, columns and rows a rank holds is runtime/parallel/shard.py's (`heads_of`,
`vocab_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.config import ModelConfig
from runtime.models.layers import embedding
from runtime.parallel.comm import Comm
from runtime.parallel.shard import Shard, heads_of, vocab_rows


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass(frozen=True, slots=True)
class Span:
    """[start, start + size) of one dimension of a full matrix."""

    start: int
    size: int

    def rows(self, t):
        return t[self.start : self.start + self.size]


class ColumnParallel:
    """A projection whose output rows are the concatenation of `parts` (each a `Span` of its
    full matrix's rows): `weight` cuts and joins them, `bias` likewise (a missing part's bias:
    zeros)."""

    def __init__(self, parts: Sequence[Span]) -> None:
        self.parts = tuple(parts)

    def weight(self, full: Sequence) -> object:
        """This rank's rows of each full matrix in `full`, joined by rows (a quantized matrix
        stays in its block format)."""
        return torch.cat([s.rows(w) for s, w in zip(self.parts, full, strict=True)]).contiguous()

    def bias(self, full: Sequence[torch.Tensor | None], dtype: torch.dtype):
        """The joined bias, or None when no part has one."""
        if all(b is None for b in full):
            return None
        return torch.cat([
            s.rows(b) if b is not None else torch.zeros(s.size, dtype=dtype)
            for s, b in zip(self.parts, full, strict=True)
        ])  # fmt: skip


class RowParallel:
    """A projection [out, in] whose input is split by `span` over the tensor ranks: `weight`
    keeps this rank's input columns, `reduce` sums the ranks' partial outputs."""

    def __init__(self, span: Span, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.span, self.reduce = span, reduce

    def weight(self, full):
        s = self.span
        return full[:, s.start : s.start + s.size].contiguous()


class VocabParallel:
    """The vocabulary rows of this rank (the embedding and an untied LM head)."""

    def __init__(self, vocab: int, shard: Shard, comm: Comm) -> None:
        self.start, self.size, self.per_rank = vocab_rows(vocab, shard)
        self.vocab, self.comm, self.split = vocab, comm, shard.tp_size > 1

    def rows(self, table):
        return table[self.start : self.start + self.size].contiguous()

    def embed(self, ids: torch.Tensor, table, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of the full table: each rank looks up the ids it holds (zeros for the
        others) and the ranks' lookups are summed."""
        if not self.split:
            return embedding(ids, table, dtype)
        local = ids - self.start
        mine = (local >= 0) & (local < self.size)
        hidden = embedding(local.clamp(0, self.size - 1), table, dtype)
        return self.comm.all_reduce(hidden * mine[:, None].to(hidden.dtype))

    def gather(self, logits: torch.Tensor) -> torch.Tensor:
        """The full vocabulary's logits from each rank's [T, rows] (padded to `per_rank`)."""
        if not self.split:
            return logits
        pad = self.per_rank - self.size
        if pad:
            logits = F.pad(logits, (0, pad), value=float("-inf"))
        return self.comm.all_gather_last(logits)[:, : self.vocab]


class TensorParallel:
    """A decoder's tensor-parallel layers for one rank: q / k / v and gate / up as column
    parallel projections, o and down as row parallel ones, the vocabulary split by rows, the
    routed experts split over the stage's ranks. `num_heads` / `num_kv_heads`: this rank's query
    and KV heads. MLA (DeepSeek): q_proj (or q_b_proj) and kv_b_proj by the rank's `heads`, o by
    their values; the latent projection and the latent cache replicated on every rank."""

    def __init__(self, config: ModelConfig, shard: Shard, comm: Comm) -> None:
        d, n = config.head_dim, shard.tp_size
        if n > 1:
            q0, hq, kv0, hkv = heads_of(config, shard)
        else:
            q0, hq, kv0, hkv = 0, config.num_heads, 0, config.num_kv_heads
        self.num_heads, self.num_kv_heads = hq, hkv
        self.heads = range(q0, q0 + hq)  # this rank's query heads (MLA's: mla.load_mla)
        inter = config.intermediate_size // n
        q, kv = Span(q0 * d, hq * d), Span(kv0 * d, hkv * d)
        mlp = Span(shard.tp_rank * inter, inter)
        reduce = comm.all_reduce if n > 1 else _same
        self.qkv = ColumnParallel((q, kv, kv))
        # o's input: the heads' values (MLA's: v_head_dim each, the latent replicated)
        dv = config.mla.v_head_dim if config.mla is not None else d
        self.o = RowParallel(Span(q0 * dv, hq * dv), reduce)
        self.gate_up = ColumnParallel((mlp, mlp))
        self.down = RowParallel(mlp, reduce)
        self.vocab = VocabParallel(config.vocab_size, shard, comm)
        experts = config.moe.n_routed_experts if config.moe else 0
        size = max(shard.ep_size, n)
        rank = shard.ep_rank if shard.ep_size > 1 else shard.tp_rank
        per = experts // size
        self.experts = range(rank * per, (rank + 1) * per)
        self.experts_reduce = comm.all_reduce
