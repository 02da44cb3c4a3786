"""Multi-head Latent Attention over the paged latent cache.

Per token the pool holds `[c, k_rope]`: the normalised compressed KV `c` (kv_lora_rank = R
values) and the rotated rope key shared by all heads (Dr values). `kv_b_proj` expands `c` into
each head's nope key (`W_uk` [H, nope, R]) and value (`W_uv` [H, v, R]).

Absorbed (the default, decode and prefill): the key up-projection is folded into the query,
`q_lat = q_nope @ W_uk` [H, R], so a head's score is `q_lat . c + q_rope . k_rope`, one dot
product with the latent itself; attention averages latents, and `W_uv` is applied once to that
average. Cached tokens never get per-head K/V. To the attention kernels this is multi-query
attention with one KV "head" of R + Dr dimensions.

Decompressed (for checks and the benchmark): every cached token's latent is expanded to per-head
K and V at each step, as a generic engine would, then ordinary attention.
"""

from __future__ import annotations

import torch

from runtime.attention import AttentionBackend, LayerSpec
from runtime.errors import UnsupportedAttentionError


def absorbed_attention(
    q_nope: torch.Tensor,  # [T, H, nope]
    q_rope: torch.Tensor,  # [T, H, Dr]
    w_uk: torch.Tensor,  # [H, nope, R]
    w_uv: torch.Tensor,  # [H, v, R]
    attention: AttentionBackend,
    layer: int,
    spec: LayerSpec,
) -> torch.Tensor:
    """[T, H, v]: decode tokens first, then extend chunks, as in the step's batch."""
    rank = w_uk.shape[-1]
    q = torch.cat((torch.einsum("thn,hnr->thr", q_nope, w_uk), q_rope), dim=-1)
    out_latent = attention.latent_attend(layer, q, spec, rank)
    return torch.einsum("thr,hvr->thv", out_latent, w_uv)


def _gather(latent: torch.Tensor, page_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens' latents [length, R + Dr] through one page-table row."""
    ps = latent.shape[1]
    j = torch.arange(length, device=latent.device)
    slots = page_row[j // ps].long() * ps + j % ps
    flat = latent.view(-1, latent.shape[-1]).index_select(0, slots.reshape(-1))
    return flat.view(*slots.shape, latent.shape[-1])  # index_select: faster than [] on CPU


def decompressed_attention(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    attention: AttentionBackend,
    layer: int,
    spec: LayerSpec,
) -> torch.Tensor:
    """The same result as `absorbed_attention`, expanding every cached latent to per-head K/V
    (full causal attention: a `spec` with a window or soft cap is refused)."""
    if not spec.plain:
        raise UnsupportedAttentionError("decompressed MLA attends causally over every token")
    rank = w_uk.shape[-1]
    batch, scale = attention.batch, spec.scale
    latent = attention.latent_cache(layer, q_nope.dtype)
    q = torch.cat((q_nope, q_rope), dim=-1)  # [T, H, nope + Dr]
    nd = batch.num_decode
    rows: list[tuple[int, int, torch.Tensor, int]] = []  # (first query, count, page row, prefix)
    for b in range(nd):
        rows.append((b, 1, batch.decode_page_table[b], int(batch.decode_seq_lens[b]) - 1))
    start = nd
    for e in range(batch.extend_lens.shape[0]):
        n = int(batch.extend_lens[e])
        rows.append((start, n, batch.extend_page_table[e], int(batch.extend_prefix_lens[e])))
        start += n
    out = q.new_zeros(q.shape[0], q.shape[1], w_uv.shape[1])
    for first, n, page_row, prefix in rows:
        lat = _gather(latent, page_row, prefix + n).to(q.dtype)
        c, k_rope = lat[:, :rank], lat[:, rank:]
        k_nope = torch.einsum("lr,hnr->hln", c, w_uk)  # [H, L, nope]
        k = torch.cat((k_nope, k_rope.expand(k_nope.shape[0], -1, -1)), dim=-1)
        v = torch.einsum("lr,hvr->hlv", c, w_uv)  # [H, L, v]
        qs = q[first : first + n].transpose(0, 1)  # [H, n, d]
        scores = (qs.float() @ k.float().transpose(1, 2)) * scale  # [H, n, L]
        pos = torch.arange(prefix, prefix + n, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(prefix + n, device=q.device) > pos, -torch.inf)
        out[first : first + n] = (scores.softmax(-1) @ v.float()).transpose(0, 1).to(out.dtype)
    return out
