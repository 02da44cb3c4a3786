"""Cascade decode attention (shared prefix read once) equals plain paged decode attention."""

from __future__ import annotations

import pytest
import torch

from runtime.kernels import reference
from runtime.kernels.cascade import cascade_decode_attention, plan_cascade


@pytest.mark.parametrize(
    ("shared_pages", "tails", "hq", "hkv"),
    [
        pytest.param(3, [1, 5, 9, 4], 4, 2, id="gqa-4-requests"),
        pytest.param(2, [2, 2], 2, 2, id="mha-2-requests"),
        pytest.param(5, [7], 6, 3, id="one-request-no-group"),
        pytest.param(1, [3, 3, 3], 4, 1, id="too-short-to-share"),
    ],
)
def test_cascade_matches_reference(monkeypatch, shared_pages, tails, hq, hkv):
    from runtime.kernels import cascade as cascade_attention

    # tiny shapes: switch off the "is it worth it" thresholds so the cascade path runs
    monkeypatch.setattr(cascade_attention, "MIN_SHARED_TO_TAIL", 0)
    monkeypatch.setattr(cascade_attention, "MIN_TOKENS_SAVED", 0)
    torch.manual_seed(0)
    ps, d, num_pages = 4, 8, 64
    k_pool = torch.randn(num_pages, ps, hkv, d)
    v_pool = torch.randn(num_pages, ps, hkv, d)
    shared = list(range(1, 1 + shared_pages))
    next_page = 1 + shared_pages
    rows, lens = [], []
    for tail in tails:
        own = list(range(next_page, next_page + -(-tail // ps)))
        next_page += len(own)
        rows.append(shared + own)
        lens.append(shared_pages * ps + tail)
    width = max(len(r) for r in rows) + 1
    table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32)
    # an unrelated request in the same batch
    table = torch.cat([table, torch.tensor([[40, 41] + [0] * (width - 2)], dtype=torch.int32)])
    seq_lens = torch.tensor(lens + [6], dtype=torch.int32)
    q = torch.randn(len(seq_lens), hq, d)
    plan = plan_cascade(table, seq_lens, ps)
    assert plan.useful == (len(tails) > 1 and shared_pages >= 2)
    got = cascade_decode_attention(q, k_pool, v_pool, table, seq_lens, 0.3, plan)
    want = reference.paged_decode_attention(q, k_pool, v_pool, table, seq_lens, 0.3)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(
    ("shared_pages", "tail", "group", "useful"),
    [
        pytest.param(96, 40, 64, True, id="few-shot-prefix"),
        pytest.param(5, 200, 16, False, id="short-system-prompt"),
        pytest.param(5, 40, 16, False, id="too-few-tokens-saved"),
    ],
)
def test_cascade_is_used_only_when_it_pays(shared_pages, tail, group, useful):
    ps = 16
    rows = [list(range(1, 1 + shared_pages)) + [1000 + b] * -(-tail // ps) for b in range(group)]
    table = torch.tensor(rows, dtype=torch.int32)
    lens = torch.full((group,), shared_pages * ps + tail, dtype=torch.int32)
    assert plan_cascade(table, lens, ps).useful == useful


@pytest.mark.parametrize(
    ("prefixes", "extends", "hq", "hkv"),
    [
        pytest.param([5, 0, 12], [3, 7, 1], 4, 2, id="gqa-mixed"),
        pytest.param([8, 8], [4, 4], 2, 2, id="mha-equal"),
        pytest.param([0, 30], [16, 2], 6, 3, id="prompt-and-jump"),
    ],
)
def test_short_extend_matches_reference(prefixes, extends, hq, hkv):
    from runtime.kernels.short_extend import plan_short_extend, short_extend_attention

    torch.manual_seed(1)
    ps, d, num_pages = 4, 8, 64
    k_pool = torch.randn(num_pages, ps, hkv, d)
    v_pool = torch.randn(num_pages, ps, hkv, d)
    perm = torch.randperm(num_pages - 1) + 1
    width = max(-(-(p + e) // ps) for p, e in zip(prefixes, extends, strict=True))
    table = perm[: len(prefixes) * width].view(len(prefixes), width).to(torch.int32)
    pre = torch.tensor(prefixes, dtype=torch.int32)
    ext = torch.tensor(extends, dtype=torch.int32)
    q = torch.randn(int(ext.sum()), hq, d)
    plan = plan_short_extend(table, pre, ext, ps)
    assert plan is not None
    got = short_extend_attention(q, k_pool, v_pool, 0.3, plan)
    want = reference.paged_extend_attention(q, k_pool, v_pool, table, pre, ext, 0.3)
    assert torch.allclose(got, want, atol=1e-5)
