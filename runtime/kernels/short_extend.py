"""Extend attention for many short chunks at once (jump-forward extends, short prompts).

The paged extend kernel's CPU reference loops over requests; with 32 requests each extending
a few jumped tokens that is 32 small attention calls per layer per step. Here the chunks are
padded into one [N, M] query block and attend to their gathered K/V in a single SDPA call with
a causal-over-prefix mask. The gather indices and mask are built once per forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

MAX_CHUNK = 32  # longest extend chunk this path takes
MAX_KEYS = 1 << 17  # N x L bound: beyond it the per-request kernel uses less memory


@dataclass(slots=True)
class ShortExtendPlan:
    slots: torch.Tensor  # [N, L] flat pool slots (0 where padded)
    mask: torch.Tensor  # [N, 1, M, L] bool: query j of request b may see key l
    batch_idx: torch.Tensor  # [T] request of each flattened query
    chunk_idx: torch.Tensor  # [T] position of each query within its chunk


def plan_short_extend(
    page_table: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor, page_size: int
) -> ShortExtendPlan | None:
    """A plan when every chunk is short and the padded block is small; else None."""
    n = extend_lens.shape[0]
    if n < 2:
        return None
    ext = extend_lens.long()
    m = int(ext.max())
    totals = prefix_lens.long() + ext
    length = int(totals.max())
    if m > MAX_CHUNK or n * length > MAX_KEYS:
        return None
    pages = page_table[:, : -(-length // page_size)].long()
    slots = (pages[:, :, None] * page_size + torch.arange(page_size)).reshape(n, -1)[:, :length]
    keys = torch.arange(length)
    slots = torch.where(keys[None, :] < totals[:, None], slots, torch.zeros_like(slots))
    q_pos = prefix_lens.long()[:, None] + torch.arange(m)[None, :]  # [N, M]
    mask = keys[None, None, :] <= q_pos[:, :, None]  # causal over prefix + chunk
    batch_idx = torch.repeat_interleave(torch.arange(n), ext)
    starts = torch.cumsum(ext, 0) - ext
    chunk_idx = torch.arange(int(ext.sum())) - torch.repeat_interleave(starts, ext)
    return ShortExtendPlan(slots, mask[:, None], batch_idx, chunk_idx)


def short_extend_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, scale: float,
    plan: ShortExtendPlan,
) -> torch.Tensor:  # fmt: skip
    """q [T, Hq, D] (chunks concatenated) -> [T, Hq, D], as `paged_extend_attention`."""
    n, _, m, _ = plan.mask.shape
    hq, d = q.shape[1], q.shape[2]
    flat = plan.slots.reshape(-1)  # index_select: much faster than advanced indexing on CPU
    k = k_pool.view(-1, *k_pool.shape[2:]).index_select(0, flat)
    k = k.view(*plan.slots.shape, *k_pool.shape[2:])  # [N, L, Hkv, D]
    v = v_pool.view(-1, *v_pool.shape[2:]).index_select(0, flat)
    v = v.view(*plan.slots.shape, *v_pool.shape[2:])
    qpad = q.new_zeros(n, m, hq, d)
    qpad[plan.batch_idx, plan.chunk_idx] = q
    out = F.scaled_dot_product_attention(
        qpad.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
        attn_mask=plan.mask, scale=scale, enable_gqa=True,
    )  # fmt: skip
    return out.transpose(1, 2)[plan.batch_idx, plan.chunk_idx].to(q.dtype)
