"""Extend attention split at the cached prefix (`runtime/kernels/prefix_extend.py`): the same
result as the reference kernel for groups sharing prefix pages, requests alone, prefixes that
end mid-page, chunks of one token and of many, and the engine's greedy tokens unchanged."""

from __future__ import annotations

import pytest
import torch

from runtime.kernels import reference
from runtime.kernels.prefix_extend import (
    MIN_SHARED_PAGES,
    plan_prefix_extend,
    prefix_extend_attention,
)

PS, D = 4, 8


def _batch(shared_pages: int, own_prefix: list[int], extends: list[int], hkv: int,
           dtype=torch.float32, seed: int = 0):  # fmt: skip
    """Requests behind `shared_pages` common pages, each with `own_prefix[r]` more cached
    tokens and `extends[r]` new ones, on their own pages (page 0 unused)."""
    torch.manual_seed(seed)
    num_pages = 256
    k_pool = torch.randn(num_pages, PS, hkv, D).to(dtype)
    v_pool = torch.randn(num_pages, PS, hkv, D).to(dtype)
    shared = list(range(1, 1 + shared_pages))
    nxt = 1 + shared_pages
    rows, prefixes = [], []
    for own, ext in zip(own_prefix, extends, strict=True):
        need = -(-(own + ext) // PS)
        rows.append(shared + list(range(nxt, nxt + need)))
        nxt += need
        prefixes.append(shared_pages * PS + own)
    width = max(len(r) for r in rows) + 2
    table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32)
    return k_pool, v_pool, table, torch.tensor(prefixes), torch.tensor(extends)


@pytest.mark.parametrize(
    ("shared_pages", "own_prefix", "extends", "hq", "hkv", "groups"),
    [
        pytest.param(3, [0, 0, 0, 0], [3, 1, 6, 2], 4, 2, 1, id="questions-behind-one-prefix"),
        pytest.param(2, [3, 0, 5], [2, 4, 1], 6, 3, 1, id="prefixes-ending-mid-page"),
        pytest.param(4, [1], [9], 2, 2, 1, id="one-request-mid-page"),
        pytest.param(0, [0, 2], [7, 3], 4, 1, 2, id="no-prefix-and-a-short-one"),
        pytest.param(1, [0, 0], [2, 2], 4, 2, 2, id="too-little-shared-to-group"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_extend_equals_the_reference(shared_pages, own_prefix, extends, hq, hkv, groups,
                                           dtype):  # fmt: skip
    k_pool, v_pool, table, prefixes, ext = _batch(shared_pages, own_prefix, extends, hkv, dtype)
    q = torch.randn(int(ext.sum()), hq, D).to(dtype)
    plan = plan_prefix_extend(table, prefixes, ext, PS, hq // hkv)
    assert len(plan.groups) == groups
    got = prefix_extend_attention(q, k_pool, v_pool, 0.35, plan)
    want = reference.paged_extend_attention(q, k_pool, v_pool, table, prefixes, ext, 0.35)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_a_request_with_nothing_new_is_left_out():
    k_pool, v_pool, table, prefixes, ext = _batch(3, [0, 0, 0], [2, 0, 3], 2)
    q = torch.randn(5, 4, D)
    plan = plan_prefix_extend(table, prefixes, ext, PS, 2)
    assert sum(g.q_rows.numel() for g in plan.groups) == 5
    got = prefix_extend_attention(q, k_pool, v_pool, 0.35, plan)
    want = reference.paged_extend_attention(q, k_pool, v_pool, table, prefixes, ext, 0.35)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_shared_only_plans_only_when_requests_share_pages():
    """The model asks first for a plan only if some requests share a prefix (else its
    short-chunk path is cheaper for jump-forward extends)."""
    grouped = _batch(MIN_SHARED_PAGES, [0, 0], [2, 3], 2)
    apart = _batch(0, [6, 9], [2, 3], 2)
    assert plan_prefix_extend(*grouped[2:], PS, 2, shared_only=True) is not None
    assert plan_prefix_extend(*apart[2:], PS, 2, shared_only=True) is None
    assert len(plan_prefix_extend(*apart[2:], PS, 2).groups) == 2


def test_a_group_whose_padded_tails_are_too_large_goes_alone(monkeypatch):
    from runtime.kernels import prefix_extend

    k_pool, v_pool, table, prefixes, ext = _batch(3, [0, 9], [2, 8], 2)
    assert len(plan_prefix_extend(table, prefixes, ext, PS, 2).groups) == 1
    monkeypatch.setattr(prefix_extend, "MAX_TAIL_CELLS", 8)
    plan = plan_prefix_extend(table, prefixes, ext, PS, 2)
    assert len(plan.groups) == 2 and all(g.mask is None for g in plan.groups)
    q = torch.randn(10, 4, D)
    got = prefix_extend_attention(q, k_pool, v_pool, 0.35, plan)
    want = reference.paged_extend_attention(q, k_pool, v_pool, table, prefixes, ext, 0.35)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from tests.support.tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("prefix_extend") / "llama", "llama")


def test_engine_tokens_are_the_same_with_and_without_the_split(llama, monkeypatch):
    """Questions behind one cached prefix, in one batch (the few-shot workload's shape): the
    split path runs (counted) and the greedy tokens equal those of the path without it."""
    from runtime import Engine
    from runtime.kernels import prefix_extend

    calls = []
    original = prefix_extend.prefix_extend_attention

    def counted(*args, **kwargs):
        calls.append(args[-1])
        return original(*args, **kwargs)

    prefix = "the quick brown fox jumps over the lazy dog " * 6
    prompts = [prefix + f"question {i}: why {'?' * (i % 4 + 1)}" for i in range(6)]
    outs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("SGL_PREFIX_EXTEND", flag)
        monkeypatch.setattr("runtime.attention.cpu_backend.prefix_extend_attention", counted)
        calls.clear()
        with Engine(str(llama), page_size=4, dtype="float32") as engine:
            engine.generate(prompts[0], max_new_tokens=1, temperature=0.0)  # caches the prefix
            results = engine.generate(prompts, max_new_tokens=8, temperature=0.0)
        outs[flag] = [r.token_ids for r in results]
        grouped = [g for plan in calls for g in plan.groups if g.shared_slots is not None]
        assert bool(grouped) == (flag == "1")
    assert outs["1"] == outs["0"]
