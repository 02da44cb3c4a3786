"""Triton paged attention: decode (one query per request) and extend (a chunk per request).

Both kernels read K/V through the page table of a pool laid out as
``[num_pages, page_size, kv_heads, head_dim]`` (head_dim contiguous) and use an online softmax
in the log2 domain (``exp2`` with the scale folded into ``log2(e) * scale``).

Decode runs flash-decoding style: each program owns one (request, kv head, split of the
sequence) and all the query heads of that kv head's group, so K/V are read once per group;
a second kernel merges the splits by their log-sum-exp. Extend runs one program per
(request, query head, block of new tokens), causal within the chunk.

Semantics and signatures match ``runtime.kernels.reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime import settings

__all__ = ["paged_decode_attention", "paged_extend_attention"]

_LOG2E = 1.4426950408889634


@triton.jit
def _decode_split_kernel(
    Q,
    K,
    V,
    PageTable,
    SeqLens,
    PartOut,
    PartLse,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_pt,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    num_splits,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + b)
    # This split's share of the sequence; the last splits may be empty for short sequences.
    split_len = tl.cdiv(seq_len, num_splits)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    head_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h
    q_ptrs = Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=head_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    pt_row = PageTable + b.to(tl.int64) * stride_pt
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < end
        # position -> (page, offset) -> pool slot; int64 so big pools don't overflow
        page = tl.load(pt_row + pos // PAGE_SIZE, mask=valid, other=0).to(tl.int64)
        offset = pos % PAGE_SIZE
        kv_mask = valid[:, None] & d_mask[None, :]
        k_ptrs = K + page[:, None] * stride_kp + offset[:, None] * stride_ks + kvh * stride_kh
        k = tl.load(k_ptrs + offs_d[None, :], mask=kv_mask, other=0.0)
        k = k.to(q.dtype)  # fp8 pools: dequantized here, per block (no-op when types match)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        qk = tl.where(valid[None, :], qk, float("-inf"))
        # online softmax: rescale what was summed so far to the new running max
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = V + page[:, None] * stride_vp + offset[:, None] * stride_vs + kvh * stride_vh
        v = tl.load(v_ptrs + offs_d[None, :], mask=kv_mask, other=0.0)
        v = v.to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    # An empty split leaves m_i = -inf and l_i = 0: lse = -inf, out = 0, ignored by the merge.
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    part = PartOut + b.to(tl.int64) * stride_pb + heads * stride_ph + split * stride_ps
    tl.store(part[:, None] + offs_d[None, :], out, mask=head_mask[:, None] & d_mask[None, :])
    lse_ptrs = PartLse + b.to(tl.int64) * stride_lb + heads * stride_lh + split
    tl.store(lse_ptrs, lse, mask=head_mask)


@triton.jit
def _decode_merge_kernel(
    PartOut,
    PartLse,
    Out,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    lse_base = b.to(tl.int64) * stride_lb + h * stride_lh
    lse = tl.load(PartLse + lse_base + offs_s, mask=s_mask, other=float("-inf"))
    part = tl.load(
        PartOut
        + b.to(tl.int64) * stride_pb
        + h * stride_ph
        + offs_s[:, None] * stride_ps
        + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    # weight each split by its share of the softmax mass; all -inf (no keys) gives zeros
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * part, 0) / tl.where(total > 0, total, 1.0)
    out_ptrs = Out + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=d_mask)


@triton.jit
def _extend_kernel(
    Q,
    K,
    V,
    PageTable,
    PrefixLens,
    ExtendLens,
    ExtendStarts,
    Out,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_pt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    extend_len = tl.load(ExtendLens + b)
    if mb * BLOCK_M >= extend_len:
        return
    prefix = tl.load(PrefixLens + b)
    q_start = tl.load(ExtendStarts + b).to(tl.int64)
    kvh = h // GROUP

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < extend_len
    d_mask = offs_d < HEAD_DIM
    q_ptrs = Q + (q_start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = prefix + offs_m
    # keys past the last query of this block are invisible to all of its rows
    end = tl.minimum(prefix + extend_len, prefix + (mb + 1) * BLOCK_M)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    pt_row = PageTable + b.to(tl.int64) * stride_pt
    for n0 in range(0, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        in_range = pos < end
        page = tl.load(pt_row + pos // PAGE_SIZE, mask=in_range, other=0).to(tl.int64)
        offset = pos % PAGE_SIZE
        kv_mask = in_range[:, None] & d_mask[None, :]
        k_ptrs = K + page[:, None] * stride_kp + offset[:, None] * stride_ks + kvh * stride_kh
        k = tl.load(k_ptrs + offs_d[None, :], mask=kv_mask, other=0.0)
        k = k.to(q.dtype)  # fp8 pools: dequantized here, per block (no-op when types match)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        # causal: query at position q_pos sees keys 0 .. q_pos. Key 0 is visible to every row
        # (padding rows included), so the running max is finite after the first block.
        visible = (pos[None, :] <= q_pos[:, None]) & in_range[None, :]
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = V + page[:, None] * stride_vp + offset[:, None] * stride_vs + kvh * stride_vh
        v = tl.load(v_ptrs + offs_d[None, :], mask=kv_mask, other=0.0)
        v = v.to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    out = acc / l_i[:, None]
    out_ptrs = Out + (q_start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def _check(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> tuple[int, int]:
    """Validate layouts; returns (group size, BLOCK_D)."""
    if k_pool.shape != v_pool.shape or k_pool.dim() != 4:
        raise ValueError(
            f"k/v pools must both be [pages, page_size, kv_heads, head_dim], got "
            f"{tuple(k_pool.shape)} and {tuple(v_pool.shape)}"
        )
    if q.shape[-1] != k_pool.shape[3]:
        raise ValueError(f"head_dim mismatch: q {q.shape[-1]}, pool {k_pool.shape[3]}")
    if q.shape[-2] % k_pool.shape[2] != 0:
        raise ValueError(
            f"query heads ({q.shape[-2]}) not a multiple of kv heads ({k_pool.shape[2]})"
        )
    for name, t in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous head_dim")
    return q.shape[-2] // k_pool.shape[2], max(16, triton.next_power_of_2(q.shape[-1]))


def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs: exact fp32 products (no tf32), so results match the reference closely
    return "ieee" if dtype == torch.float32 else "tf32"


def _upcast(q: torch.Tensor) -> bool:
    # Triton's interpreter multiplies bf16 operands of tl.dot as their raw uint16 bits
    # (seen in triton 3.9); upcast them to fp32 there. Compiled kernels keep bf16 dots.
    interpreted = not q.is_cuda or settings.TRITON_INTERPRET.get()
    return q.dtype == torch.bfloat16 and interpreted


def _default_splits(q: torch.Tensor, batch: int, kv_heads: int, max_len: int, block_n: int) -> int:
    """Enough (request, kv head, split) programs to fill the device, never more than blocks."""
    if q.is_cuda:
        programs = 2 * torch.cuda.get_device_properties(q.device).multi_processor_count
    else:
        programs = 4  # interpreter: keep it small, but still exercise the merge
    wanted = triton.cdiv(programs, max(batch * kv_heads, 1))
    return max(1, min(wanted, 16, triton.cdiv(max(max_len, 1), block_n)))


def paged_decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    block_n: int = 32,
) -> torch.Tensor:
    """See ``reference.paged_decode_attention``; ``num_splits`` splits each sequence's keys."""
    group, block_d = _check(q, k_pool, v_pool)
    batch, q_heads, head_dim = q.shape
    kv_heads, page_size = k_pool.shape[2], k_pool.shape[1]
    out = torch.empty_like(q)
    if batch == 0:
        return out
    page_table = page_table.to(device=q.device, dtype=torch.int32)
    seq_lens = seq_lens.to(device=q.device, dtype=torch.int32)
    if num_splits is None:
        # the page table bounds the sequence length without a device -> host sync
        upper = page_table.shape[1] * page_size
        num_splits = _default_splits(q, batch, kv_heads, upper, block_n)
    part_out = torch.empty(
        batch, q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
    )
    part_lse = torch.empty(batch, q_heads, num_splits, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_pool, v_pool, page_table, seq_lens, part_out, part_lse, scale * _LOG2E,
        q.stride(0), q.stride(1),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        page_table.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        num_splits,
        GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_D=block_d, BLOCK_N=block_n,
        PRECISION=_precision(q.dtype), UPCAST=_upcast(q),
    )  # fmt: skip
    _decode_merge_kernel[(batch, q_heads)](
        part_out, part_lse, out,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1),
        num_splits,
        HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
    )  # fmt: skip
    return out


