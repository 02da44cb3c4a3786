"""Radix tree over KV pages: matching, splits, locks, LRU eviction, integrity counters."""

from __future__ import annotations

import pytest

from runtime.memory.radix_cache import RadixCache

PS = 2


@pytest.fixture
def cache():
    freed: list[int] = []
    tree = RadixCache(PS, freed.extend)
    tree.freed = freed  # type: ignore[attr-defined]
    return tree


def pages_for(tokens, start):
    return list(range(start, start + len(tokens) // PS))


def test_empty_tree_matches_nothing(cache):
    m = cache.match_prefix([1, 2, 3, 4])
    assert (m.length, m.pages) == (0, [])


def test_insert_then_match_whole_pages_only(cache):
    cache.insert([1, 2, 3, 4], [10, 11])
    m = cache.match_prefix([1, 2, 3, 4, 5])
    assert (m.length, m.pages) == (4, [10, 11])
    # a partial page is never shared
    assert cache.match_prefix([1, 2, 3]).length == 2
    cache.check_integrity()


def test_match_in_the_middle_of_a_node_splits_it(cache):
    cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12])
    m = cache.match_prefix([1, 2, 3, 4, 9, 9])
    assert (m.length, m.pages) == (4, [10, 11])
    assert len(cache.root.children) == 1
    upper = next(iter(cache.root.children.values()))
    assert upper.key == (1, 2, 3, 4) and upper.pages == [10, 11]
    assert [c.pages for c in upper.children.values()] == [[12]]
    cache.check_integrity()


def test_insert_of_a_known_prefix_returns_the_tree_pages(cache):
    cache.insert([1, 2, 3, 4], [10, 11])
    result = cache.insert([1, 2, 3, 4, 5, 6], [20, 21, 22])
    assert result.already_cached == 4
    assert result.pages == [10, 11, 22]  # the caller frees its duplicates 20, 21
    assert cache.total_pages == 3
    cache.check_integrity()


def test_divergent_suffixes_branch(cache):
    cache.insert([1, 2, 3, 4], [10, 11])
    cache.insert([1, 2, 5, 6], [10, 12])
    assert cache.match_prefix([1, 2, 5, 6]).pages == [10, 12]
    assert cache.match_prefix([1, 2, 3, 4]).pages == [10, 11]
    assert cache.total_pages == 3
    cache.check_integrity()


def test_locked_nodes_are_not_evicted(cache):
    a = cache.insert([1, 2, 3, 4], [10, 11])
    cache.insert([7, 8], [12])
    cache.lock(a.node)
    assert cache.protected_pages == 2 and cache.evictable_pages == 1
    assert cache.evict(10) == 1
    assert cache.freed == [12]
    assert cache.match_prefix([1, 2, 3, 4]).length == 4
    cache.unlock(a.node)
    assert cache.evictable_pages == 2
    cache.check_integrity()


def test_lock_protects_ancestors_after_a_split(cache):
    a = cache.insert([1, 2, 3, 4], [10, 11])
    cache.lock(a.node)
    cache.match_prefix([1, 2, 9, 9])  # splits the locked node
    assert cache.evict(10) == 0
    cache.unlock(a.node)
    assert cache.evict(10) == 2
    cache.check_integrity()


def test_eviction_is_least_recently_used_first(cache):
    cache.insert([1, 1], [10])
    cache.insert([2, 2], [11])
    cache.insert([3, 3], [12])
    cache.match_prefix([1, 1])  # touch: now [2, 2] is the oldest
    cache.evict(1)
    assert cache.freed == [11]
    cache.evict(1)
    assert cache.freed == [11, 12]
    cache.check_integrity()


def test_eviction_frees_leaves_before_their_parents(cache):
    cache.insert([1, 2, 3, 4], [10, 11])
    cache.insert([1, 2, 5, 6], [10, 12])
    cache.evict(2)
    assert sorted(cache.freed) == [11, 12]
    cache.evict(1)
    assert sorted(cache.freed) == [10, 11, 12]
    assert cache.total_pages == 0
    cache.check_integrity()


def test_unlock_without_lock_raises(cache):
    a = cache.insert([1, 2], [10])
    with pytest.raises(RuntimeError):
        cache.unlock(a.node)


def test_integrity_check_catches_a_bad_counter(cache):
    cache.insert([1, 2], [10])
    cache.evictable_pages += 1
    with pytest.raises(AssertionError):
        cache.check_integrity()


def test_insert_requires_whole_pages(cache):
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3], [10, 11])
