"""The paged KV pool: per layer one tensor `[num_pages, page_size, heads, dim]` for each entry
of the model's KV layout (`ModelConfig.kv_layout`): K and V of every KV head for the Llama
family (`pool.k`, `pool.v`), one latent per token for MLA (`pool.latent`). Pages, the radix
cache and the scheduler deal only in page ids, so they work the same on any layout. Sliding-
window layers may keep `[window_pages, ...]` instead, addressed through `pool.windows`
(memory/windows.py).

The storage type (`kv_dtype`) may differ from the model's: `fp8_e4m3` / `fp8_e5m2` store one
byte per value with a per-layer scale per tensor (`pool.scales[name][layer]`) and optionally a
per-channel offset (`pool.offsets[name][layer]`, [heads, dim] float32): the stored value is
`(x - offset) / scale`, clamped to the type's range. Scales and offsets come from the
checkpoint or from a calibration pass (attention/kv_calibration.py). Only the attention backends
read the pool, and they fold both into the attention itself (attention/base.py).

Pages are handed out by a free list. A page is at any time in exactly one of three places: the
free list, the radix cache, or the page table of one running request (the scheduler's
`check_integrity` counts them).

Reserved is not resident: on the CPU each layer tensor of `LAZY_BYTES` or more is an anonymous
mapping of its own (`zeroed`), which the system zero-fills one memory page at a time when it
is first written. Its contents are those of `torch.zeros` (every value 0 until written), so
nothing that reads the pool can tell the difference, but a page never handed out costs no
memory: a batch-1 run over a 65,536-token pool holds the few pages its tokens use, not the
whole pool. The free list hands out the lowest page ids first and takes freed pages back on
top, so the memory touched follows the most pages ever in use at once. `resident_bytes()`
says how much of the pool the system holds now (mincore).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import logging
import mmap
import re
from collections.abc import Mapping

import torch

from runtime.config import ModelConfig
from runtime.errors import KVPoolTooLargeError
from runtime.memory.budget import available_memory_bytes
from runtime.memory.windows import WindowPages

logger = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


# the KV cache types an engine accepts (SGLang's names); "auto" = the model's dtype
KV_DTYPES = {
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}
KV_DTYPE_CHOICES = ("auto", "fp8_e4m3", "fp8_e5m2", "bf16", "fp16", "fp32")
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def resolve_kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's storage type for `kv_cache_dtype` ("auto": the model's dtype)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    try:
        return KV_DTYPES[kv_cache_dtype.lower()]
    except (KeyError, AttributeError):
        raise ValueError(
            f"kv_cache_dtype must be one of {list(KV_DTYPE_CHOICES)}, got {kv_cache_dtype!r}"
        ) from None


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The SGLang-style name of a pool storage type (fp8_e4m3, bf16, ...)."""
    names = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2",
             torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}  # fmt: skip
    return names.get(dtype, str(dtype).replace("torch.", ""))


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


# per-layer KV scales a checkpoint may carry (vLLM / SGLang / ModelOpt fp8 exports):
# `<prefix>layers.<i>.self_attn.{k,v}_scale`, or `...self_attn.{k,v}_proj.output_scale`
_SCALE_KEY = re.compile(r"layers\.(\d+)\.self_attn\.(?:(k|v)_scale|(k|v)_proj\.output_scale)$")


def checkpoint_kv_scales(
    state_dict: Mapping[str, torch.Tensor], num_layers: int
) -> dict[str, list[float]]:
    """Per-layer K / V scales found in a checkpoint's tensors ({} when it has none); a layer
    without its own key keeps 1.0."""
    found: dict[str, list[float]] = {}
    for key, value in state_dict.items():
        m = _SCALE_KEY.search(key)
        if m is None or int(m.group(1)) >= num_layers:
            continue
        name = m.group(2) or m.group(3)
        found.setdefault(name, [1.0] * num_layers)[int(m.group(1))] = float(value.float().max())
    return found


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}") from None


