"""A radix tree from token sequences to KV pages (RadixAttention on a paged pool).

Keys are stored in whole pages: a node's key length is a multiple of `page_size` and its
`pages[i]` holds the K/V of `key[i*ps:(i+1)*ps]`. Children are keyed by their first page of
tokens, so two sequences share exactly the full pages they have in common; a request's last
partial page is never shared.

Invariants (checked by `check_integrity`):
- `node.lock_ref` counts running requests whose cached prefix ends at `node` or below it;
  a node with `lock_ref > 0` is never evicted. Handles returned by `match_prefix` must be
  locked before their pages are used; otherwise `evict` may free them.
- `evictable_pages` = pages of nodes with `lock_ref == 0`; `protected_pages` the others.
- a page appears in at most one node.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_clock = itertools.count()


class TreeNode:
    __slots__ = ("children", "parent", "key", "pages", "lock_ref", "last_access")

    def __init__(self, parent: TreeNode | None, key: tuple[int, ...], pages: list[int]) -> None:
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.key = key
        self.pages = pages
        self.lock_ref = 0
        self.last_access = next(_clock)


@dataclass(slots=True)
class MatchResult:
    pages: list[int]  # pages of the matched prefix, in order
    length: int  # matched tokens (a multiple of page_size)
    node: TreeNode  # the deepest matched node: lock it while the pages are in use


@dataclass(slots=True)
class InsertResult:
    pages: list[int]  # the tree's pages for the whole inserted key, after insertion
    already_cached: int  # tokens of the key that were in the tree before
    node: TreeNode  # the node where the key ends


class RadixCache:
    def __init__(
        self,
        page_size: int,
        free_pages: Callable[[list[int]], None],
        on_evict: Callable[[TreeNode], None] | None = None,
    ) -> None:
        """`on_evict(node)` runs before an evicted node's pages are freed (still attached to
        its parent): the storage tier copies them out there (memory/hicache.py)."""
        self.page_size = page_size
        self._free_pages = free_pages
        self.on_evict = on_evict
        self.reset()

    def reset(self) -> None:
        """Forget the whole tree without freeing pages (the caller re-creates the pool)."""
        self.root = TreeNode(None, (), [])
        self.root.lock_ref = 1  # the root is never evicted
        self.evictable_pages = 0
        self.protected_pages = 0
        self.evicted_pages_total = 0

    @property
    def total_pages(self) -> int:
        return self.evictable_pages + self.protected_pages

    def _page_key(self, tokens: Sequence[int], start: int) -> tuple[int, ...]:
        return tuple(tokens[start : start + self.page_size])

    def _matched_pages(self, node: TreeNode, tokens: Sequence[int], start: int) -> int:
        """How many whole pages of `node.key` equal `tokens[start:]`."""
        ps = self.page_size
        n = min(len(node.key), len(tokens) - start) // ps
        for i in range(n):
            if node.key[i * ps : (i + 1) * ps] != tuple(
                tokens[start + i * ps : start + (i + 1) * ps]
            ):
                return i
        return n

    def _split(self, node: TreeNode, pages: int) -> TreeNode:
        """Cut `node` after `pages` pages; returns the new upper part (node becomes its child)."""
        cut = pages * self.page_size
        upper = TreeNode(node.parent, node.key[:cut], node.pages[:pages])
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        assert node.parent is not None
        node.parent.children[self._page_key(upper.key, 0)] = upper
        node.key = node.key[cut:]
        node.pages = node.pages[pages:]
        node.parent = upper
        upper.children[self._page_key(node.key, 0)] = node
        return upper

    def match_prefix(self, tokens: Sequence[int]) -> MatchResult:
        """The longest page-aligned cached prefix of `tokens`; splits a node matched in part."""
        ps = self.page_size
        node, pos, pages = self.root, 0, []
        stamp = next(_clock)
        while len(tokens) - pos >= ps:
            child = node.children.get(self._page_key(tokens, pos))
            if child is None:
                break
            matched = self._matched_pages(child, tokens, pos)
            if matched < len(child.pages):
                child = self._split(child, matched)
            child.last_access = stamp
            pages.extend(child.pages)
            pos += matched * ps
            node = child
        return MatchResult(pages, pos, node)

    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> InsertResult:
        """Add `tokens` (whole pages) with their `pages`.

        Where the tree already holds a prefix of `tokens`, its pages win: the result lists the
        tree's pages for the full key, and the caller frees any of its own pages not in it.
        """
        ps = self.page_size
        if len(tokens) % ps or len(tokens) // ps != len(pages):
            raise ValueError(f"insert needs whole pages: {len(tokens)} tokens, {len(pages)} pages")
        match = self.match_prefix(tokens)
        node, pos = match.node, match.length
        result_pages = list(match.pages)
        if pos < len(tokens):
            new = TreeNode(node, tuple(tokens[pos:]), list(pages[pos // ps :]))
            node.children[self._page_key(tokens, pos)] = new
            self.evictable_pages += len(new.pages)
            result_pages.extend(new.pages)
            node = new
        return InsertResult(result_pages, match.length, node)

    def lock(self, node: TreeNode) -> None:
        """Protect `node` and its ancestors from eviction (one more running user)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_pages -= len(node.pages)
                self.protected_pages += len(node.pages)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("radix cache: unlock of a node that is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_pages += len(node.pages)
                self.protected_pages -= len(node.pages)
            node = node.parent  # type: ignore[assignment]

    def _leaves(self) -> list[TreeNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if not node.children and node is not self.root:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def evict(self, num_pages: int) -> int:
        """Free at least `num_pages` pages from unlocked leaves, least recently used first.

        Returns how many were freed (fewer when not enough are unlocked).
        """
        # heap of unlocked leaves by last use; a parent left childless joins the heap
        heap = [(n.last_access, id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            if self.on_evict is not None:
                self.on_evict(node)
            del parent.children[self._page_key(node.key, 0)]
            self._free_pages(node.pages)
            freed += len(node.pages)
            self.evictable_pages -= len(node.pages)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.evicted_pages_total += freed
        return freed

    def nodes_by_age(self) -> list[TreeNode]:
        """Every node but the root, least recently used first (locked ones included)."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                out.append(node)
            stack.extend(node.children.values())
        return sorted(out, key=lambda n: n.last_access)

    def all_pages(self) -> list[int]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.extend(node.pages)
            stack.extend(node.children.values())
        return out

    def check_integrity(self) -> None:
        """Raise AssertionError when a counter or the tree shape is inconsistent."""
        ps = self.page_size
        evictable = protected = 0
        seen: set[int] = set()
        stack = [self.root]
        while stack:
            node = stack.pop()
            child_locks = 0
            for first, child in node.children.items():
                assert child.parent is node, "child's parent pointer is wrong"
                assert child.key and len(child.key) == len(child.pages) * ps, "key/page mismatch"
                assert first == child.key[:ps], "child stored under the wrong first page"
                child_locks += child.lock_ref
                stack.append(child)
            if node is self.root:
                continue
            assert node.lock_ref >= child_locks >= 0, "lock_ref below its children's"
            for page in node.pages:
                assert page not in seen, f"page {page} appears twice in the tree"
                seen.add(page)
            if node.lock_ref == 0:
                evictable += len(node.pages)
            else:
                protected += len(node.pages)
        assert evictable == self.evictable_pages, f"{evictable} != {self.evictable_pages}"
        assert protected == self.protected_pages, f"{protected} != {self.protected_pages}"
