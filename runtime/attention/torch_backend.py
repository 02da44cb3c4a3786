"""`torch`: the reference kernels (runtime/kernels/reference.py), one call per layer, nothing
planned ahead. The oracle the other backends are compared with; it implements every
`LayerSpec` feature (sliding windows and logit soft-capping, through `general_attention`
below, which the `cpu` backend uses for them too)."""

from __future__ import annotations

import torch

from runtime.attention.base import AttentionBackend, LayerSpec
from runtime.kernels import reference


def _gather(pool: torch.Tensor, page_row: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Positions start .. end - 1 [end - start, H, D] of one request through its page-table
    row (pages wholly before `start` are not read)."""
    ps = pool.shape[1]
    j = torch.arange(start, end, device=pool.device)
    slots = page_row[j // ps].long() * ps + j % ps
    return pool.view(-1, *pool.shape[2:]).index_select(0, slots)


def general_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: list[int],
    extend_lens: list[int],
    spec: LayerSpec,
    value_dim: int | None = None,
) -> torch.Tensor:
    """Causal paged attention with every `LayerSpec` feature, one request at a time, in
    float32: q [T, Hq, D] (chunks concatenated; a decode row is a chunk of one whose prefix is
    its length minus one). Query at position p sees keys max(0, p - window + 1) .. p; scores
    are `soft_cap * tanh(s / soft_cap)` when capped. `value_dim`: the values are the first
    `value_dim` dims of v (MLA latents); returns [T, Hq, value_dim or D]."""
    hq, hkv = q.shape[1], k_pool.shape[2]
    group = hq // hkv
    dv = value_dim or v_pool.shape[3]
    out = q.new_zeros(q.shape[0], hq, dv)
    start = 0
    for b, (prefix, n) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        if n == 0:
            continue
        total = prefix + n
        lo = 0 if spec.window is None else max(0, prefix - spec.window + 1)  # first key seen
        k = _gather(k_pool, page_table[b], lo, total).float().repeat_interleave(group, dim=1)
        v = _gather(v_pool, page_table[b], lo, total)[..., :dv].float()
        v = v.repeat_interleave(group, dim=1)
        qs = q[start : start + n].float().transpose(0, 1)  # [Hq, n, D]
        scores = (qs @ k.permute(1, 2, 0)) * spec.scale  # [Hq, n, L]
        if spec.soft_cap is not None:
            scores = torch.tanh(scores / spec.soft_cap) * spec.soft_cap
        pos = torch.arange(prefix, total, device=q.device)[:, None]
        keys = torch.arange(lo, total, device=q.device)[None, :]
        visible = keys <= pos
        if spec.window is not None:
            visible &= keys > pos - spec.window
        scores = scores.masked_fill(~visible, -torch.inf)
        probs = scores.softmax(-1)
        out[start : start + n] = (probs @ v.transpose(0, 1)).transpose(0, 1).to(out.dtype)
        start += n
    return out


class TorchBackend(AttentionBackend):
    """Reference kernels; every feature; slow on long batches (no per-step planning)."""

    name = "torch"

    def _decode_rows(self) -> tuple[list[int], list[int]]:
        lens = self.batch.decode_seq_lens.tolist()
        return [n - 1 for n in lens], [1] * len(lens)

    def decode(self, layer: int, q: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        b, k, v = self.batch, self.pool.k[layer], self.pool.v[layer]
        if not spec.plain:  # a window layer's pages may be the window pages: mapped tables
            table = self.tables(layer).decode_page_table
            return general_attention(q, k, v, table, *self._decode_rows(), spec)
        return reference.paged_decode_attention(
            q, k, v, b.decode_page_table, b.decode_seq_lens, spec.scale
        )

    def extend(self, layer: int, q: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        b, k, v = self.batch, self.pool.k[layer], self.pool.v[layer]
        if not spec.plain:
            return general_attention(
                q, k, v, self.tables(layer).extend_page_table, b.extend_prefix_lens.tolist(),
                b.extend_lens.tolist(), spec,
            )  # fmt: skip
        return reference.paged_extend_attention(
            q, k, v, b.extend_page_table, b.extend_prefix_lens, b.extend_lens, spec.scale
        )

    def latent_decode(
        self, layer: int, q: torch.Tensor, spec: LayerSpec, rank: int
    ) -> torch.Tensor:
        b, latent = self.batch, self.pool.latent[layer]
        if not spec.plain:
            return general_attention(
                q, latent, latent, b.decode_page_table, *self._decode_rows(), spec, rank
            )
        return reference.paged_latent_decode_attention(
            q, latent, b.decode_page_table, b.decode_seq_lens, spec.scale, rank
        )

    def latent_extend(
        self, layer: int, q: torch.Tensor, spec: LayerSpec, rank: int
    ) -> torch.Tensor:
        b, latent = self.batch, self.pool.latent[layer]
        if not spec.plain:
            return general_attention(
                q, latent, latent, b.extend_page_table, b.extend_prefix_lens.tolist(),
                b.extend_lens.tolist(), spec, rank,
            )  # fmt: skip
        # the latent is both key (all R + Dr dims) and value (its first R dims)
        out = reference.paged_extend_attention(
            q, latent, latent, b.extend_page_table, b.extend_prefix_lens, b.extend_lens,
            spec.scale,
        )  # fmt: skip
        return out[..., :rank]

    def apply_token_bitmask_(
        self, logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        return reference.apply_token_bitmask_(logits, bitmask, rows)
