"""Triton paged decode for multi-head latent attention (DeepSeek MLA, weights absorbed).

The KV pool of one layer is ``latent_pool [num_pages, page_size, 1, R + Dr]``: per token the
normalised compressed KV ``c`` (first R = ``rank`` values) and the rotated shared rope key
``k_rope`` (last Dr). ``q [B, H, R + Dr]`` holds per head the absorbed nope query
(q_nope @ W_uk, R values) then the rotated rope query (Dr values). Request b's
``seq_lens[b]`` tokens are read through ``page_table[b]`` (int32 [B, max_pages]; token j at
page ``page_table[b, j // page_size]``, offset ``j % page_size``)::

    scores_j = scale * (q . latent_j)          over all R + Dr values, j < seq_lens[b]
    out[b, h] = sum_j softmax(scores)_j * latent_j[:R]

Output [B, H, R] in q's dtype, accumulated in float32; seq_len 0 gives zeros.

Flash-decoding like ``triton_attention``: each program owns one (request, block of heads,
split of the sequence). All heads of a request share one latent, so a block of ``BLOCK_H``
heads reads each latent block once, and that one load serves both the scores (``c`` against
the nope query, ``k_rope`` against the rope query) and the value accumulation (``c`` again):
there is no second read for V. R and Dr are loaded as two tiles, each padded to a power of
two under a mask (DeepSeek V3: 512 + 64). Splits are merged by their log-sum-exp with
``triton_attention``'s merge kernel.

Semantics and signature match ``runtime.kernels.reference.paged_latent_decode_attention``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.kernels.reference import check_latent_decode
from runtime.kernels.triton.attention import (
    _LOG2E,
    _decode_merge_kernel,
    _default_splits,
    _precision,
    _upcast,
)

__all__ = ["paged_latent_decode_attention"]


@triton.jit
def _mla_decode_split_kernel(
    Q,
    Latent,
    PageTable,
    SeqLens,
    PartOut,
    PartLse,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_lp,
    stride_ls,
    stride_pt,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    num_splits,
    HEADS: tl.constexpr,
    RANK: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + b)
    # This split's share of the sequence; the last splits may be empty for short sequences.
    split_len = tl.cdiv(seq_len, num_splits)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_r = tl.arange(0, BLOCK_R)
    offs_dr = tl.arange(0, BLOCK_DR)
    head_mask = heads < HEADS
    r_mask = offs_r < RANK
    dr_mask = offs_dr < ROPE_DIM
    q_row = Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    q_nope = tl.load(q_row + offs_r[None, :], mask=head_mask[:, None] & r_mask[None, :], other=0.0)
    q_rope = tl.load(
        q_row + RANK + offs_dr[None, :], mask=head_mask[:, None] & dr_mask[None, :], other=0.0
    )
    if UPCAST:
        q_nope = q_nope.to(tl.float32)
        q_rope = q_rope.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float32)
    pt_row = PageTable + b.to(tl.int64) * stride_pt
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < end
        # position -> (page, offset) -> pool slot; int64 so big pools don't overflow
        page = tl.load(pt_row + pos // PAGE_SIZE, mask=valid, other=0).to(tl.int64)
        slot = Latent + page[:, None] * stride_lp + (pos % PAGE_SIZE)[:, None] * stride_ls
        # the one read of this block: c [BLOCK_N, BLOCK_R] and k_rope [BLOCK_N, BLOCK_DR]
        c = tl.load(slot + offs_r[None, :], mask=valid[:, None] & r_mask[None, :], other=0.0)
        k_rope = tl.load(
            slot + RANK + offs_dr[None, :], mask=valid[:, None] & dr_mask[None, :], other=0.0
        )
        # fp8 pools: dequantized here, per block (no-op when the types match)
        c = c.to(q_nope.dtype)
        k_rope = k_rope.to(q_rope.dtype)
        qk = tl.dot(q_nope, tl.trans(c), input_precision=PRECISION)
        qk = tl.dot(q_rope, tl.trans(k_rope), acc=qk, input_precision=PRECISION)
        qk = tl.where(valid[None, :], qk * scale_log2, float("-inf"))
        # online softmax: rescale what was summed so far to the new running max
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # the value is the same c tile, already loaded
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=PRECISION)
        m_i = m_new

    # An empty split leaves m_i = -inf and l_i = 0: lse = -inf, out = 0, ignored by the merge.
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    part = PartOut + b.to(tl.int64) * stride_pb + heads * stride_ph + split * stride_ps
    tl.store(part[:, None] + offs_r[None, :], out, mask=head_mask[:, None] & r_mask[None, :])
    lse_ptrs = PartLse + b.to(tl.int64) * stride_lb + heads * stride_lh + split
    tl.store(lse_ptrs, lse, mask=head_mask)


def _check(q: torch.Tensor, latent_pool: torch.Tensor, rank: int) -> None:
    check_latent_decode(q, latent_pool, rank)
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)  # read and converted inside the kernel
    if q.dtype != latent_pool.dtype and latent_pool.dtype not in fp8:
        raise ValueError(f"q is {q.dtype} but latent_pool is {latent_pool.dtype}")
    for name, t in (("q", q), ("latent_pool", latent_pool)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (latent) dimension")


def paged_latent_decode_attention(
    q: torch.Tensor,
    latent_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    rank: int,
    *,
    num_splits: int | None = None,
    block_h: int = 16,
    block_n: int | None = None,
) -> torch.Tensor:
    """See ``reference.paged_latent_decode_attention``; ``num_splits`` splits each sequence,
    ``block_h`` heads share one program (and one read of each latent block)."""
    _check(q, latent_pool, rank)
    batch, heads, width = q.shape
    rope_dim, page_size = width - rank, latent_pool.shape[1]
    out = q.new_empty(batch, heads, rank)
    if batch == 0 or heads == 0:
        return out
    block_r = max(16, triton.next_power_of_2(rank))
    block_dr = max(16, triton.next_power_of_2(rope_dim))
    block_h = max(16, triton.next_power_of_2(block_h))  # tl.dot needs >= 16 rows
    # a wide latent (DeepSeek's 512 + 64) with 32 tokens per block spills registers in the
    # fp32 sm_90 build (cuobjdump -res-usage); 16 does not, in fp32 or bf16. Untuned on a GPU.
    block_n = block_n or (16 if block_r + block_dr > 256 else 32)
    head_blocks = triton.cdiv(heads, block_h)
    page_table = page_table.to(device=q.device, dtype=torch.int32)
    seq_lens = seq_lens.to(device=q.device, dtype=torch.int32)
    if num_splits is None:
        # the page table bounds the sequence length without a device -> host sync
        upper = page_table.shape[1] * page_size
        num_splits = _default_splits(q, batch, head_blocks, upper, block_n)
    part_out = torch.empty(batch, heads, num_splits, rank, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(batch, heads, num_splits, dtype=torch.float32, device=q.device)
    _mla_decode_split_kernel[(batch, head_blocks, num_splits)](
        q, latent_pool, page_table, seq_lens, part_out, part_lse, scale * _LOG2E,
        q.stride(0), q.stride(1),
        latent_pool.stride(0), latent_pool.stride(1),
        page_table.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        num_splits,
        HEADS=heads, RANK=rank, ROPE_DIM=rope_dim, PAGE_SIZE=page_size,
        BLOCK_H=block_h, BLOCK_R=block_r, BLOCK_DR=block_dr, BLOCK_N=block_n,
        PRECISION=_precision(q.dtype), UPCAST=_upcast(q),
    )  # fmt: skip
    _decode_merge_kernel[(batch, heads)](
        part_out, part_lse, out,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1),
        num_splits,
        HEAD_DIM=rank, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_r,
    )  # fmt: skip
    return out
