"""Sliding-window layers' KV in pages of their own.

A model whose layers attend to the last W tokens only (Gemma 3's local layers; Mistral-style
windows on the shared decoder) needs those layers' KV for at most W tokens behind each running
request, while its global layers need every token. The pool therefore keeps two kinds of
storage, addressed by the same page ids:

- global layers: `[num_pages, page_size, H, D]`, indexed by page id as always;
- window layers: `[window_pages, page_size, H, D]`, indexed through `slot_of[page]`, the page's
  *window slot* (0: none; slot 0 is padding, never handed out).

Every page the pool hands out comes with a window slot; a page keeps its global-layer KV as long
as it lives, but its window slot may be given back earlier ("dropped") once no running request
needs that page's positions for a window layer. Page tables, the radix tree and the scheduler
keep dealing in page ids only; attention maps page ids to window slots for window layers.

Invariants (`check` asserts them):
- a window slot is free or held by exactly one live page;
- for each running request, every page covering positions `[stable - W + 1, reserved end)`
  holds a slot (`stable`: its computed tokens, or fewer while outputs may be re-tokenised).

The radix cache shares prefixes as before for global layers. A cached prefix of length L is
reusable for window layers only if the pages covering its last W - 1 positions still hold
slots; `usable_prefix` cuts a match back to the longest page-aligned length for which that
holds (0 always qualifies), so a request recomputes what it needs instead of reading missing
KV. Slots of cached pages are dropped only under pressure, least recently used nodes first,
never those a running request needs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from runtime.config import ModelConfig


class WindowPages:
    """The page id -> window slot map and the free slots. Not thread-safe (scheduler thread)."""

    def __init__(self, num_pages: int, window_pages: int, window: int) -> None:
        if window_pages < 2:
            raise ValueError(f"the window pool needs at least 2 pages, got {window_pages}")
        self.num_pages = num_pages
        self.window_pages = window_pages
        self.window = window
        self.slot_of = [0] * num_pages
        self.map = torch.zeros(num_pages, dtype=torch.int64)  # the same, for kernels
        self._free: list[int] = list(range(window_pages - 1, 0, -1))
        self.dropped_total = 0  # slots given back before their page (pressure or window)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def attach(self, pages: Sequence[int]) -> None:
        """Give each page (just allocated, without a slot) a free slot; the caller checked
        `num_free`."""
        for page in pages:
            slot = self._free.pop()
            self.slot_of[page] = slot
            self.map[page] = slot

    def has(self, page: int) -> bool:
        return self.slot_of[page] != 0

    def drop(self, pages: Iterable[int]) -> int:
        """Give back the slots of `pages` (their global-layer KV stays); returns how many."""
        n = 0
        for page in pages:
            slot = self.slot_of[page]
            if slot:
                self.slot_of[page] = 0
                self.map[page] = 0
                self._free.append(slot)
                n += 1
        return n

    def move(self, src: int, dst: int) -> None:
        """Hand `src`'s slot to `dst` (the same tokens' KV: a duplicate page about to be freed
        whose window KV the tree's copy lacks)."""
        slot = self.slot_of[src]
        if slot and not self.slot_of[dst]:
            self.slot_of[src] = 0
            self.map[src] = 0
            self.slot_of[dst] = slot
            self.map[dst] = slot

    def usable_prefix(self, pages: Sequence[int], page_size: int) -> int:
        """The longest page-aligned prefix length L <= len(pages) * page_size whose positions
        L - W + 1 .. L - 1 all sit in pages holding slots."""
        run = 0  # pages holding slots, counted back from the end of the candidate prefix
        runs = [0] * (len(pages) + 1)
        for i, page in enumerate(pages):
            run = run + 1 if self.has(page) else 0
            runs[i + 1] = run
        for k in range(len(pages), 0, -1):
            first = max(0, k * page_size - self.window + 1) // page_size
            if runs[k] >= k - first:
                return k * page_size
        return 0

    def check(self, live_pages: set[int]) -> None:
        held = [s for s in self.slot_of if s]
        assert len(held) == len(set(held)), "a window slot is held by two pages"
        assert not set(held) & set(self._free), "a held window slot is also free"
        assert len(held) + len(self._free) == self.window_pages - 1, "window slots lost"
        orphan = [p for p, s in enumerate(self.slot_of) if s and p not in live_pages]
        assert not orphan, f"free pages {orphan[:5]} still hold window slots"
        assert torch.equal(self.map, torch.tensor(self.slot_of, dtype=torch.int64))


def min_window_pages(window: int, chunk_tokens: int, page_size: int) -> int:
    """Slots one request needs at most: its window behind the next chunk, the chunk, a partial
    page at each end, plus the padding slot."""
    return math.ceil((window - 1 + chunk_tokens) / page_size) + 3


def split_budget(
    full_bytes_per_token: int,
    window_bytes_per_token: int,
    budget_bytes: int,
    page_size: int,
    ratio: float,
    min_window: int,
) -> tuple[int, int]:
    """(pages, window pages) for `budget_bytes`: window pages = max(`ratio` x pages,
    `min_window`), the rest of the budget in pages for the global layers."""
    full_page = full_bytes_per_token * page_size
    window_page = window_bytes_per_token * page_size
    pages = int(budget_bytes // (full_page + ratio * window_page))
    window_pages = max(math.ceil(ratio * pages), min_window)
    if window_pages * window_page < budget_bytes and full_page:
        pages = int((budget_bytes - window_pages * window_page) // full_page)
    else:
        pages = 0
    return pages, window_pages


# window pages per global-layer page when a budget is split (a floor keeps one request running);
# the window layers need W tokens per running request, the global ones every cached token
WINDOW_PAGES_RATIO = 0.25


def pool_pages(
    config: ModelConfig,
    page_size: int,
    dtype_bytes: int,
    chunk_tokens: int,
    budget_bytes: int | None = None,
    max_total_tokens: int | None = None,
    separate_windows: bool = True,
) -> tuple[int, int | None]:
    """(pages, window pages or None) for a pool sized by `budget_bytes` or holding
    `max_total_tokens` tokens in its global layers. Window pages only for a model with window
    layers when `separate_windows` and they come out fewer than the pages."""
    windowed = config.window_layers if separate_windows else 0
    per_layer = config.kv_bytes_per_token(dtype_bytes) // max(config.num_layers, 1)
    floor = min_window_pages(int(config.sliding_window or 0), chunk_tokens, page_size)
    if max_total_tokens is not None:
        pages = -(-max_total_tokens // page_size) + 1
        window_pages = max(math.ceil(WINDOW_PAGES_RATIO * pages), floor)
    elif windowed:
        pages, window_pages = split_budget(
            per_layer * (config.num_layers - windowed), per_layer * windowed,
            int(budget_bytes or 0), page_size, WINDOW_PAGES_RATIO, floor,
        )  # fmt: skip
    else:
        page_bytes = config.kv_bytes_per_token(dtype_bytes) * page_size
        return max(int((budget_bytes or 0) // page_bytes), 0), None
    if not windowed or window_pages >= pages:
        if max_total_tokens is None:  # no saving: size every layer by page id
            page_bytes = config.kv_bytes_per_token(dtype_bytes) * page_size
            pages = max(int((budget_bytes or 0) // page_bytes), 0)
        return pages, None
    return pages, window_pages
