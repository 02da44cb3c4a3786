"""Attention with a per-layer window and logit soft-cap over the paged pool, in torch.

Stand-in with the attention backend's call shape (`plan`, `store_kv`, `attend` with a
`LayerSpec`) for the layers whose features the fused CPU paths lack.

Query at position p of a layer with window W attends to positions p - W + 1 .. p (W tokens,
its own included), as transformers' sliding-window mask (`kv_idx > q_idx - W`); scores are
`soft_cap * tanh(scores / soft_cap)` before the softmax when a cap is set. Softmax in float32.
Pages wholly before a query's window are never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.memory.kv_pool import KVPool
from runtime.models.forward_batch import ForwardBatch


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """How one layer attends: softmax `scale`, `window` in tokens (None: all), `soft_cap`."""

    scale: float
    window: int | None = None
    soft_cap: float | None = None


def _gather(pool: torch.Tensor, page_row: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Positions start .. end - 1 of one request [end - start, H, D] through its page row."""
    ps = pool.shape[1]
    first, last = start // ps, -(-end // ps)
    pages = page_row[first:last].long()
    flat = pool.index_select(0, pages).reshape(-1, *pool.shape[2:])
    return flat[start - first * ps : end - first * ps]


def attend_rows(
    q: torch.Tensor,  # [n, Hq, D], positions prefix .. prefix + n - 1
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_row: torch.Tensor,
    prefix: int,
    spec: LayerSpec,
) -> torch.Tensor:
    """One request's queries against its cached keys (causal, windowed); [n, Hq, D]."""
    n, hq, d = q.shape
    total = prefix + n
    lo = 0 if spec.window is None else max(0, prefix - spec.window + 1)
    k = _gather(k_pool, page_row, lo, total).float()  # [L, Hkv, D]
    v = _gather(v_pool, page_row, lo, total).float()
    group = hq // k.shape[1]
    qf = q.float().view(n, k.shape[1], group, d)
    scores = torch.einsum("nhgd,lhd->hgnl", qf, k) * spec.scale
    if spec.soft_cap is not None:
        scores = torch.tanh(scores / spec.soft_cap) * spec.soft_cap
    q_pos = torch.arange(prefix, total)[:, None]
    k_pos = torch.arange(lo, total)[None, :]
    allowed = k_pos <= q_pos
    if spec.window is not None:
        allowed &= k_pos > q_pos - spec.window
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.einsum("hgnl,lhd->nhgd", scores.softmax(-1), v)
    return out.reshape(n, hq, d).to(q.dtype)


class TorchAttention:
    """`plan(batch, pool)` once per step, then per layer `store_kv` and `attend`."""

    def __init__(self) -> None:
        self.batch: ForwardBatch | None = None
        self.pool: KVPool | None = None

    def plan(self, batch: ForwardBatch, pool: KVPool) -> None:
        self.batch, self.pool = batch, pool

    def store_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The step's new k, v [T, Hkv, D] into `layer`'s pages at `batch.out_slots`."""
        k_pool, v_pool = self.pool.k[layer], self.pool.v[layer]
        hkv, d = k_pool.shape[2], k_pool.shape[3]
        k_pool.view(-1, hkv, d).index_copy_(0, self.batch.out_slots, k.to(k_pool.dtype))
        v_pool.view(-1, hkv, d).index_copy_(0, self.batch.out_slots, v.to(v_pool.dtype))

    def attend(self, layer: int, q: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        """q [T, Hq, D] -> [T, Hq, D]: decode rows, then each extend chunk."""
        batch = self.batch
        k_pool, v_pool = self.pool.k[layer], self.pool.v[layer]
        out = torch.empty_like(q)
        nd = batch.num_decode
        for b, length in enumerate(batch.decode_seq_lens.tolist()):
            row = batch.decode_page_table[b]
            out[b : b + 1] = attend_rows(q[b : b + 1], k_pool, v_pool, row, length - 1, spec)
        start = nd
        prefixes = batch.extend_prefix_lens.tolist()
        for e, n in enumerate(batch.extend_lens.tolist()):
            row = batch.extend_page_table[e]
            out[start : start + n] = attend_rows(
                q[start : start + n], k_pool, v_pool, row, prefixes[e], spec
            )
            start += n
        return out
