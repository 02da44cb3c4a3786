"""The attention backend interface: what a model calls for every attention layer.

A backend owns the per-step planning and the kernels that read and write the paged KV pool.
A model never indexes `pool.k` / `pool.v` / `pool.latent` and never imports a kernel module: it
projects q / k / v, then hands them to its engine's backend.

One step, as the model drives it:

    backend.plan(batch, pool)                   # once per forward pass, before layer 0
    for each layer li (the index into this rank's pool):
        q = backend.rope_store(li, qkv, rotary, num_heads)   # or rotate itself + store_kv
        out = backend.attend(li, q, spec)       # decode rows, then extend rows
      (or, for a decode-only step on one C call of every layer: backend.chain_attention(...)
       hands the decode chain the attention steps it runs between its products)
      (MLA: backend.store_latent(li, entry); backend.latent_attend(li, q, spec, rank))

Invariants every backend keeps:

- `plan` is the only place that reads the batch's page tables and lengths on the host; the
  per-layer calls reuse what it prepared and give the same numbers in every layer.
- A layer's new K/V (or latents) are written into the step's `batch.out_slots` before that
  layer's attention reads the pages, so every query sees its own token.
- Rows come out in the batch's order: the `num_decode` decode tokens first, then each extend
  chunk; decode and extend results of `attend` are those of `decode` and `extend` concatenated.
- Softmax runs in float32; outputs have q's dtype. Greedy tokens of one model agree across
  backends (the tests compare them).
- Only the backend converts between the pool's storage type and the compute type, so a KV
  dtype other than the model's (fp8 with per-layer scales and per-channel offsets) is a change
  to the backend and the pool alone. Writes go through `pool.write` (subtract the offset,
  divide by the scale, convert); reads convert the stored values to float inside the kernels,
  and scales and offsets are folded into the attention: scores use `spec.scale * k_scale`;
  the key offset needs nothing, since q . (k - m) differs from q . k by q . m, the same for
  every key of a query, which the softmax cancels; the output is multiplied by `v_scale` and
  the value offset added (the probabilities sum to 1). `attend` and `latent_attend` do it for
  every backend, so no dequantized copy of the pool is ever made. (Logit soft-capping is not
  shift-invariant: calibration gives such models no key offset, kv_calibration.py.)
- Backends refuse a `LayerSpec` feature they do not implement with
  `UnsupportedAttentionError` naming it; they never ignore one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from runtime.errors import UnsupportedAttentionError

if TYPE_CHECKING:
    from runtime.attention.forward_batch import ForwardBatch
    from runtime.memory.kv_pool import KVPool


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """How one layer attends. `scale`: the softmax scale applied to q . k. `window`: attend only
    to the last `window` positions (the query's own included), None for all (a sliding-window
    layer sets it; layers of one model may differ). `soft_cap`: scores become
    `soft_cap * tanh(scores / soft_cap)` before the softmax (Gemma-style), None for none."""

    scale: float
    window: int | None = None
    soft_cap: float | None = None

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1 or None, got {self.window}")
        if self.soft_cap is not None and not self.soft_cap > 0:
            raise ValueError(f"soft_cap must be > 0 or None, got {self.soft_cap}")

    @property
    def plain(self) -> bool:
        """Full causal attention with no logit transform."""
        return self.window is None and self.soft_cap is None


@dataclass(frozen=True, slots=True)
class WindowTables:
    """A step's write slots and page tables as one layer addresses its pages."""

    out_slots: torch.Tensor
    decode_page_table: torch.Tensor
    extend_page_table: torch.Tensor


class Rotary(Protocol):
    """What `rope_store` needs of a model's rotary embedding (models/rope.RotaryEmbedding)."""

    dim: int  # rotated dimensions per head

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor: ...


