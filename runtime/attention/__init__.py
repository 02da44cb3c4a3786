"""Attention backends: one interface (`base.AttentionBackend`: `plan(batch, pool)` once per
step, then per layer `rope_store` / `store_kv` / `attend` and MLA's latent variants) and its
implementations, chosen per engine (`registry.make_backend`): `torch` (reference kernels),
`cpu` (the planned fast CPU paths), `triton` (the GPU kernels; interpreted on CPU)."""

from runtime.attention.base import AttentionBackend, LayerSpec
from runtime.attention.registry import CHOICES, make_backend, resolve_backend

__all__ = ["CHOICES", "AttentionBackend", "LayerSpec", "make_backend", "resolve_backend"]
