"""Extend attention split at the cached prefix: the prefix read once per group of requests.

A chunk of new tokens attends to its request's cached prefix (every key visible) and to its
own tokens (causal). The reference kernel masks one SDPA call per request over the whole
sequence; short chunks (`short_extend`) share one call but gather each request's whole
prefix. Here the two key sets are attended separately and merged exactly by their
log-sum-exps, like cascade decode:

- requests whose page tables start with the same full prefix pages form a group; all their
  queries attend to the shared pages in one unmasked flash-attention call (64 questions
  behind one few-shot prefix read its K/V once per layer, not 64 times);
- each member's tail (its prefix past the shared pages, then its own chunk) is attended in
  one padded call per group, with a causal mask over the chunk.

A request alone is a group of one: an unmasked call over its whole prefix and a causal one
over its chunk (no mask built) are faster than one masked call over both. CPU only (the
Triton kernels read pages in place on a GPU). `SGL_PREFIX_EXTEND=0` turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime import settings
from runtime.kernels.cascade import attend_all

MIN_SHARED_PAGES = 2  # a group's shared part below this many pages: its members go alone
MAX_TAIL_CELLS = 1 << 20  # members x longest chunk x longest tail per group: beyond, alone
# torch's CPU flash attention, which also returns the log-sum-exp of each query's scores
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def enabled() -> bool:
    """Whether the models plan their CPU extend attention here (`SGL_PREFIX_EXTEND=0`: no)."""
    return settings.PREFIX_EXTEND.get()


@dataclass(slots=True)
class PrefixGroup:
    q_rows: torch.Tensor  # [Tg] rows of the extend queries, members in batch order
    shared_slots: torch.Tensor | None  # [Ls] flat pool slots of the shared prefix (None: 0)
    tail_slots: torch.Tensor  # [G, Lt] flat pool slots of each member's tail (0 where padded)
    mask: torch.Tensor | None  # [G, 1, g*M, Lt] additive (0 / -inf); None: one causal chunk
    pad_rows: torch.Tensor  # [Tg] each query's row in the padded [G * M] layout
    chunk: int  # M, the longest chunk


@dataclass(slots=True)
class PrefixExtendPlan:
    groups: list[PrefixGroup]
    num_tokens: int


def plan_prefix_extend(
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    page_size: int,
    group_size: int,
    *,
    shared_only: bool = False,
) -> PrefixExtendPlan | None:
    """The groups of one extend batch (computed once per forward pass, used by every layer).
    `group_size`: query heads per KV head. With `shared_only`, None unless some group of
    two or more requests shares at least MIN_SHARED_PAGES pages (the caller has a cheaper
    path for the rest)."""
    prefixes = prefix_lens.tolist()
    extends = extend_lens.tolist()
    starts = [0]
    for e in extends:
        starts.append(starts[-1] + e)
    # requests by their first prefix page (a prefix under one page shares nothing)
    by_first: dict[int, list[int]] = {}
    alone: list[int] = []
    firsts = page_table[:, 0].tolist()
    for r, (p, e) in enumerate(zip(prefixes, extends, strict=True)):
        if e == 0:
            continue
        if p >= page_size:
            by_first.setdefault(firsts[r], []).append(r)
        else:
            alone.append(r)
    members: list[tuple[list[int], int]] = []  # (requests, shared pages; -1: alone)
    for rows in by_first.values():
        if len(rows) > 1:
            full = min(prefixes[r] for r in rows) // page_size
            pt = page_table[rows, :full]
            same = (pt == pt[:1]).all(dim=0)
            shared = int(same.long().cumprod(0).sum())
            m = max(extends[r] for r in rows)
            tail = max(prefixes[r] + extends[r] for r in rows) - shared * page_size
            if shared >= MIN_SHARED_PAGES and len(rows) * m * tail <= MAX_TAIL_CELLS:
                members.append((rows, shared))
                continue
        members.extend(([r], -1) for r in rows)
    if shared_only and not any(len(rows) > 1 for rows, _ in members):
        return None
    members.extend(([r], -1) for r in alone)
    members.sort(key=lambda rs: rs[0][0])
    groups = [
        _group(rows, shared, page_table, prefixes, extends, starts, page_size, group_size)
        for rows, shared in members
    ]
    return PrefixExtendPlan(groups, starts[-1])


def _group(
    rows: list[int],
    shared: int,
    page_table: torch.Tensor,
    prefixes: list[int],
    extends: list[int],
    starts: list[int],
    page_size: int,
    g: int,
) -> PrefixGroup:
    if shared < 0:
        return _alone(rows[0], page_table, prefixes[rows[0]], extends[rows[0]], starts, page_size)
    base = shared * page_size  # tail position 0 is sequence position `base`
    mids = torch.tensor([prefixes[r] - base for r in rows])  # prefix keys in the tail
    exts = torch.tensor([extends[r] for r in rows])
    m = int(exts.max())
    lt = int((mids + exts).max())
    pos = base + torch.arange(lt)  # [Lt]
    pages = page_table[rows].long()
    cols = (pos // page_size).clamp(max=pages.shape[1] - 1)
    slots = pages[:, cols] * page_size + pos % page_size  # [G, Lt]
    t = torch.arange(lt)[None, None, :]
    j = torch.arange(m)[None, :, None]
    visible = (t <= mids[:, None, None] + j) & (j < exts[:, None, None])
    visible[:, :, 0] |= ~(j[:, :, 0] < exts[:, None])  # a padded query sees key 0 (no NaN)
    slots = torch.where(visible.any(dim=1), slots, torch.zeros_like(slots))
    mask = torch.zeros(visible.shape).masked_fill_(~visible, float("-inf"))
    mask = mask[:, None].expand(-1, g, -1, -1).reshape(len(rows), 1, g * m, lt)
    q_rows = torch.cat([torch.arange(starts[r], starts[r] + extends[r]) for r in rows])
    pad_rows = torch.cat([i * m + torch.arange(extends[r]) for i, r in enumerate(rows)])
    shared_slots = None
    if shared:
        first = page_table[rows[0], :shared].long()
        shared_slots = (first[:, None] * page_size + torch.arange(page_size)).reshape(-1)
    return PrefixGroup(q_rows, shared_slots, slots, mask, pad_rows, m)


def _alone(
    r: int, page_table: torch.Tensor, prefix: int, extend: int, starts: list[int], page_size: int
) -> PrefixGroup:
    """One request: its whole prefix unmasked, its chunk causal (no mask)."""
    pos = torch.arange(prefix + extend)
    slots = page_table[r].long()[pos // page_size] * page_size + pos % page_size
    rows = torch.arange(starts[r], starts[r] + extend)
    return PrefixGroup(rows, slots[:prefix] if prefix else None, slots[None, prefix:], None,
                       torch.arange(extend), extend)  # fmt: skip


def prefix_extend_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    scale: float,
    plan: PrefixExtendPlan,
) -> torch.Tensor:
    """Same result as `kernels.paged_extend_attention` for the plan's batch: q [T, Hq, D]."""
    hq, d = q.shape[1:]
    hkv = k_pool.shape[2]
    g = hq // hkv
    k_flat = k_pool.view(-1, hkv, d)
    v_flat = v_pool.view(-1, hkv, d)
    out = torch.empty_like(q)
    for grp in plan.groups:
        qg = q.index_select(0, grp.q_rows)  # [Tg, Hq, D]
        if grp.mask is None:  # one request's chunk, causal: heads side by side, K/V repeated
            kt = k_flat.index_select(0, grp.tail_slots[0]).to(q.dtype).repeat_interleave(g, dim=1)
            vt = v_flat.index_select(0, grp.tail_slots[0]).to(q.dtype).repeat_interleave(g, dim=1)
            o2, l2 = _flash(qg.transpose(0, 1)[None], kt.transpose(0, 1)[None],
                            vt.transpose(0, 1)[None], is_causal=True, scale=scale)  # fmt: skip
            o2, l2 = o2[0].transpose(0, 1), l2[0].transpose(0, 1)
        else:
            o2, l2 = _tail(qg, grp, k_flat, v_flat, hkv, g, scale)
        if grp.shared_slots is None:
            out[grp.q_rows] = o2.to(q.dtype)
            continue
        # the shared prefix: every query of the group against one copy, no mask
        ks = k_flat.index_select(0, grp.shared_slots).to(q.dtype)
        vs = v_flat.index_select(0, grp.shared_slots).to(q.dtype)
        o1, l1 = attend_all(qg, ks, vs, scale)
        out[grp.q_rows] = _merge(o1, l1, o2, l2).to(q.dtype)
    return out


