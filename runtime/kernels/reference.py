"""Torch reference for the paged-attention and token-bitmask kernels.

This is both the CPU path of the engine and the oracle the Triton kernels are tested against.
The KV pool of one layer is ``[num_pages, page_size, kv_heads, head_dim]``; the slot of position
``p`` of request ``b`` is page ``page_table[b, p // page_size]``, offset ``p % page_size``.
Query head ``h`` reads kv head ``h // (q_heads // kv_heads)`` (grouped-query attention).

Softmax is computed in float32 whatever the input dtype; the output has the dtype of ``q``.
Entries of ``page_table`` past a request's last page are never dereferenced (they may hold any
value, e.g. -1 or stale page ids).

Multi-head latent attention (DeepSeek MLA, weights absorbed) keeps one latent per token instead:
``paged_latent_decode_attention`` reads a pool ``[num_pages, page_size, 1, rank + rope_dim]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "apply_token_bitmask_",
    "paged_decode_attention",
    "paged_extend_attention",
    "paged_latent_decode_attention",
]


def _gather_kv(pool: torch.Tensor, page_rows: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` positions of each request, read through its page-table row.

    page_rows [N, max_pages]. Returns [N, length, kv_heads, head_dim]. Whole pages are copied
    (one index per page, not per token); positions past a request's own length come from
    whatever page its table names there, clamped into the pool, and must be masked by the
    caller.
    """
    num_pages, page_size = pool.shape[0], pool.shape[1]
    n = page_rows.shape[0]
    pages_needed = -(-length // page_size)
    pages = page_rows[:, :pages_needed].long().clamp(0, num_pages - 1)
    gathered = pool.index_select(0, pages.reshape(-1))  # [N * pages, page_size, Hkv, D]
    return gathered.view(n, pages_needed * page_size, *pool.shape[2:])[:, :length]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """Masked GQA attention in float32 through torch's SDPA.

    q [N, M, Hq, D]; k, v [N, L, Hkv, D]; allowed [N, M, L] bool. Returns [N, M, Hq, D] float32.
    A query with no allowed key gets zeros.
    """
    out = F.scaled_dot_product_attention(
        q.float().transpose(1, 2),  # [N, Hq, M, D]
        k.float().transpose(1, 2),  # [N, Hkv, L, D]; query head h reads kv head h // group
        v.float().transpose(1, 2),
        # no mask when every key is visible (equal-length decode batches): a faster kernel
        attn_mask=None if bool(allowed.all()) else allowed[:, None],  # broadcast over heads
        scale=scale,
        enable_gqa=True,
    )
    # a row with every key masked is 0/0 (NaN or backend-dependent): it attends to nothing
    no_keys = ~allowed.any(dim=-1)  # [N, M]
    return out.masked_fill_(no_keys[:, None, :, None], 0.0).transpose(1, 2)


def _check_heads(q_heads: int, kv_heads: int) -> None:
    if q_heads % kv_heads != 0:
        raise ValueError(f"query heads ({q_heads}) must be a multiple of kv heads ({kv_heads})")


def paged_decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per request against its whole cached sequence.

    q [B, Hq, D]; page_table int32 [B, max_pages]; seq_lens int32 [B], counting the current
    token, whose K/V must already be in the pool. Returns [B, Hq, D] in ``q.dtype``.
    """
    _check_heads(q.shape[1], k_pool.shape[2])
    batch = q.shape[0]
    if batch == 0:
        return torch.empty_like(q)
    lens = seq_lens.to(device=q.device, dtype=torch.long)
    max_len = max(int(lens.max()), 1)
    positions = torch.arange(max_len, device=q.device)
    valid = positions[None, :] < lens[:, None]  # [B, L]
    k = _gather_kv(k_pool, page_table, max_len)
    v = _gather_kv(v_pool, page_table, max_len)
    out = _attend(q[:, None], k, v, valid[:, None, :], scale)
    return out[:, 0].to(q.dtype)


def paged_extend_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """A chunk of new tokens per request against its cached prefix, causal within the chunk.

    q [T, Hq, D] with T = sum(extend_lens), requests concatenated in batch order. The new
    tokens' K/V must already be in the pool. Query j of request b sits at position
    prefix_lens[b] + j and attends to positions 0 .. prefix_lens[b] + j. Returns [T, Hq, D].
    """
    _check_heads(q.shape[1], k_pool.shape[2])
    out = torch.empty_like(q)
    prefixes = prefix_lens.tolist()
    extends = extend_lens.tolist()
    if sum(extends) != q.shape[0]:
        raise ValueError(f"sum(extend_lens)={sum(extends)} but q has {q.shape[0]} tokens")
    start = 0
    # One request at a time: each is fully vectorised, and memory stays proportional to the
    # largest request instead of batch x longest chunk x longest sequence.
    for b, (prefix, extend) in enumerate(zip(prefixes, extends, strict=True)):
        if extend == 0:
            continue
        total = prefix + extend
        positions = torch.arange(total, device=q.device)
        k = _gather_kv(k_pool, page_table[b : b + 1], total)
        v = _gather_kv(v_pool, page_table[b : b + 1], total)
        q_pos = prefix + torch.arange(extend, device=q.device)
        allowed = positions[None, :] <= q_pos[:, None]  # [E, L]
        chunk = q[start : start + extend][None]
        out[start : start + extend] = _attend(chunk, k, v, allowed[None], scale)[0].to(q.dtype)
        start += extend
    return out


def check_latent_decode(q: torch.Tensor, latent_pool: torch.Tensor, rank: int) -> None:
    """Raise ValueError unless q [B, H, R + Dr] and latent_pool [pages, page_size, 1, R + Dr]
    fit together with ``rank`` = R (0 < R <= R + Dr)."""
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, heads, rank + rope_dim], got {tuple(q.shape)}")
    if latent_pool.dim() != 4 or latent_pool.shape[2] != 1:
        raise ValueError(
            "latent_pool must be [num_pages, page_size, 1, rank + rope_dim], got "
            f"{tuple(latent_pool.shape)}"
        )
    if q.shape[2] != latent_pool.shape[3]:
        raise ValueError(
            f"latent width mismatch: q has {q.shape[2]}, latent_pool has {latent_pool.shape[3]}"
        )
    if not 0 < rank <= q.shape[2]:
        raise ValueError(f"rank must be in 1..{q.shape[2]} (the latent width), got {rank}")


def paged_latent_decode_attention(
    q: torch.Tensor,
    latent_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    rank: int,
) -> torch.Tensor:
    """MLA decode with absorbed weights: every head of a request attends to one shared latent.

    latent_pool [num_pages, page_size, 1, R + Dr] holds per token the normalised compressed KV
    ``c`` (first R = ``rank`` values) then the rotated shared rope key ``k_rope`` (last Dr).
    q [B, H, R + Dr]: per head the absorbed nope query (q_nope @ W_uk, R values) then the
    rotated rope query (Dr values). Request b's ``seq_lens[b]`` tokens are read through
    ``page_table[b]`` (int32 [B, max_pages]; token j at page page_table[b, j // page_size],
    offset j % page_size). scores_j = scale * (q . latent_j) over all R + Dr values,
    p = softmax over j < seq_lens[b], out[b, h] = sum_j p_j * latent_j[:R] (the latent is both
    key and value). Returns [B, H, R] in ``q.dtype``, computed in float32; seq_len 0 gives zeros.
    """
    check_latent_decode(q, latent_pool, rank)
    batch, heads = q.shape[0], q.shape[1]
    if batch == 0:
        return q.new_empty(0, heads, rank)
    lens = seq_lens.to(device=q.device, dtype=torch.long)
    max_len = max(int(lens.max()), 1)
    positions = torch.arange(max_len, device=q.device)
    valid = positions[None, :] < lens[:, None]  # [B, L]
    latent = _gather_kv(latent_pool, page_table, max_len)[:, :, 0].float()  # [B, L, R + Dr]
    # one kv head that every query head reads: two batched matmuls (SDPA's GQA path with a
    # value narrower than the key is ~50x slower on CPU); the value is the first R values
    scores = torch.bmm(q.float(), latent.transpose(1, 2)) * scale  # [B, H, L]
    scores = scores.masked_fill(~valid[:, None, :], -torch.inf)
    probs = scores.softmax(dim=-1).nan_to_num_(0.0)  # a request with no tokens: zeros
    return torch.bmm(probs, latent[..., :rank]).to(q.dtype)


def apply_token_bitmask_(
    logits: torch.Tensor, bitmask: torch.Tensor, row_indices: torch.Tensor | None = None
) -> torch.Tensor:
    """Set disallowed logits to -inf in place; returns ``logits``.

    logits float [B, V]; bitmask int32 [R, W]: bit b of word w allows token 32*w + b, and a
    token >= 32*W is disallowed. Row i of the bitmask applies to logits row row_indices[i]
    (row i when ``row_indices`` is None, then R <= B).
    """
    vocab = logits.shape[1]
    words = bitmask.shape[1]
    if row_indices is not None and row_indices.numel() == 0:
        return logits
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    # Arithmetic shift keeps the sign bit in place, so bit 31 reads right after the & 1.
    bits = ((bitmask.to(torch.int32)[:, :, None] >> shifts) & 1).bool()  # [R, W, 32]
    allowed = bits.reshape(bitmask.shape[0], words * 32).to(logits.device)
    if words * 32 >= vocab:
        allowed = allowed[:, :vocab]
    else:
        pad = torch.zeros(allowed.shape[0], vocab - words * 32, dtype=torch.bool)
        allowed = torch.cat([allowed, pad.to(logits.device)], dim=1)
    if row_indices is None:
        rows = logits[: allowed.shape[0]]
        rows.masked_fill_(~allowed, float("-inf"))
    else:
        idx = row_indices.to(device=logits.device, dtype=torch.long)
        logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
    return logits
