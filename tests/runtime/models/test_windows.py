"""Sliding-window layers' KV in pages of their own (runtime/memory/windows.py): a tiny Gemma 3
(window 8, layers local / global / local) gives transformers' greedy tokens with a window pool
far smaller than the global one, through chunked prefill, preemption and the radix cache; a
cached prefix whose window KV was dropped is matched only as far as the window KV reaches; the
stats and `kv_size` report bytes per token by layer kind and the window cap."""

from __future__ import annotations

import json

import pytest

from runtime import Engine
from runtime.config import config_from_dict
from runtime.memory.kv_size import main as kv_size_main
from runtime.memory.windows import WindowPages, min_window_pages, pool_pages, split_budget
from tests.support.family_models import WINDOW, expected_tokens, family_config, make_family_model
from tests.support.tiny_models import PROMPTS

NEW = 10
GREEDY = dict(max_new_tokens=NEW, min_new_tokens=NEW, temperature=0.0)
LONG = PROMPTS[1] + " It was a hobbit-hole, and that means comfort, they said at the inn."


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    folder = make_family_model(tmp_path_factory.mktemp("gemma") / "m", "gemma3")
    return folder, expected_tokens(folder, PROMPTS + [LONG], NEW)


@pytest.mark.parametrize("total", [400, 96], ids=["roomy", "tight"])
def test_small_window_pool_keeps_transformers_tokens(gemma, total):
    folder, expected = gemma
    prompts = (PROMPTS + [LONG]) * 2
    with Engine(str(folder), page_size=4, max_total_tokens=total, chunked_prefill_tokens=8) as e:
        assert e.pool.windows is not None
        assert e.pool.windows.window_pages < e.pool.num_pages / 3
        assert e.pool.k[0].shape[0] == e.pool.windows.window_pages  # a local layer
        assert e.pool.k[1].shape[0] == e.pool.num_pages  # the global layer
        results = e.generate(prompts, **GREEDY)
        assert [r.token_ids for r in results] == [expected[p] for p in prompts]
        stats = e.stats()
        assert stats["cache_hit_tokens"] > 0
        assert stats["window_capacity_tokens"] == (e.pool.windows.window_pages - 1) * 4
        if total == 96:
            assert stats["preemptions"] > 0
        e.check_integrity()


def test_a_prefix_without_window_kv_is_matched_only_as_far_as_it_reaches(gemma):
    folder, expected = gemma
    with Engine(str(folder), page_size=4, max_total_tokens=400, chunked_prefill_tokens=8) as e:
        assert e.generate(LONG, **GREEDY).token_ids == expected[LONG]
        book = e.scheduler.book
        ids = e.encode(LONG)
        full = e.scheduler.call(lambda: book.tree.match_prefix(ids[:-1]).length)
        assert e.scheduler.call(lambda: book.match(ids, len(ids) - 1).length) == full
        # the window KV of every cached page goes (pressure would do this, LRU first)
        dropped = e.scheduler.call(lambda: book._drop_windows(10**6))
        assert dropped >= full // 4
        assert e.scheduler.call(lambda: book.match(ids, len(ids) - 1).length) == 0
        before = e.stats()["cache_hit_tokens"]
        assert e.generate(LONG, **GREEDY).token_ids == expected[LONG]
        assert e.stats()["cache_hit_tokens"] == before  # recomputed, not read from missing KV
        assert e.scheduler.call(lambda: book.tree.protected_pages) == 0  # no lock left behind
        # the recomputed pages gave the tree's copies their window KV back: reusable again
        assert e.scheduler.call(lambda: book.match(ids, len(ids) - 1).length) == full
        assert e.generate(LONG, **GREEDY).token_ids == expected[LONG]
        assert e.stats()["cache_hit_tokens"] > before
        e.check_integrity()


def test_stats_report_bytes_per_token_by_layer_kind(gemma):
    folder, _ = gemma
    with Engine(str(folder), page_size=4, mem_budget_gb=0.01) as e:
        stats = e.stats()
    per_layer = 2 * 2 * 16 * 4  # K and V, 2 kv heads, head_dim 16, fp32
    assert stats["kv_bytes_per_token_by_kind"] == {"global": per_layer, "window": 2 * per_layer}
    assert stats["kv_bytes_per_token"] == 3 * per_layer


def test_pool_holds_more_tokens_than_without_windows():
    config = config_from_dict(family_config("gemma3").to_dict())
    budget = 64 * 1024**2
    pages, window_pages = pool_pages(config, 16, 4, 512, budget_bytes=budget)
    plain, none = pool_pages(config, 16, 4, 512, budget_bytes=budget, separate_windows=False)
    assert none is None and window_pages is not None
    # 1 global + 2 window layers, window pages a quarter of the pages: 3 / (1 + 2 / 4) = 2x
    assert pages > 1.9 * plain
    per_layer = 2 * 2 * 16 * 4
    used = pages * 16 * per_layer + window_pages * 16 * 2 * per_layer
    assert used <= budget


@pytest.mark.parametrize(
    "has, window, expected",
    [
        pytest.param([1, 1, 1, 1], 8, 16, id="all-kept"),
        pytest.param([0, 0, 1, 1], 8, 16, id="only-the-last-window-needed"),
        pytest.param([0, 1, 1, 0], 8, 12, id="cut-back-to-a-kept-window"),
        pytest.param([0, 0, 0, 1], 8, 0, id="one-kept-page-is-short-of-the-window"),
        pytest.param([1, 1, 0, 0], 8, 8, id="tail-dropped"),
        pytest.param([0, 1, 0, 0], 8, 0, id="nothing-usable"),
        pytest.param([0, 0, 0, 1], 5, 16, id="window-within-one-page"),
        pytest.param([1, 0, 1, 1], 1, 16, id="window-of-one-needs-nothing-cached"),
    ],
)
def test_usable_prefix(has, window, expected):
    w = WindowPages(num_pages=8, window_pages=8, window=window)
    w.attach([p + 1 for p, kept in enumerate(has) if kept])
    assert w.usable_prefix([1, 2, 3, 4], page_size=4) == expected


def test_window_slots_move_and_drop():
    w = WindowPages(num_pages=6, window_pages=4, window=4)
    w.attach([1, 2, 3])
    assert w.num_free == 0
    assert w.drop([2]) == 1 and not w.has(2) and w.num_free == 1
    w.move(3, 2)
    assert w.has(2) and not w.has(3) and int(w.map[2]) == w.slot_of[2]
    w.check({1, 2, 3})
    with pytest.raises(AssertionError, match="free pages"):
        w.check({1, 3})


def test_split_budget_keeps_the_floor():
    assert min_window_pages(512, 512, 16) == 67
    pages, window_pages = split_budget(100, 300, 10_000_000, 16, 0.25, 67)
    assert window_pages == max(67, -(-pages // 4))
    assert pages * 16 * 100 + window_pages * 16 * 300 <= 10_000_000


def test_kv_size_prints_the_window_cap(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(family_config("gemma3").to_dict()))
    assert kv_size_main([str(path), "--context", "4096", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert f"2 of 3 layers attend to the last {WINDOW} tokens" in out
    assert f"capped at {WINDOW} tokens per sequence" in out
    assert "global 256" in out and "window 512" in out