# a CPU layer tensor of this size or more is a mapping of its own, resident as it is written
LAZY_BYTES = 1 << 20


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.zeros(shape)`; on the CPU from LAZY_BYTES on, an anonymous private mapping of
    its own (the system's zero pages: resident only once written, unmapped when the tensor
    is freed)."""
    nbytes = dtype_bytes(dtype) * int(torch.Size(shape).numel())
    if device.type == "cpu" and nbytes >= LAZY_BYTES:
        try:
            area = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (AttributeError, OSError, ValueError):  # no anonymous mappings here
            pass
        else:  # the tensor keeps the mapping alive
            return torch.frombuffer(area, dtype=torch.uint8).view(dtype).view(shape)
    return torch.zeros(shape, dtype=dtype, device=device)


def _check_reservable(nbytes: int) -> None:
    """Refuse at start a pool the machine could not hold once written (its pages become
    resident only as they fill, so nothing else would fail before then)."""
    free = available_memory_bytes()
    if free is not None and nbytes > free:
        raise KVPoolTooLargeError(
            f"the KV pool needs {nbytes / 2**30:.2f} GiB once full but the machine has "
            f"{free / 2**30:.2f} GiB available: lower --mem-budget-gb or --max-total-tokens"
        )


_LIBC: ctypes.CDLL | None = None


def resident_part(t: torch.Tensor) -> int | None:
    """Bytes of a page-aligned CPU tensor the system holds in memory (mincore; a read of a
    never-written page maps the shared zero page, which counts here), None where that cannot
    be asked."""
    global _LIBC
    if t.device.type != "cpu" or t.data_ptr() % mmap.PAGESIZE:
        return None
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        mincore = _LIBC.mincore
    except (OSError, AttributeError):
        return None
    nbytes = t.numel() * t.element_size()
    pages = -(-nbytes // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    if mincore(ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(nbytes), vec) != 0:
        return None
    held = int((torch.frombuffer(vec, dtype=torch.uint8) & 1).sum())
    return min(held * mmap.PAGESIZE, nbytes)


def pages_for_budget(
    config: ModelConfig, budget_bytes: int, page_size: int, dtype_bytes: int
) -> int:
    """How many whole pages fit in `budget_bytes` of KV memory."""
    page_bytes = config.kv_bytes_per_token(dtype_bytes) * page_size
    return max(int(budget_bytes // page_bytes), 0)


class KVPool:
    """K/V storage plus a page allocator. Not thread-safe: the scheduler thread owns it."""

    def __init__(
        self,
        config: ModelConfig,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        allocate: bool = True,
        window_pages: int | None = None,
        scales: Mapping[str, list[float]] | None = None,
        offsets: Mapping[str, list[torch.Tensor | None]] | None = None,
    ) -> None:
        """`dtype`: the storage type (the KV cache dtype). `allocate=False`: the page allocator
        only, for a parallel engine's driver (its workers hold the storage, each for its own
        layers and heads). `window_pages`: the sliding-window layers get that many pages of
        their own (memory/windows.py), fewer than `num_pages`; None: every layer is indexed by
        page id. `scales`: per-layer scales by tensor name ("k", "v"; MLA's "latent") for fp8
        storage, 1.0 where not given; `offsets`: per-layer [heads, dim] float32 offsets by
        name (None: none), subtracted before scaling (fp8 storage only)."""
        if num_pages < 2:
            raise ValueError(f"the KV pool needs at least 2 pages, got {num_pages}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.dtype = dtype
        self.device = torch.device(device)
        value_bytes = dtype_bytes(dtype)
        self.bytes_per_token = config.kv_bytes_per_token(value_bytes)
        self.layout = config.kv_layout()
        per_layer = sum(heads * dim for _, heads, dim in self.layout) * value_bytes
        windowed = [config.layer_window(i) is not None for i in range(config.num_layers)]
        # bytes per token a window layer / a global layer keeps, summed over the layers
        self.bytes_per_token_by_kind = {
            "global": per_layer * windowed.count(False),
            "window": per_layer * windowed.count(True),
        }
        self.windows: WindowPages | None = None
        if window_pages is not None and any(windowed) and window_pages < num_pages:
            self.windows = WindowPages(num_pages, window_pages, int(config.sliding_window))
        # per layer: whether its storage is the window pages (indexed through windows.map)
        self.window_layer = [w and self.windows is not None for w in windowed]
        self.quantized = dtype in FP8_DTYPES
        given = scales or {}
        self.scales: dict[str, list[float]] = {
            name: list(given.get(name, [1.0] * config.num_layers)) for name, _, _ in self.layout
        }
        shifts = offsets or {}
        self.offsets: dict[str, list[torch.Tensor | None]] = {
            name: [None if o is None else o.to(torch.float32, copy=True).to(device)
                   for o in shifts.get(name, [None] * config.num_layers)]
            for name, _, _ in self.layout
        }  # fmt: skip
        # float32 reciprocals the writes multiply by (the fused C write uses the same numbers)
        self.inverse_scales = {
            name: [float(torch.tensor(1.0 / s, dtype=torch.float32)) for s in per_layer]
            for name, per_layer in self.scales.items()
        }

        # every value 0 until written (resident page by page on the CPU: `zeroed`)
        def rows(i: int) -> int:
            return window_pages if self.window_layer[i] else num_pages

        if allocate and self.device.type == "cpu":
            _check_reservable(
                sum(rows(i) for i in range(config.num_layers)) * page_size * per_layer
            )

        self.buffers: dict[str, list[torch.Tensor]] = {
            name: [
                zeroed((rows(i), page_size, heads, dim), dtype, self.device)
                for i in range(config.num_layers if allocate else 0)
            ]
            for name, heads, dim in self.layout
        }
        self.k = self.buffers.get("k", [])
        self.v = self.buffers.get("v", [])
        self.latent = self.buffers.get("latent", [])
        # Page 0 is never handed out: padding entries of page tables may point at it safely.
        self._free: list[int] = list(range(num_pages - 1, 0, -1))

    def reserved_bytes(self) -> int:
        """Bytes of every layer tensor this pool holds (page 0 and window pages included)."""
        return sum(t.numel() * t.element_size() for ts in self.buffers.values() for t in ts)

    def resident_bytes(self) -> int:
        """Bytes of the pool the system holds in memory now (`resident_part` of each layer
        tensor; a tensor where that cannot be asked counts whole)."""
        total = 0
        for ts in self.buffers.values():
            for t in ts:
                part = resident_part(t)
                total += t.numel() * t.element_size() if part is None else part
        return total

    def scale(self, name: str, layer: int) -> float:
        """The scale of tensor `name` ("k", "v", "latent") in `layer` (1.0 unless quantized
        with a checkpoint's scale)."""
        return self.scales[name][layer] if self.quantized else 1.0

    def calibration_digest(self) -> str:
        """A short hash of the fp8 scales and offsets ("" for other types): two pools whose
        pages mean the same values have the same digest."""
        if not self.quantized:
            return ""
        h = hashlib.sha256()
        for name in sorted(self.scales):
            h.update(name.encode() + repr(self.scales[name]).encode())
            for o in self.offsets[name]:
                h.update(b"-" if o is None else o.cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def offset(self, name: str, layer: int) -> torch.Tensor | None:
        """The [heads, dim] float32 offset of tensor `name` in `layer` (None: none)."""
        return self.offsets[name][layer] if self.quantized else None

    def write(self, name: str, layer: int, slots: torch.Tensor, values: torch.Tensor) -> None:
        """Store `values` [T, heads, dim] at flat `slots` of tensor `name` in `layer`,
        converted to the storage type (fp8: in float32, minus the layer's offset, times the
        float32 reciprocal of its scale, clamped to range, rounded to nearest even; the fused
        C write does the same operations in the same order)."""
        pool = self.buffers[name][layer]
        flat = pool.view(-1, *pool.shape[2:])
        if not self.quantized:
            flat.index_copy_(0, slots, values.to(pool.dtype))
            return
        limit = torch.finfo(pool.dtype).max
        scaled = values.float()
        offset = self.offsets[name][layer]
        if offset is not None:
            scaled = scaled - offset
        if self.scales[name][layer] != 1.0:
            scaled = scaled * self.inverse_scales[name][layer]
        stored = scaled.clamp(-limit, limit).to(pool.dtype)
        # index_copy_ has no fp8 kernel on CPU: the same bytes through a uint8 view
        flat.view(torch.uint8).index_copy_(0, slots, stored.view(torch.uint8))

    @property
    def capacity_tokens(self) -> int:
        """Tokens that fit in the allocatable pages."""
        return (self.num_pages - 1) * self.page_size

    @property
    def window_capacity_tokens(self) -> int | None:
        """Tokens the window layers' own pages hold (None: they share the page ids)."""
        return None if self.windows is None else (self.windows.window_pages - 1) * self.page_size

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    @property
    def num_free_window_pages(self) -> int:
        """Free window slots (unbounded, as free pages, without window pages of their own)."""
        return len(self._free) if self.windows is None else self.windows.num_free

    @property
    def num_usable_pages(self) -> int:
        return self.num_pages - 1

    def alloc(self, count: int) -> list[int] | None:
        """`count` pages, or None (nothing taken) when fewer are free."""
        if count > len(self._free) or count > self.num_free_window_pages:
            return None
        if count == 0:
            return []
        taken = self._free[-count:]
        del self._free[-count:]
        if self.windows is not None:
            self.windows.attach(taken)
        return taken

    def free(self, pages: list[int]) -> None:
        if self.windows is not None:
            self.windows.drop(pages)
        self._free.extend(pages)

    def free_page_set(self) -> set[int]:
        return set(self._free)