def paged_extend_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """See ``reference.paged_extend_attention``. One host sync (the longest chunk)."""
    group, block_d = _check(q, k_pool, v_pool)
    total, q_heads, head_dim = q.shape
    page_size = k_pool.shape[1]
    out = torch.empty_like(q)
    batch = extend_lens.shape[0]
    if total == 0 or batch == 0:
        return out
    page_table = page_table.to(device=q.device, dtype=torch.int32)
    prefix_lens = prefix_lens.to(device=q.device, dtype=torch.int32)
    extend_lens = extend_lens.to(device=q.device, dtype=torch.int32)
    starts = (torch.cumsum(extend_lens, 0, dtype=torch.int32) - extend_lens).contiguous()
    wide = q.dtype == torch.float32 or block_d > 128
    block_m = block_m or (32 if wide else 64)
    block_n = block_n or (32 if wide else 64)
    max_extend = int(extend_lens.max())
    grid = (batch, q_heads, triton.cdiv(max_extend, block_m))
    _extend_kernel[grid](
        q, k_pool, v_pool, page_table, prefix_lens, extend_lens, starts, out, scale * _LOG2E,
        q.stride(0), q.stride(1),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        page_table.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        BLOCK_M=block_m, BLOCK_D=block_d, BLOCK_N=block_n,
        PRECISION=_precision(q.dtype), UPCAST=_upcast(q),
    )  # fmt: skip
    return out
