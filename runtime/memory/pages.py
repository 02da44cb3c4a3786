"""Which pages each request holds: matching, reserving, caching and releasing them.

The page table of a request (`req.pages`) covers positions `0 .. len(pages) * page_size`. Its
first `req.cached // page_size` pages belong to the radix tree (kept alive by the lock on
`req.node`); the rest belong to the request alone. Every page is, at any time, in exactly one
place: the pool's free list, the tree, or one request's own pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from runtime.memory.hicache import HiCache
from runtime.memory.kv_pages import write_pages
from runtime.memory.kv_pool import KVPool
from runtime.memory.radix_cache import MatchResult, RadixCache, TreeNode


class Request(Protocol):
    """What the book reads and writes of a request (`scheduling.request.Request` is one)."""

    pages: list[int]  # its page table
    node: TreeNode | None  # the locked tree node its cached prefix ends at
    cached: int  # tokens whose pages belong to the tree
    computed: int  # tokens whose KV is written
    cache_limit: int | None  # tokens past this may still change: not cached while it runs

    @property
    def seq(self) -> list[int]: ...


class PageBook:
    def __init__(self, pool: KVPool, tree: RadixCache | None, tier: HiCache | None = None) -> None:
        self.pool = pool
        self.tree = tree
        self.tier = tier  # the storage tier under the tree, or None
        self.ps = pool.page_size
        self.windows = pool.windows  # sliding-window layers' own pages, or None
        self._holders: dict[int, Request] = {}  # requests holding pages, by id

    def match(self, tokens: Sequence[int], cap: int) -> MatchResult:
        """The cached prefix usable for `tokens`, at most `cap` tokens, page-aligned; with
        window pages, no longer than the prefix whose last W - 1 positions keep window KV."""
        if self.tree is None or cap < self.ps:
            return MatchResult([], 0, None)  # type: ignore[arg-type]
        m = self.tree.match_prefix(tokens[: (cap // self.ps) * self.ps])
        if self.windows is not None and m.length:
            usable = self.windows.usable_prefix(m.pages, self.ps)
            if usable < m.length:  # the node stays the deepest match: locking it keeps more
                node = m.node if usable else self.tree.root  # nothing matched: nothing locked
                m = MatchResult(m.pages[: usable // self.ps], usable, node)
        return m

    def load_from_tier(
        self, tokens: Sequence[int], cap: int, match: MatchResult
    ) -> tuple[MatchResult, int]:
        """Extend `match` (the tree's, for `tokens` up to `cap`) with the pages the storage
        tier holds right after it, when loading them is worth it: they go into fresh pool
        pages and into the tree. Returns the longer match and the tokens loaded (0: `match`
        unchanged)."""
        tier, tree = self.tier, self.tree
        if tier is None or tree is None or match.node is None:
            return match, 0
        first, last = match.length // self.ps, cap // self.ps
        if last <= first:
            return match, 0
        keys = tier.page_keys(tokens, last)[first:]
        count = tier.available(keys)
        if not tier.worth_loading(count):
            return match, 0
        tree.lock(match.node)  # the matched pages must survive the allocation's evictions
        try:
            pages = self._alloc(count)
            if pages is None:
                return match, 0
            data = tier.read(keys[:count], tokens[first * self.ps : (first + count) * self.ps])
            got = data.shape[0]  # fewer when a page is missing or fails its check
            self.pool.free(pages[got:])
            if not got:
                return match, 0
            write_pages(self.pool, pages[:got], data)
            end = (first + got) * self.ps
            inserted = tree.insert(tokens[:end], [*match.pages, *pages[:got]])
        finally:
            tree.unlock(match.node)
        return MatchResult(inserted.pages, end, inserted.node), end - match.length

    def _alloc(self, count: int) -> list[int] | None:
        pages = self.pool.alloc(count)
        if pages is None and self.tree is not None:
            short = count - self.pool.num_free_pages
            if short > 0:
                self.tree.evict(short)
        if pages is None and self.windows is not None:
            short = count - self.pool.num_free_window_pages
            if short > 0:
                self._drop_windows(short)
        if pages is None:
            pages = self.pool.alloc(count)
        return pages

    def admit(self, req: Request, match: MatchResult, upto: int) -> bool:
        """Take the matched prefix (locked) and own pages up to token `upto`; False if no room."""
        if match.node is not None and self.tree is not None:
            self.tree.lock(match.node)
        req.node = match.node if match.length else None
        req.pages = list(match.pages)
        req.cached = req.computed = match.length
        self._holders[id(req)] = req
        if self.reserve(req, upto):
            return True
        self.release(req)
        return False

    def reserve(self, req: Request, upto: int) -> bool:
        """Make `req.pages` cover positions below `upto`; False (nothing taken) if no room."""
        if self.windows is not None:
            self.windows.drop(self._behind_window(req, own_only=True))
        need = -(-upto // self.ps) - len(req.pages)
        if need <= 0:
            return True
        pages = self._alloc(need)
        if pages is None:
            return False
        req.pages.extend(pages)
        return True

    # ---- window pages -------------------------------------------------------------------------
    def _window_start(self, req: Request) -> int:
        """The first page index `req`'s window layers may still read: its next queries sit at
        `computed` or later, or back at `cache_limit` while outputs may be re-tokenised."""
        stable = req.computed if req.cache_limit is None else min(req.computed, req.cache_limit)
        return max(0, stable - self.windows.window + 1) // self.ps

    def _behind_window(self, req: Request, own_only: bool) -> list[int]:
        """`req`'s pages wholly before its window (only those it owns, not the tree's)."""
        first = req.cached // self.ps if own_only else 0
        return req.pages[first : self._window_start(req)]

    def _drop_windows(self, count: int) -> int:
        """Give back at least `count` window slots if it can: first those behind their owners'
        windows, then those of cached pages, least recently used nodes first; never one a
        holder's window still covers. Returns how many it gave back."""
        needed: set[int] = set()
        for req in self._holders.values():
            needed.update(req.pages[self._window_start(req) :])
        dropped = 0
        for req in self._holders.values():
            dropped += self.windows.drop(self._behind_window(req, own_only=True))
        if self.tree is not None:
            for node in self.tree.nodes_by_age():
                if dropped >= count:
                    break
                dropped += self.windows.drop(p for p in node.pages if p not in needed)
        self.windows.dropped_total += dropped
        return dropped

    def cache_computed(self, req: Request, ignore_limit: bool = False) -> None:
        """Put the full pages of `req`'s computed tokens into the tree (they stay locked);
        while it runs, no further than `req.cache_limit` (tokens that may still change)."""
        if self.tree is None:
            return
        upto = req.computed
        if req.cache_limit is not None and not ignore_limit:
            upto = min(upto, req.cache_limit)
        full = (upto // self.ps) * self.ps
        if full <= req.cached:
            return
        n = full // self.ps
        result = self.tree.insert(req.seq[:full], req.pages[:n])
        # where the tree already had these tokens its pages win; ours are duplicates
        pairs = [(mine, theirs) for mine, theirs in zip(req.pages[:n], result.pages, strict=True)
                 if mine != theirs]  # fmt: skip
        dup = [mine for mine, _ in pairs]
        if self.windows is not None:  # the tree's copy may have lost its window KV: take ours
            for mine, theirs in pairs:
                self.windows.move(mine, theirs)
        if dup:
            self.pool.free(dup)
        req.pages[:n] = result.pages
        self.tree.lock(result.node)
        if req.node is not None:
            self.tree.unlock(req.node)
        req.node = result.node
        req.cached = full

    def truncate(self, req: Request, keep: int) -> None:
        """Forget K/V at positions >= `keep` (jump-forward re-tokenisation); pages past it that
        the request owns go back to the pool. Tree pages are never truncated: `keep` must be
        at least `req.cached`."""
        keep = max(keep, req.cached)
        n = -(-keep // self.ps)
        self.pool.free(req.pages[n:])
        del req.pages[n:]
        req.computed = min(req.computed, keep)

    def release(self, req: Request) -> None:
        """Retire the request's pages: full computed pages into the tree, the rest freed."""
        if self.tree is not None:
            self.cache_computed(req, ignore_limit=True)
        own = req.pages[req.cached // self.ps :]
        self.pool.free(own)
        if req.node is not None and self.tree is not None:
            self.tree.unlock(req.node)
        self._holders.pop(id(req), None)
        req.node = None
        req.pages = []
        req.cached = req.computed = 0

    def check_integrity(self, running: Sequence[Request]) -> None:
        """Every usable page is free, in the tree, or owned by one running request."""
        free = self.pool.free_page_set()
        assert len(free) == self.pool.num_free_pages, "a page is free twice"
        tree_pages = set(self.tree.all_pages()) if self.tree is not None else set()
        if self.tree is not None:
            self.tree.check_integrity()
        owned: list[int] = []
        for req in running:
            shared = req.pages[: req.cached // self.ps]
            assert set(shared) <= tree_pages, f"request {req.rid} uses pages not in the tree"
            owned.extend(req.pages[req.cached // self.ps :])
        assert len(owned) == len(set(owned)), "a page is owned twice"
        owned_set = set(owned)
        assert not owned_set & tree_pages, "an owned page is also in the tree"
        assert not owned_set & free and not tree_pages & free, "a used page is also free"
        total = len(free) + len(tree_pages) + len(owned_set)
        assert total == self.pool.num_usable_pages, f"{total} pages != {self.pool.num_usable_pages}"
        if self.windows is not None:
            self.windows.check(tree_pages | owned_set)
            for req in running:
                missing = [p for p in req.pages[self._window_start(req) :]
                           if not self.windows.has(p)]  # fmt: skip
                assert not missing, f"request {req.rid}: pages {missing} lost their window KV"
