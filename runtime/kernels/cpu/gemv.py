"""One-row projections on CPU (batch-1 decode, the LM head of one row): a matrix-vector product
in C (`csrc/gemv.c`, built into fused.py's library) over weights packed once at load time, and
its Python side. It takes
up to MAX_ROWS rows (each row's result the same as alone); the engine gives it one
(layers.GEMV_ROWS says why).

A decode step of one request reads every weight once and does little else, so its speed is
the rate at which the weights stream from memory. oneDNN's matmul for one row reads its
blocked layout at ~20-28 GB/s on one core of this machine and splits poorly over two (a
whole SmolLM2 step's projections: bf16 ~11 ms with two threads, the same as one). This kernel
reads each weight as one sequential stream and splits the output rows over torch's number of
threads, on a spinning pool of its own (csrc/pool.h; not OpenMP, whose regions opened from
the engine's scheduler thread cost ~35 us each). Measured side by side, the same 121
projections in bf16 take ~12 ms on one thread (oneDNN ~17) and ~8 ms on two (oneDNN ~11).

Several rows: each block of 16 weight rows is applied to 4 input rows at a time (16
accumulators; one weight load serves 4 rows), each row's sums in the order of one row alone, so
its bits do not depend on the batch. A step's projections, one thread, bf16: 4 rows 6.8 ms
(oneDNN 16.9), 16 rows 16.4 ms (oneDNN 21.9); fp32 16 rows 30 against 64 ms.

Layout: the rows in blocks of 16. bf16: [out / 16, in / 2, 16, 2], so one 64-byte load holds
two consecutive inputs of 16 rows and one `vdpbf16ps` (AVX-512 BF16) adds both products into
16 row accumulators, with no cross-lane sums. float32: [out / 16, in, 16]. Each row's sum runs
over four interleaved partial sums (inputs k mod 4), float32, then bf16 is rounded to nearest
even as torch rounds: a different order than oneDNN's, so results differ at rounding level
(bf16 outputs measured equal in >99.9% of elements; fp32 within 1e-4 of a float64 product).
Without AVX-512 BF16 the bf16 kernel converts to float32 and multiplies there (same sums).

`pack_all` puts a model's packed weights in one anonymous mapping advised for transparent huge
pages (where the kernel allows it): a step streams ~270 MB, and 2 MB pages spare it ~65,000
TLB misses (measured ~5% faster on one thread here).
"""

from __future__ import annotations

import mmap
from pathlib import Path

import torch

BLOCK = 16  # rows per block
MAX_ROWS = 16  # inputs of at most this many rows take the kernel (more: oneDNN's matmul)

SOURCE = Path(__file__).parent / "csrc" / "gemv.c"  # fused.py builds it into its library


def packable(w: torch.Tensor) -> bool:
    """Whether `w` [out, in] takes the packed layout: rows a multiple of 16, an even input."""
    return w.dim() == 2 and w.shape[0] % BLOCK == 0 and w.shape[1] % 2 == 0 and w.numel() > 0


def pack(w: torch.Tensor) -> torch.Tensor:
    """`w` [out, in] in the kernel's layout (see the module docstring), a new tensor."""
    out, n = w.shape
    if w.dtype == torch.bfloat16:
        return w.reshape(out // BLOCK, BLOCK, n // 2, 2).permute(0, 2, 1, 3).contiguous()
    return w.reshape(out // BLOCK, BLOCK, n).permute(0, 2, 1).contiguous()


def pack_all(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """`pack` of each weight, all of one dtype, in one mapping advised for huge pages (plain
    tensors where mmap cannot do that); each copy starts 64-byte aligned."""
    if len({w.dtype for w in weights}) != 1:
        return [pack(w) for w in weights]
    dtype, size = weights[0].dtype, weights[0].element_size()
    align = 64 // size
    offsets, total = [], 0
    for w in weights:
        offsets.append(total)
        total += -(-w.numel() // align) * align
    try:
        arena = mmap.mmap(-1, total * size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        arena.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError, ValueError):  # no madvise / huge pages here
        return [pack(w) for w in weights]
    flat = torch.frombuffer(arena, dtype=dtype)  # holds the mapping alive
    out = []
    for w, at in zip(weights, offsets, strict=True):
        p = pack(w)
        dst = flat[at : at + p.numel()].view(p.shape)
        dst.copy_(p)
        out.append(dst)
    return out
