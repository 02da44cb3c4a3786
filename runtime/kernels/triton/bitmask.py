"""Triton kernel: apply packed int32 token bitmasks to rows of logits, in place.

Bit ``b`` of word ``w`` allows token ``32*w + b``; tokens past ``32*W`` are disallowed. Only the
disallowed logits are written (with -inf), so allowed rows cost one read of the mask.
Semantics match ``runtime.kernels.reference.apply_token_bitmask_``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["apply_token_bitmask_"]


@triton.jit
def _bitmask_kernel(
    Logits,
    Bitmask,
    RowIndices,
    vocab,
    words,
    stride_lr,
    stride_br,
    HAS_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    blk = tl.program_id(1)
    if HAS_ROWS:
        row = tl.load(RowIndices + i).to(tl.int64)
    else:
        row = i.to(tl.int64)
    tokens = blk * BLOCK + tl.arange(0, BLOCK)
    in_vocab = tokens < vocab
    word_idx = tokens // 32
    # a token past the last word reads word 0 -> bit 0 -> disallowed
    word = tl.load(
        Bitmask + i.to(tl.int64) * stride_br + word_idx,
        mask=in_vocab & (word_idx < words),
        other=0,
    )
    allowed = ((word >> (tokens % 32)) & 1) != 0
    tl.store(Logits + row * stride_lr + tokens, float("-inf"), mask=in_vocab & ~allowed)


def apply_token_bitmask_(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    row_indices: torch.Tensor | None = None,
    *,
    block: int = 1024,
) -> torch.Tensor:
    """See ``reference.apply_token_bitmask_``; returns ``logits``."""
    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError("logits must be [B, V] and bitmask [R, W]")
    if logits.stride(1) != 1:
        raise ValueError("logits rows must be contiguous")
    bitmask = bitmask.to(device=logits.device, dtype=torch.int32).contiguous()
    rows = bitmask.shape[0] if row_indices is None else row_indices.numel()
    if rows == 0 or logits.shape[1] == 0:
        return logits
    if row_indices is None:
        if rows > logits.shape[0]:
            raise ValueError(f"bitmask has {rows} rows but logits only {logits.shape[0]}")
        row_arg = bitmask  # unused when HAS_ROWS is False
    else:
        row_arg = row_indices.to(device=logits.device, dtype=torch.int32).contiguous()
    vocab = logits.shape[1]
    grid = (rows, triton.cdiv(vocab, block))
    _bitmask_kernel[grid](
        logits, bitmask, row_arg, vocab, bitmask.shape[1], logits.stride(0), bitmask.stride(0),
        HAS_ROWS=row_indices is not None, BLOCK=block,
    )  # fmt: skip
    return logits
