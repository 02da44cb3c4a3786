"""Paged decode attention on CPU with the per-step work done once for all layers.

`reference.paged_decode_attention` recomputes, in every layer, what depends only on the batch:
the page indices to gather, the longest sequence (a host read), the key mask and whether it is
needed (another host read). A decode step of a 30-layer model paid that 30 times. Here
`plan_decode` computes it once per step and `planned_decode_attention` runs one layer: the
same gathers and the same SDPA call as the reference (`reference._attend`), so the numbers are
identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.kernels.reference import _check_heads


@dataclass(slots=True)
class DecodePlan:
    pages: torch.Tensor  # [B * pages_needed] int64 page ids, clamped into the pool
    batch: int
    max_len: int
    mask: torch.Tensor | None  # [B, 1, 1, max_len] bool (key j within b's length); None: all
    empty: torch.Tensor | None  # [B] bool: rows with no key at all (they get zeros); None: none


def plan_decode(
    page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int, num_pages: int
) -> DecodePlan:
    """What every layer's decode attention reads, for page_table [B, P] and seq_lens [B]."""
    lens = seq_lens.to(dtype=torch.long)
    batch = int(lens.shape[0])
    max_len = max(int(lens.max()), 1) if batch else 1
    needed = -(-max_len // page_size)
    pages = page_table[:, :needed].long().clamp(0, num_pages - 1).reshape(-1)
    allowed = torch.arange(max_len)[None, :] < lens[:, None]
    mask = None if bool(allowed.all()) else allowed[:, None, None, :]
    empty = ~allowed.any(dim=-1)
    return DecodePlan(pages, batch, max_len, mask, empty if bool(empty.any()) else None)


def planned_decode_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, plan: DecodePlan, scale: float
) -> torch.Tensor:
    """q [B, Hq, D] against the pages `plan` names; as reference.paged_decode_attention."""
    _check_heads(q.shape[1], k_pool.shape[2])
    if plan.batch == 0:
        return torch.empty_like(q)
    b, length = plan.batch, plan.max_len
    k = k_pool.index_select(0, plan.pages).view(b, -1, *k_pool.shape[2:])[:, :length]
    v = v_pool.index_select(0, plan.pages).view(b, -1, *v_pool.shape[2:])[:, :length]
    out = F.scaled_dot_product_attention(
        q.float()[:, :, None],  # [B, Hq, 1, D]
        k.float().transpose(1, 2),  # [B, Hkv, L, D]; query head h reads kv head h // group
        v.float().transpose(1, 2),
        attn_mask=plan.mask,
        scale=scale,
        enable_gqa=True,
    )[:, :, 0]
    if plan.empty is not None:
        out.masked_fill_(plan.empty[:, None, None], 0.0)
    return out.to(q.dtype)
