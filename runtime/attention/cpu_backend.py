"""`cpu`: the engine's fast CPU paths, chosen once per step in `plan`.

Decode: requests sharing a long prefix go through cascade attention (the shared pages read
once per group, `kernels/cascade.py`); otherwise the fused C kernel (`kernels/cpu_fused.py`)
where it is built for the pool's dtype, else the reference gathers planned once for all layers
(`kernels/decode_plan.py`). Extend: groups of requests sharing prefix pages go through the
split-prefix path (`kernels/prefix_extend.py`); else many short chunks share one padded call
(`kernels/short_extend.py`); else the split-prefix path per request; else the reference.
`rope_store` rotates q / k and writes K / V in one fused C pass when it can. A quantized
model's one-call decode chain (kernels/cpu/quant_chain.py) runs its attention through this
backend's fused decode steps, which `chain_attention` hands it. A sliding-window
layer whose window no sequence of the step outgrows (every query sees all its keys) is full
causal attention and takes the planned paths too (`_as_plain`; a layer kept in the window pages:
the fused decode kernel on the mapped page tables, its extend the general path).

A decode-only step's `rope_attend` runs every layer on the fused C call with the layer's own
rotary tables, pages, window and soft cap (`_own_step`, the decode chain's steps too).
Otherwise sliding windows a sequence outgrows and soft-capped scores go through the C window
kernel (`kernels/cpu/window.py`: each query's window read once per block of query rows, no page
before it touched), decode rows and extend chunks alike. Every path gives the reference's
numbers up to float rounding (greedy tokens unchanged). MLA latents, and windows or caps over
an fp8 pool (or with `fused=False`), take the torch backend's paths (reference kernels,
`torch_backend.general_attention`): correct, not planned. docs/engine.md says why: the planned
kernels take equal-width K / V pools, read from position 0 through the global page table, and
have no tanh cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from runtime.attention.base import LayerSpec, Rotary
from runtime.attention.torch_backend import TorchBackend
from runtime.kernels.cascade import CascadePlan, cascade_decode_attention, plan_cascade
from runtime.kernels.cpu import fused as cpu_fused
from runtime.kernels.cpu import window as cpu_window
from runtime.kernels.decode_plan import DecodePlan, plan_decode, planned_decode_attention
from runtime.kernels.prefix_extend import (
    PrefixExtendPlan,
    plan_prefix_extend,
    prefix_extend_attention,
)
from runtime.kernels.prefix_extend import enabled as prefix_extend_enabled
from runtime.kernels.short_extend import (
    ShortExtendPlan,
    plan_short_extend,
    short_extend_attention,
)

if TYPE_CHECKING:
    from runtime.attention.forward_batch import ForwardBatch
    from runtime.memory.kv_pool import KVPool


class CPUBackend(TorchBackend):
    """Planned CPU paths; the plan objects below hold for every layer of one step. Windows and
    soft caps: the C window kernel; what it does not take (MLA latents, an fp8 pool's windows)
    runs as in the torch backend."""

    name = "cpu"

    def __init__(self, fused: bool | None = None) -> None:
        """`fused=False`: torch ops instead of the C kernels (to compare them); None: the C
        kernels wherever they are built for the pool's dtype (float32, bf16, fp8 under a
        float32 / bf16 model)."""
        super().__init__()
        self.cascade: CascadePlan | None = None
        self.fused_decode: cpu_fused.DecodeRows | None = None
        self.decode_plan: DecodePlan | None = None
        self.split: PrefixExtendPlan | None = None
        self.short: ShortExtendPlan | None = None
        self._fused = fused  # the C kernels exist for the pool's dtype
        self._extend_planned = False
        # per step, by the id of the rotary embedding (a model may have several: Gemma's local
        # and global tables): a decode-only step's rotary + attention in one C call a layer
        # (False: not this step), the whole cos / sin tables
        self._rope_decode: dict[int, cpu_fused.RopeDecode | bool] = {}
        self._tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # a layer's own fused decode step: by (rotary id, window pages?, window)
        self._steps: dict[tuple, cpu_fused.RopeDecode] = {}

    def _plan(self, batch: ForwardBatch, pool: KVPool) -> None:
        if self._fused is None:
            self._fused = cpu_fused.available(pool.dtype) and pool.device.type == "cpu"
        nd = batch.num_decode
        self.cascade = self.fused_decode = self.decode_plan = None
        self.split = self.short = None
        if nd > 1:
            cascade = plan_cascade(batch.decode_page_table, batch.decode_seq_lens, pool.page_size)
            self.cascade = cascade if cascade.useful else None
        if nd and self.cascade is None and pool.k:
            if self._fused:
                self.fused_decode = cpu_fused.DecodeRows.of(
                    batch.decode_page_table, batch.decode_seq_lens
                )
            else:
                self.decode_plan = plan_decode(
                    batch.decode_page_table, batch.decode_seq_lens, pool.page_size,
                    pool.num_pages,
                )  # fmt: skip
        self._extend_planned = False  # at the first layer's extend: it needs q's head count
        self._rope_decode, self._steps = {}, {}  # at a layer's rope_attend: it needs the rotary
        self._tables = {}
        self._reach: int | None = None  # the step's longest sequence, at the first window layer
        self._window_rows: cpu_fused.DecodeRows | None = None  # decode rows in window pages
        # (decode?, window pages?) -> int32 page table, prefix and new lengths (cpu_window)
        self._chunk_rows: dict[tuple[bool, bool], tuple[torch.Tensor, ...]] = {}

    def _plan_extend(self, group: int) -> None:
        """The extend paths for every layer of this step; `group`: query heads per KV head."""
        batch, pool = self.batch, self.pool
        self.split = self._plan_split(batch, pool, group, shared_only=True)
        if self.split is None:
            self.short = plan_short_extend(
                batch.extend_page_table, batch.extend_prefix_lens, batch.extend_lens,
                pool.page_size,
            )  # fmt: skip
        if self.split is None and self.short is None:
            self.split = self._plan_split(batch, pool, group)
        self._extend_planned = True

    @staticmethod
    def _plan_split(
        batch: ForwardBatch, pool: KVPool, group: int, shared_only: bool = False
    ) -> PrefixExtendPlan | None:
        if not prefix_extend_enabled():
            return None
        return plan_prefix_extend(
            batch.extend_page_table, batch.extend_prefix_lens, batch.extend_lens,
            pool.page_size, group, shared_only=shared_only,
        )  # fmt: skip

    def rope_store(
        self, layer: int, qkv: torch.Tensor, rotary: Rotary, num_heads: int
    ) -> torch.Tensor:
        pool = self.pool
        k_pool, v_pool = pool.k[layer], pool.v[layer]
        # the pool holds the model's type, or fp8 (written as pool.write writes it)
        same = qkv.dtype == k_pool.dtype or (
            pool.quantized and qkv.dtype in cpu_fused.MODEL_TYPES and k_pool.shape[3] <= 512
        )
        plain = self._fused and rotary.dim == k_pool.shape[3] and same
        if not plain or pool.window_layer[layer]:  # window pages: through store_kv
            return super().rope_store(layer, qkv, rotary, num_heads)
        # the kernel reads the tables at each token's position
        cos, sin = self._per_rotary(self._tables, rotary, rotary.tables)
        b = self.batch
        quant = None
        if pool.quantized:
            quant = (pool.offset("k", layer), pool.offset("v", layer),
                     pool.inverse_scales["k"][layer], pool.inverse_scales["v"][layer])  # fmt: skip
        return cpu_fused.rotary_kv(
            qkv, cos, sin, b.positions, b.out_slots, k_pool, v_pool, num_heads, quant
        )

    def rope_attend(
        self, layer: int, qkv: torch.Tensor, rotary: Rotary, num_heads: int, spec: LayerSpec
    ) -> torch.Tensor:
        """A decode-only step through the fused decode kernel: rotary, the K/V write and
        attention in one C call (cpu_fused.RopeDecode; a layer in the window pages, whose
        window a sequence outgrows or whose scores are soft-capped, its own step, as the decode
        chain's); else rope_store, then attend. Each rotary embedding keeps its own tables."""
        fused = self.decode_rope(rotary, num_heads, qkv.dtype)
        if fused is None or qkv.stride(1) != 1:
            return super().rope_attend(layer, qkv, rotary, num_heads, spec)
        plain = spec if spec.plain else self._as_plain(spec)
        window, cap = (0, 0.0) if plain.plain else (plain.window or 0, plain.soft_cap or 0.0)
        if window or cap or self.pool.window_layer[layer]:
            fused = self._own_step(layer, rotary, window, num_heads, qkv.dtype, cap)
        return fused(qkv, self.pool.k[layer], self.pool.v[layer], plain.scale)

    def _per_rotary(self, cache: dict, rotary: Rotary, make) -> tuple[torch.Tensor, torch.Tensor]:
        """`make(positions)` of this step for `rotary`, made once a step."""
        got = cache.get(id(rotary))
        if got is None:
            got = cache[id(rotary)] = make(self.batch.positions)
        return got

    def _own_step(
        self, li: int, rotary: Rotary, window: int, num_heads: int, dtype: torch.dtype,
        cap: float = 0.0,
    ) -> cpu_fused.RopeDecode:
        """Layer `li`'s fused decode step on its own tables, pages (the window pages' table
        and slots where it is kept there), window (0: none) and soft cap (0: none), one per
        distinct (rotary, pages, window, cap) a step."""
        b, pool = self.batch, self.pool
        key = (id(rotary), pool.window_layer[li], window, cap)
        step = self._steps.get(key)
        if step is None:
            where = self.tables(li)
            rows = cpu_fused.DecodeRows.of(where.decode_page_table, b.decode_seq_lens)
            cos, sin = self._per_rotary(self._tables, rotary, rotary.tables)
            step = self._steps[key] = cpu_fused.RopeDecode(
                cos, sin, b.positions, where.out_slots.to(torch.int64), rows, num_heads,
                pool.k[li], dtype, window=window, cap=cap,
            )  # fmt: skip
        return step

    def decode_rope(
        self, rotary: Rotary, num_heads: int, dtype: torch.dtype
    ) -> cpu_fused.RopeDecode | None:
        """This step's fused rotary + K/V write + attention of a plain layer (what rope_attend
        runs for a `dtype` projection), or None where the step is not decode-only or the
        fused kernels do not take it."""
        fused = self._rope_decode.get(id(rotary))
        if fused is None:
            fused = self._plan_rope_decode(dtype, rotary, num_heads) or False
            self._rope_decode[id(rotary)] = fused
        return fused or None

    def chain_attention(
        self, full: Rotary, layers: Sequence[tuple[Rotary, int | None, float | None]],
        num_heads: int, dtype: torch.dtype,
    ) -> tuple[cpu_fused.RopeDecode, list[cpu_fused.RopeDecode | None] | None] | None:
        """The decode chain's attention this step (AttentionBackend.chain_attention): the
        shared step is `decode_rope`'s; a layer whose rotary tables, pages (the window pages),
        window or soft cap differ gets its own step, one per distinct (rotary, pages, window,
        cap) (Gemma's local layers: their RoPE base, window pages, a window the C decode
        attention reads the last keys of). `layers`: each layer's (rotary, window, soft cap).
        None where `decode_rope` does not take the step. A pool of MLA latents (no K / V
        pools): no shared step, each layer the step's rows (`cpu_fused.StepRows`: `full`'s
        rotary tables, positions, slots, page table, lengths) for its attention hook; None for
        a step with extends or latents not of `dtype` (fp8)."""
        b, pool = self.batch, self.pool
        if not pool.k and pool.latent:  # MLA: the layers' hooks read the latent pages
            if not (b.num_decode == b.num_tokens and b.num_decode) or (
                pool.quantized or pool.latent[0].dtype != dtype
            ):  # fmt: skip
                return None
            rows = cpu_fused.DecodeRows.of(b.decode_page_table, b.decode_seq_lens)
            slots = b.out_slots.to(torch.int64)
            step = cpu_fused.StepRows(full.tables(b.positions), b.positions, slots, rows,
                                      pool.latent[0])  # fmt: skip
            return None, [step] * len(layers)
        rope = self.decode_rope(full, num_heads, dtype)
        if rope is None:
            return None
        if not any(pool.window_layer) and all(r is full and not w and not c for r, w, c in layers):
            return rope, None  # every layer on the shared step (the Llama shape)
        steps = [
            None if rotary is full and not window and not cap and not pool.window_layer[li]
            else self._own_step(li, rotary, window or 0, num_heads, dtype, cap or 0.0)
            for li, (rotary, window, cap) in enumerate(layers)
        ]  # fmt: skip
        return rope, (steps if any(s is not None for s in steps) else None)

    def _plan_rope_decode(
        self, dtype: torch.dtype, rotary: Rotary, num_heads: int
    ) -> cpu_fused.RopeDecode | None:
        b, pool = self.batch, self.pool
        if not (self._fused and b.num_decode == b.num_tokens and self.fused_decode is not None):
            return None
        # a layer on the step's own page table (not in the window pages, whose pool has fewer
        # pages: the kernel clamps page ids to its pool's count)
        k_pool = next((k for k, w in zip(pool.k, pool.window_layer, strict=True) if not w),
                      pool.k[0])  # fmt: skip
        if pool.quantized or dtype != k_pool.dtype or dtype not in cpu_fused.MODEL_TYPES:
            return None
        if rotary.dim > k_pool.shape[3] or rotary.dim % 2:  # partial rotary: dim < D
            return None
        cos, sin = self._per_rotary(self._tables, rotary, rotary.tables)
        return cpu_fused.RopeDecode(cos, sin, b.positions, b.out_slots, self.fused_decode,
                                    num_heads, k_pool, dtype)  # fmt: skip

    def _as_plain(self, spec: LayerSpec) -> LayerSpec:
        """`spec` as full causal attention where that is what it computes this step: a sliding
        window no sequence of the step outgrows (each at most `window` long, its new tokens
        included: every query sees all its keys), uncapped. Else `spec` itself."""
        if spec.window is None or spec.soft_cap is not None:
            return spec
        if self._reach is None:
            b = self.batch
            lens = [b.decode_seq_lens, b.extend_prefix_lens + b.extend_lens]
            self._reach = max((int(t.max()) for t in lens if t.numel()), default=0)
        return LayerSpec(spec.scale) if self._reach <= spec.window else spec

    def _window_decode(self, layer: int, q: torch.Tensor, scale: float) -> torch.Tensor | None:
        """Full causal decode attention of a layer kept in the window pages, through the fused
        kernel on the step's page tables mapped to window slots (all of a sequence's pages are
        there while it is no longer than the window); None where the kernel does not take it."""
        k, v = self.pool.k[layer], self.pool.v[layer]
        if not self._fused or q.dtype not in cpu_fused.MODEL_TYPES:
            return None
        if not (k.dtype == q.dtype or self.pool.quantized):
            return None
        if self._window_rows is None:
            table = self.tables(layer).decode_page_table
            self._window_rows = cpu_fused.DecodeRows.of(table, self.batch.decode_seq_lens)
        return cpu_fused.decode_attention(q, k, v, self._window_rows, scale)

    def _windowed(
        self, layer: int, q: torch.Tensor, spec: LayerSpec, decode: bool
    ) -> torch.Tensor | None:
        """The decode rows or extend chunks of a windowed or capped layer through the C
        kernel (cpu_window: only the keys of each query's window read); None where it does not
        take them (fp8 pool, no compiler, `fused=False`): the reference then."""
        if not self._fused:
            return None
        paged = self.pool.window_layer[layer]
        key = (decode, paged)
        if key not in self._chunk_rows:
            b, tables = self.batch, self.tables(layer)
            if decode:
                table, n = tables.decode_page_table, torch.ones_like(b.decode_seq_lens)
                prefix = b.decode_seq_lens - 1
            else:
                table, prefix, n = tables.extend_page_table, b.extend_prefix_lens, b.extend_lens
            self._chunk_rows[key] = tuple(
                t.to(torch.int32).contiguous() for t in (table, prefix, n)
            )
        table, prefix, n = self._chunk_rows[key]
        k, v = self.pool.k[layer], self.pool.v[layer]
        return cpu_window.attention(
            q, k, v, table, prefix, n, spec.scale, spec.window, spec.soft_cap
        )

    def decode(self, layer: int, q: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        if not spec.plain:
            plain = self._as_plain(spec)
            if plain.plain and self.pool.window_layer[layer]:
                out = self._window_decode(layer, q, plain.scale)
                if out is not None:
                    return out
            elif plain.plain:
                spec = plain
        if not spec.plain:
            out = self._windowed(layer, q, spec, decode=True)
            return super().decode(layer, q, spec) if out is None else out
        b, k, v = self.batch, self.pool.k[layer], self.pool.v[layer]
        if self.cascade is not None:
            return cascade_decode_attention(
                q, k, v, b.decode_page_table, b.decode_seq_lens, spec.scale, self.cascade
            )
        # the kernels read a pool of the model's type, or fp8 (not bf16 under float32)
        fused_kv = k.dtype == q.dtype or self.pool.quantized
        if self.fused_decode is not None and q.dtype in cpu_fused.MODEL_TYPES and fused_kv:
            return cpu_fused.decode_attention(q, k, v, self.fused_decode, spec.scale)
        if self.decode_plan is None:
            self.decode_plan = plan_decode(
                b.decode_page_table, b.decode_seq_lens, self.pool.page_size, self.pool.num_pages
            )
        return planned_decode_attention(q, k, v, self.decode_plan, spec.scale)

    def extend(self, layer: int, q: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        if not spec.plain and not self.pool.window_layer[layer]:  # (window pages: general)
            spec = self._as_plain(spec)
        if not spec.plain:
            out = self._windowed(layer, q, spec, decode=False)
            return super().extend(layer, q, spec) if out is None else out
        k, v = self.pool.k[layer], self.pool.v[layer]
        if not self._extend_planned:
            self._plan_extend(q.shape[1] // k.shape[2])
        if self.split is not None:
            return prefix_extend_attention(q, k, v, spec.scale, self.split)
        if self.short is not None:
            return short_extend_attention(q, k, v, spec.scale, self.short)
        return super().extend(layer, q, spec)
