"""`triton`: the Triton kernels (`kernels/triton/attention.py`, `mla.py`,
`bitmask.py`) for paged decode and extend, latent decode, and the logit bitmask. On a
GPU they read pages in place; on CPU they run under `TRITON_INTERPRET=1` (set before triton is
first imported), which is how the tests run a whole model through them. MLA extend uses the
paged extend kernel with the latent as both key and value. Sliding windows and soft-capping
are not implemented here: refused with UnsupportedAttentionError (the `torch` and `cpu`
backends have them).
"""

from __future__ import annotations

from types import ModuleType

import torch

from runtime.attention.base import AttentionBackend, LayerSpec
from runtime.errors import UnsupportedAttentionError


def load_triton() -> tuple[ModuleType, ModuleType, ModuleType]:
    """(triton_attention, triton_mla, triton_bitmask), or UnsupportedAttentionError saying
    why triton cannot run here."""
    try:
        from runtime.kernels.triton import attention as triton_attention
        from runtime.kernels.triton import bitmask as triton_bitmask
        from runtime.kernels.triton import mla as triton_mla
    except Exception as exc:  # no triton, or triton without a usable backend
        raise UnsupportedAttentionError(
            f"attention backend 'triton' is unavailable: {type(exc).__name__}: {exc}"
        ) from exc
    return triton_attention, triton_mla, triton_bitmask


class TritonBackend(AttentionBackend):
    """Triton kernels, one launch per layer and kind (nothing planned on the host)."""

    name = "triton"

    def __init__(self) -> None:
        super().__init__()
        self._attention, self._mla, self._bitmask = load_triton()

    def decode(self, layer: int, q: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        self._require_plain(spec)
        b = self.batch
        return self._attention.paged_decode_attention(
            q, self.pool.k[layer], self.pool.v[layer], b.decode_page_table, b.decode_seq_lens,
            spec.scale,
        )  # fmt: skip

    def extend(self, layer: int, q: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        self._require_plain(spec)
        b = self.batch
        return self._attention.paged_extend_attention(
            q.contiguous(), self.pool.k[layer], self.pool.v[layer], b.extend_page_table,
            b.extend_prefix_lens, b.extend_lens, spec.scale,
        )  # fmt: skip

    def latent_decode(
        self, layer: int, q: torch.Tensor, spec: LayerSpec, rank: int
    ) -> torch.Tensor:
        self._require_plain(spec)
        b = self.batch
        return self._mla.paged_latent_decode_attention(
            q.contiguous(), self.pool.latent[layer], b.decode_page_table, b.decode_seq_lens,
            spec.scale, rank,
        )  # fmt: skip

    def latent_extend(
        self, layer: int, q: torch.Tensor, spec: LayerSpec, rank: int
    ) -> torch.Tensor:
        self._require_plain(spec)
        b, latent = self.batch, self.pool.latent[layer]
        out = self._attention.paged_extend_attention(
            q.contiguous(), latent, latent, b.extend_page_table, b.extend_prefix_lens,
            b.extend_lens, spec.scale,
        )  # fmt: skip
        return out[..., :rank]

    def apply_token_bitmask_(
        self, logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self._bitmask.apply_token_bitmask_(logits, bitmask, rows)
