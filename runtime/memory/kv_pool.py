"""The paged KV pool: per layer one tensor `[num_pages, page_size, heads, dim]` for each entry
of the model's KV layout (`ModelConfig.kv_layout`): K and V of every KV head for the Llama
family (`pool.k`, `pool.v`), one latent per token for MLA (`pool.latent`). Pages, the radix
cache and the scheduler deal only in page ids, so they work the same on any layout. Sliding-
window layers may keep `[window_pages, ...]` instead, addressed through `pool.windows`
(memory/windows.py).

Pages are handed out by a free list. A page is at any time in exactly one of three places: the
free list, the radix cache, or the page table of one running request (the scheduler's
`check_integrity` counts them).
"""

from __future__ import annotations

import logging

import torch

from runtime.config import ModelConfig
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


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}") from None


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
    ) -> None:
        """`allocate=False`: the page allocator only, for a parallel engine's driver (its
        workers hold the storage, each for its own layers and heads). `window_pages`: the
        sliding-window layers get that many pages of their own (memory/windows.py), fewer than
        `num_pages`; None: every layer is indexed by page id."""
        if num_pages < 2:
            raise ValueError(f"the KV pool needs at least 2 pages, got {num_pages}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.dtype = dtype
        self.device = torch.device(device)
        dtype_bytes = torch.finfo(dtype).bits // 8
        self.bytes_per_token = config.kv_bytes_per_token(dtype_bytes)
        self.layout = config.kv_layout()
        per_layer = sum(heads * dim for _, heads, dim in self.layout) * dtype_bytes
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
        self.buffers: dict[str, list[torch.Tensor]] = {
            name: [
                torch.zeros(
                    (window_pages if self.window_layer[i] else num_pages, page_size, heads, dim),
                    dtype=dtype,
                    device=device,
                )  # fmt: skip
                for i in range(config.num_layers if allocate else 0)
            ]
            for name, heads, dim in self.layout
        }
        self.k = self.buffers.get("k", [])
        self.v = self.buffers.get("v", [])
        self.latent = self.buffers.get("latent", [])
        # Page 0 is never handed out: padding entries of page tables may point at it safely.
        self._free: list[int] = list(range(num_pages - 1, 0, -1))

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
