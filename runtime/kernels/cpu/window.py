"""Paged attention with a sliding window and / or a logit soft cap, in C (csrc/window_attention.h,
built with -ffast-math like fused.py's decode attention).

What the planned CPU paths do not take: a sliding-window layer once a sequence outgrows its
window (Gemma 3's local layers past 512 tokens: every few-shot question behind a long prefix),
and soft-capped scores. The torch reference (`torch_backend.general_attention`) gathers each
request's keys, repeats them per query head and runs the softmax op by op; this reads each key
row of a query's range once, for a block of query rows of one chunk and all the query heads of
one kv head, and reads no page before a query's window (window pages given back may be stale).

Same numbers as the reference up to float32 summation order and `expf` / `tanhf` (greedy tokens
unchanged). Pools of the model's type (float32, bfloat16) only; an fp8 pool, or no C compiler:
`attention` returns None and callers keep the reference.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
from pathlib import Path

import torch

from grammar.native_build import Signatures, Unit, load_library
from runtime.kernels.cpu import quant

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "window_attention.c"
_FLAGS = ("-O3", "-march=native", "-fPIC", "-std=c11", "-ffast-math")
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_ARGS = [_PTR] * 4 + [_I64] + [_PTR] * 2 + [_I64] * 6 + [_F32, _I64, _F32, _PTR, _PTR]
SIGNATURES: Signatures = {
    f"window_attention_{suffix}": (ctypes.c_int, _ARGS) for suffix in _SUFFIX.values()
}

_lib: ctypes.CDLL | None = None
_failed = False


def units(openmp: bool = True) -> list[Unit]:
    """The library's one unit (OpenMP: split over threads where no pool runner is given)."""
    return [Unit("window", SOURCE, (*_FLAGS, *(("-fopenmp",) if openmp else ())))]


def _load() -> ctypes.CDLL | None:
    global _lib, _failed
    if _lib is not None or _failed:
        return _lib
    for openmp in (True, False):
        try:
            omp = ("-fopenmp",) if openmp else ()
            name = "window-omp" if openmp else "window"
            _lib = load_library(name, units(openmp), (*omp, "-lm"), SIGNATURES)
            return _lib
        except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
            logger.info("window attention kernel%s unavailable: %s",
                        " (OpenMP)" if openmp else "", exc)  # fmt: skip
    _failed = True
    return None


def available(dtype: torch.dtype) -> bool:
    """Whether `attention` runs for a model (and pool) of `dtype`."""
    return dtype in _SUFFIX and _load() is not None


def attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    soft_cap: float | None = None,
) -> torch.Tensor | None:
    """Causal paged attention of the chunks q [T, Hq, D] (chunk b: `extend_lens[b]` rows behind
    `prefix_lens[b]` cached tokens, int32 [B]; a decode row is a chunk of one) against pools
    [pages, page_size, Hkv, D] of q's dtype through `page_table` int32 [B, max_pages]: the
    query at position p sees keys max(0, p - window + 1) .. p (all up to p without a window),
    scores `soft_cap * tanh(s / soft_cap)` when capped. None where the kernel does not take it
    (another pool type, no compiler): the caller runs the reference."""
    t, hq, d = q.shape
    hkv = k_pool.shape[2]
    if q.dtype not in _SUFFIX or k_pool.dtype != q.dtype or v_pool.dtype != q.dtype:
        return None
    if v_pool.shape[3] != d or k_pool.shape[3] != d or hq % hkv:
        return None
    lib = _load()
    if lib is None:
        return None
    assert k_pool.is_contiguous() and v_pool.is_contiguous()
    assert page_table.dtype == torch.int32 and page_table.stride(1) == 1
    assert prefix_lens.dtype == extend_lens.dtype == torch.int32
    assert prefix_lens.is_contiguous() and extend_lens.is_contiguous()
    q = q.contiguous()
    out = torch.empty_like(q)
    if t == 0:
        return out
    rc = getattr(lib, f"window_attention_{_SUFFIX[q.dtype]}")(
        q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), page_table.data_ptr(),
        page_table.stride(0), prefix_lens.data_ptr(), extend_lens.data_ptr(),
        prefix_lens.shape[0], hq, hkv, d, k_pool.shape[1], k_pool.shape[0], scale,
        window or 0, soft_cap or 0.0, quant.pool_runner(), out.data_ptr(),
    )  # fmt: skip
    if rc:
        raise MemoryError("window attention: out of memory for its score buffers")
    return out
