"""Attention and logit-mask kernels, dispatched between Triton and a torch reference.

Triton runs when the tensors are on CUDA and ``triton`` imports; the torch reference runs
otherwise. ``SGL_KERNELS=triton`` or ``SGL_KERNELS=torch`` forces one (read at each call).
Forcing ``triton`` on CPU tensors needs ``TRITON_INTERPRET=1`` set before triton is imported;
that is how the kernel tests run without a GPU.

Signatures and semantics: see ``reference.py`` and docs/INTERFACES.md.

The folder holds three kinds of kernels: the torch implementations at its top (``reference``,
the oracle and the engine's plain CPU path, and the CPU attention paths built on torch:
``cascade``, ``short_extend``, ``prefix_extend``, ``decode_plan``), the Triton kernels in
``triton/``, and the C kernels for CPU in ``cpu/`` (their sources in ``cpu/csrc/``).
"""

from __future__ import annotations

import logging
from types import ModuleType

import torch

from runtime import settings
from runtime.kernels import reference

__all__ = [
    "apply_token_bitmask_",
    "kernel_backend",
    "paged_decode_attention",
    "paged_extend_attention",
    "paged_latent_decode_attention",
]

logger = logging.getLogger(__name__)

_ENV = settings.KERNELS.name
# (triton.attention, triton.bitmask, triton.mla) once imported
_triton_modules: tuple[ModuleType, ModuleType, ModuleType] | None = None
_triton_error: Exception | None = None


def _load_triton() -> tuple[ModuleType, ModuleType, ModuleType] | None:
    """Import the Triton kernels once; None (and the error kept) when triton is unusable."""
    global _triton_modules, _triton_error
    if _triton_modules is None and _triton_error is None:
        try:
            from runtime.kernels.triton import attention, bitmask, mla

            _triton_modules = (attention, bitmask, mla)
        except Exception as exc:  # ImportError, or triton failing to find a backend
            _triton_error = exc
            logger.info("Triton kernels unavailable, using the torch reference: %s", exc)
    return _triton_modules


def kernel_backend(t: torch.Tensor) -> str:
    """``"triton"`` or ``"torch"``: which path a call with tensors like ``t`` takes."""
    forced = settings.KERNELS.get()  # a SettingError (a ValueError) for another word
    if forced == "torch":
        return "torch"
    if forced == "triton":
        if _load_triton() is None:
            raise RuntimeError(f"{_ENV}=triton but the Triton kernels failed to import") from (
                _triton_error
            )
        return "triton"
    if t.is_cuda and _load_triton() is not None:
        return "triton"
    return "torch"


def paged_decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, Hq, D] against each request's cached K/V; see reference.paged_decode_attention."""
    if kernel_backend(q) == "triton":
        attention = _triton_modules[0]
        return attention.paged_decode_attention(q, k_pool, v_pool, page_table, seq_lens, scale)
    return reference.paged_decode_attention(q, k_pool, v_pool, page_table, seq_lens, scale)


def paged_extend_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [T, Hq, D], new chunks against cached prefixes; see reference.paged_extend_attention."""
    args = (q, k_pool, v_pool, page_table, prefix_lens, extend_lens, scale)
    if kernel_backend(q) == "triton":
        return _triton_modules[0].paged_extend_attention(*args)
    return reference.paged_extend_attention(*args)


def paged_latent_decode_attention(
    q: torch.Tensor,
    latent_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    rank: int,
) -> torch.Tensor:
    """MLA decode, q [B, H, R + Dr] against one shared latent per token [.., 1, R + Dr];
    returns [B, H, R]. See reference.paged_latent_decode_attention."""
    args = (q, latent_pool, page_table, seq_lens, scale, rank)
    if kernel_backend(q) == "triton":
        return _triton_modules[2].paged_latent_decode_attention(*args)
    return reference.paged_latent_decode_attention(*args)


def apply_token_bitmask_(
    logits: torch.Tensor, bitmask: torch.Tensor, row_indices: torch.Tensor | None = None
) -> torch.Tensor:
    """Mask logits [B, V] in place with packed int32 bitmask [R, W]; returns ``logits``."""
    if kernel_backend(logits) == "triton":
        return _triton_modules[1].apply_token_bitmask_(logits, bitmask, row_indices)
    return reference.apply_token_bitmask_(logits, bitmask, row_indices)