def _tail(
    qg: torch.Tensor,
    grp: PrefixGroup,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    hkv: int,
    g: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A group's tails: each member's chunk padded to M queries against its own keys, one
    masked call; (out [Tg, Hq, D], lse [Tg, Hq]) in the group's query order."""
    hq, d = qg.shape[1:]
    n, lt = grp.tail_slots.shape
    m = grp.chunk
    qp = qg.new_zeros(n * m, hq, d)
    qp[grp.pad_rows] = qg
    qp = qp.view(n, m, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(n, hkv, g * m, d)
    flat = grp.tail_slots.reshape(-1)
    kt = k_flat.index_select(0, flat).to(qg.dtype).view(n, lt, hkv, d).transpose(1, 2)
    vt = v_flat.index_select(0, flat).to(qg.dtype).view(n, lt, hkv, d).transpose(1, 2)
    o2, l2 = _flash(qp, kt, vt, attn_mask=grp.mask.to(qg.dtype), scale=scale)
    o2 = o2.view(n, hkv, g, m, d).permute(0, 3, 1, 2, 4).reshape(n * m, hq, d)[grp.pad_rows]
    l2 = l2.view(n, hkv, g, m).permute(0, 3, 1, 2).reshape(n * m, hq)[grp.pad_rows]
    return o2, l2


def _merge(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """Softmax-weighted sum of two halves over disjoint keys, in float32 (both have keys)."""
    top = torch.maximum(l1, l2)
    w1 = (l1 - top).exp_()
    w2 = (l2 - top).exp_()
    total = w1 + w2
    w1.div_(total)
    w2.div_(total)
    return o1.float().mul_(w1[..., None]).add_(o2.float().mul_(w2[..., None]))