class AttentionBackend:
    """Base of the backends. Subclasses set `name` and implement `_plan`, `decode`, `extend`,
    `latent_decode`, `latent_extend`; the K/V writes and the rotary path here are plain torch
    ops any backend may keep."""

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self.batch: ForwardBatch | None = None
        self.pool: KVPool | None = None
        # this step's cos, sin rows by rotary embedding (id; Gemma's local and global tables)
        self._rope: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._window: WindowTables | None = None  # the window layers' slots and tables

    # ---- once per step -----------------------------------------------------------------------
    def plan(self, batch: ForwardBatch, pool: KVPool) -> None:
        """Prepare this step's reads for every layer (page gathers, groupings, masks)."""
        self.batch, self.pool = batch, pool
        self._rope = {}
        self._window = None
        if pool.windows is not None:
            self._window = self._window_tables(batch, pool)
        self._plan(batch, pool)

    @staticmethod
    def _window_tables(batch: ForwardBatch, pool: KVPool) -> WindowTables:
        """The step's slots and page tables through the pool's page -> window slot map, for
        the layers that keep their KV in the window pages (memory/windows.py)."""
        wmap, ps = pool.windows.map, pool.page_size

        def mapped(table: torch.Tensor) -> torch.Tensor:
            # entries past a request's pages may be stale or -1: never read, clamped here
            return wmap[table.long().clamp(0, wmap.shape[0] - 1)]

        slots = batch.out_slots
        return WindowTables(
            wmap[slots // ps] * ps + slots % ps,
            mapped(batch.decode_page_table),
            mapped(batch.extend_page_table),
        )

    def tables(self, layer: int) -> WindowTables:
        """Where `layer` writes and reads this step: the batch's own slots and page tables, or
        for a layer kept in the window pages, the same mapped to window slots."""
        if self._window is not None and self.pool.window_layer[layer]:
            return self._window
        b = self.batch
        return WindowTables(b.out_slots, b.decode_page_table, b.extend_page_table)

    def _plan(self, batch: ForwardBatch, pool: KVPool) -> None:
        """Backend-specific planning (none by default)."""

    # ---- K/V writes --------------------------------------------------------------------------
    def store_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the step's new keys and values k, v [T, Hkv, D] (k already rotated) into
        `layer`'s pages at `batch.out_slots`."""
        pool, slots = self.pool, self.tables(layer).out_slots
        pool.write("k", layer, slots, k)
        pool.write("v", layer, slots, v)

    def rope_store(
        self, layer: int, qkv: torch.Tensor, rotary: Rotary, num_heads: int
    ) -> torch.Tensor:
        """From the fused projection qkv [T, (Hq + 2 Hkv) D] (q, then k, then v heads): rotate
        q and k at `batch.positions`, store k and v as `store_kv` does; returns q [T, Hq, D]."""
        k_pool = self.pool.k[layer]
        hkv, d = k_pool.shape[2], k_pool.shape[3]
        t, q_size = qkv.shape[0], num_heads * d
        rows = self._rope.get(id(rotary))
        if rows is None:
            rows = self._rope[id(rotary)] = rotary.cos_sin(self.batch.positions)
        cos, sin = rows
        # q and k sit side by side in the projection: rotated as one [T, Hq + Hkv, D] block
        qk = rotary.rotate(qkv[:, : q_size + hkv * d].view(t, -1, d), cos, sin)
        v = qkv[:, q_size + hkv * d :].view(t, hkv, d)
        self.store_kv(layer, qk[:, num_heads:], v)
        return qk[:, :num_heads]

    def rope_attend(
        self, layer: int, qkv: torch.Tensor, rotary: Rotary, num_heads: int, spec: LayerSpec
    ) -> torch.Tensor:
        """`attend(layer, rope_store(layer, qkv, rotary, num_heads), spec)` (a backend may do
        both in one pass)."""
        return self.attend(layer, self.rope_store(layer, qkv, rotary, num_heads), spec)

    def chain_attention(
        self, full: Rotary, layers: Sequence[tuple[Rotary, int | None, float | None]],
        num_heads: int, dtype: torch.dtype,
    ) -> tuple[Any, list[Any] | None] | None:
        """Whether this backend serves the attention of a one-call decode chain
        (kernels/cpu/quant_chain.py) this step, and what the chain needs for it: (the fused
        rotary + K/V write + attention step of a layer on `full`'s tables and the step's page
        table, per layer its own step or None for that shared one; None when every layer takes
        the shared one), or None where the backend does not serve it (this step: then the model
        runs its layers one by one). `layers`: each layer's (rotary, window, soft cap). None
        here: the chain's attention is a CPU backend's."""
        return None

    def store_latent(self, layer: int, entry: torch.Tensor) -> None:
        """MLA: write the new tokens' latents entry [T, R + Dr] at `batch.out_slots`."""
        self.pool.write("latent", layer, self.batch.out_slots, entry[:, None])

    def latent_cache(self, layer: int, dtype: torch.dtype) -> torch.Tensor:
        """MLA: `layer`'s latent pages [pages, page_size, 1, R + Dr] readable in `dtype` (for
        paths that expand the latents themselves, such as MLA's decompressed check; a copy,
        scaled back, when the pool stores another type)."""
        latent = self.pool.latent[layer]
        if latent.dtype == dtype:
            return latent
        s, offset = self.pool.scale("latent", layer), self.pool.offset("latent", layer)
        if s == 1.0 and offset is None:
            return latent.to(dtype)
        values = latent.float() * s
        return (values if offset is None else values.add_(offset)).to(dtype)

    # ---- attention ---------------------------------------------------------------------------
    def attend(self, layer: int, q: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        """Every token of the step: q [T, Hq, D] -> [T, Hq, D] (decode rows, then extend)."""
        k_scale, v_scale = self.pool.scale("k", layer), self.pool.scale("v", layer)
        if k_scale != 1.0:
            spec = replace(spec, scale=spec.scale * k_scale)
        nd, t = self.batch.num_decode, q.shape[0]
        parts = []
        if nd:
            parts.append(self.decode(layer, q[:nd], spec))
        if t > nd:
            parts.append(self.extend(layer, q[nd:], spec))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self._value_epilogue(out, v_scale, self.pool.offset("v", layer))

    @staticmethod
    def _value_epilogue(
        out: torch.Tensor, v_scale: float, offset: torch.Tensor | None
    ) -> torch.Tensor:
        """`out` [T, Hq, Dv] times the value scale, plus the value offset [Hkv, >= Dv] of each
        query head's KV head (in place)."""
        if v_scale != 1.0:
            out.mul_(v_scale)
        if offset is not None:
            t, hq, dv = out.shape
            hkv = offset.shape[0]
            out.view(t, hkv, hq // hkv, dv).add_(offset[:, None, :dv].to(out.dtype))
        return out

    def decode(self, layer: int, q: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        """The decode rows q [num_decode, Hq, D], each against its request's cached sequence
        (its own new token included)."""
        raise NotImplementedError

    def extend(self, layer: int, q: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        """The extend chunks q [sum(extend_lens), Hq, D]: each against its cached prefix and,
        causally, its own chunk."""
        raise NotImplementedError

    def latent_attend(
        self, layer: int, q: torch.Tensor, spec: LayerSpec, rank: int
    ) -> torch.Tensor:
        """MLA, absorbed: q [T, H, R + Dr] against the shared latents (key: all R + Dr values,
        value: the first R = `rank`); returns [T, H, R], decode rows then extend rows."""
        s = self.pool.scale("latent", layer)  # the latent is key and value: one scale for both
        if s != 1.0:
            spec = replace(spec, scale=spec.scale * s)
        nd, t = self.batch.num_decode, q.shape[0]
        parts = []
        if nd:
            parts.append(self.latent_decode(layer, q[:nd], spec, rank))
        if t > nd:
            parts.append(self.latent_extend(layer, q[nd:], spec, rank))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self._value_epilogue(out, s, self.pool.offset("latent", layer))

    def latent_decode(
        self, layer: int, q: torch.Tensor, spec: LayerSpec, rank: int
    ) -> torch.Tensor:
        raise NotImplementedError

    def latent_extend(
        self, layer: int, q: torch.Tensor, spec: LayerSpec, rank: int
    ) -> torch.Tensor:
        raise NotImplementedError

    # ---- sampling ----------------------------------------------------------------------------
    def apply_token_bitmask_(
        self, logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Set the logits a packed int32 bitmask [R, W] disallows to -inf, in place (row i of
        the mask applies to logits row rows[i]); returns `logits`."""
        raise NotImplementedError

    # ---- shared checks -----------------------------------------------------------------------
    def _require_plain(self, spec: LayerSpec) -> None:
        """Refuse what this backend's kernels do not implement, naming it."""
        if spec.window is not None:
            raise UnsupportedAttentionError(
                f"attention backend {self.name!r} has no sliding window (window={spec.window})"
            )
        if spec.soft_cap is not None:
            raise UnsupportedAttentionError(
                f"attention backend {self.name!r} has no logit soft-capping "
                f"(soft_cap={spec.soft_cap})"
            )
