"""Decode attention that reads a prefix shared by many requests once (cascade attention).

With a radix cache, requests that share a prompt prefix share its KV *pages*. Plain paged
attention still reads those pages once per request: 64 questions behind a 1,500-token few-shot
prefix read 64 x 1,500 tokens of K/V per layer and step. Here the decode batch is grouped by
shared leading pages; each group attends to the shared part in one matmul (all its queries
against one copy of the K/V), to its own tail separately, and the two halves are merged
exactly with their log-sum-exps. Requests that share nothing take the ordinary kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime import kernels

MIN_SHARED_PAGES = 2  # below this the grouping costs more than it saves
MIN_SHARED_TO_TAIL = 2  # the shared prefix must be at least this many times the longest tail
MIN_TOKENS_SAVED = 2048  # K/V token reads a group must save (measured on CPU)
# torch's CPU flash attention, which also returns the log-sum-exp of each query's scores
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass(slots=True)
class CascadeGroup:
    rows: torch.Tensor  # [G] rows of the decode batch
    shared_slots: torch.Tensor  # [Ls] flat pool slots of the shared prefix
    tail_slots: torch.Tensor  # [G, Lt] flat pool slots after the shared pages (0 past a tail)
    tail_valid: torch.Tensor  # [G, Lt] bool: a key of the member's tail


@dataclass(slots=True)
class CascadePlan:
    groups: list[CascadeGroup]
    single_rows: torch.Tensor  # rows that go through the ordinary paged kernel

    @property
    def useful(self) -> bool:
        return bool(self.groups)


def plan_cascade(page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int) -> CascadePlan:
    """Group decode rows whose page tables start with the same pages (computed once per step)."""
    b = page_table.shape[0]
    lens = seq_lens.long()
    first = page_table[:, 0].tolist()
    by_first: dict[int, list[int]] = {}
    for row, page in enumerate(first):
        by_first.setdefault(page, []).append(row)
    groups: list[CascadeGroup] = []
    singles: list[int] = []
    for rows in by_first.values():
        if len(rows) < 2:
            singles.extend(rows)
            continue
        idx = torch.tensor(rows)
        pt = page_table[idx]
        # only whole pages every member has fully written can be shared
        full = int(lens[idx].min()) // page_size
        same = (pt[:, :full] == pt[:1, :full]).all(dim=0)
        shared = int(same.long().cumprod(0).sum()) if full else 0
        shared_tokens = shared * page_size
        longest_tail = int(lens[idx].max()) - shared_tokens
        # the requests reading the prefix: one request's verify rows (its drafts as decode
        # rows) have the same page table and count once, as the one-call decode path that a
        # group turns off costs them more than their repeated reads of their own pages
        readers = int(torch.unique(pt, dim=0).shape[0])
        # worth it only when the shared part dominates: the merge costs more than a short read
        if (
            shared < MIN_SHARED_PAGES
            or shared_tokens < MIN_SHARED_TO_TAIL * longest_tail
            or shared_tokens * (readers - 1) < MIN_TOKENS_SAVED
        ):
            singles.extend(rows)
            continue
        pages = pt[0, :shared].long()
        slots = (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)
        groups.append(CascadeGroup(idx, slots, *_tails(pt[:, shared:], lens[idx] - shared_tokens,
                                                       page_size)))  # fmt: skip
    del b
    return CascadePlan(groups, torch.tensor(sorted(singles), dtype=torch.long))


def _tails(
    pages: torch.Tensor, tail_lens: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each member's tail keys as flat pool slots (0 where past its length) and their mask."""
    tail_len = int(tail_lens.max())
    pages = pages[:, : -(-tail_len // page_size)].long()
    slots = (pages[:, :, None] * page_size + torch.arange(page_size)).reshape(len(pages), -1)
    slots = slots[:, :tail_len]
    valid = torch.arange(tail_len)[None, :] < tail_lens[:, None]
    return torch.where(valid, slots, torch.zeros_like(slots)), valid


def attend_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GQA attention in float32 returning (out [N, M, Hq, D], lse [N, M, Hq]).

    q [N, M, Hq, D]; k, v [N, L, Hkv, D]; valid [N, L] bool or None (all keys visible).
    """
    n, m, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    qg = q.float().view(n, m, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(n, hkv, g * m, d)
    scores = torch.matmul(qg, k.float().permute(0, 2, 3, 1)).mul_(scale)  # [N, Hkv, G*M, L]
    if valid is not None:
        scores.masked_fill_(~valid[:, None, None, :], float("-inf"))
    # softmax and its log-sum-exp in four passes over the scores, in place: max, exp, sum, scale
    top = scores.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # rows without keys
    probs = scores.sub_(top).exp_()
    total = probs.sum(dim=-1, keepdim=True)
    probs.div_(torch.where(total > 0, total, torch.ones_like(total)))  # keyless rows stay 0
    lse = (top + total.log())[..., 0]  # [N, Hkv, G*M]; -inf for a row without keys
    out = torch.matmul(probs, v.float().permute(0, 2, 1, 3))  # [N, Hkv, G*M, D]
    out = out.view(n, hkv, g, m, d).permute(0, 3, 1, 2, 4).reshape(n, m, hq, d)
    lse = lse.view(n, hkv, g, m).permute(0, 3, 1, 2).reshape(n, m, hq)
    return out, lse


def attend_all(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every query against every key (no mask), through torch's CPU flash attention: (out
    [T, Hq, D] in q's dtype, lse [T, Hq] float32) for q [T, Hq, D], k, v [L, Hkv, D]. The query
    heads of one KV head are stacked along the query axis: K/V are read as they are."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qs = q.view(t, hkv, g, d).permute(1, 2, 0, 3).reshape(1, hkv, g * t, d)
    out, lse = _flash(qs, k.transpose(0, 1)[None], v.transpose(0, 1)[None], scale=scale)
    out = out.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, hq, d)
    return out, lse.view(hkv, g, t).permute(2, 0, 1).reshape(t, hq)


def _merge(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """Combine two attention halves over disjoint key sets from their outputs and lses."""
    top = torch.maximum(l1, l2)
    w1 = torch.exp(l1 - top).nan_to_num_(0.0)
    w2 = torch.exp(l2 - top).nan_to_num_(0.0)
    return (o1 * w1[..., None] + o2 * w2[..., None]) / (w1 + w2)[..., None]


def cascade_decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    plan: CascadePlan,
) -> torch.Tensor:
    """Same result as `kernels.paged_decode_attention`, sharing reads of common prefixes."""
    out = torch.empty_like(q)
    k_flat = k_pool.view(-1, *k_pool.shape[2:])
    v_flat = v_pool.view(-1, *v_pool.shape[2:])
    for grp in plan.groups:
        qg = q[grp.rows]  # [G, Hq, D]
        ks = k_flat.index_select(0, grp.shared_slots).to(q.dtype)  # index_select: faster than []
        vs = v_flat.index_select(0, grp.shared_slots).to(q.dtype)
        o1, l1 = attend_all(qg, ks, vs, scale)  # all G queries at once
        slots, valid = grp.tail_slots, grp.tail_valid  # the same for every layer
        flat = slots.reshape(-1)
        kt = k_flat.index_select(0, flat).to(q.dtype).view(*slots.shape, *k_flat.shape[1:])
        vt = v_flat.index_select(0, flat).to(q.dtype).view(*slots.shape, *v_flat.shape[1:])
        o2, l2 = attend_with_lse(qg[:, None], kt, vt, valid, scale)
        out[grp.rows] = _merge(o1.float(), l1, o2[:, 0], l2[:, 0]).to(q.dtype)
    if plan.single_rows.numel():
        rows = plan.single_rows
        out[rows] = kernels.paged_decode_attention(
            q[rows], k_pool, v_pool, page_table[rows], seq_lens[rows], scale
        )
    return out
