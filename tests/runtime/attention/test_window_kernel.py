"""The C window kernel (runtime/kernels/cpu/window.py) against the torch backend's reference
(`general_attention`): sliding windows, soft caps, both together, decode rows and extend chunks
in one call, grouped query heads, any page size; it reads no page before a query's window; and
the cpu backend sends a windowed layer past its window to it instead of the reference."""

from __future__ import annotations

import pytest
import torch

from grammar import native_build
from runtime.attention.base import LayerSpec
from runtime.attention.torch_backend import general_attention
from runtime.kernels.cpu import window

pytestmark = pytest.mark.skipif(not window.available(torch.float32), reason="no C compiler")

PREFIX = [0, 37, 100, 5, 130, 64]  # a prompt from 0, decode rows (n = 1), extends behind
NEW = [50, 1, 13, 1, 20, 9]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _case(dtype, hq, hkv, d, ps, seed=0):
    g = torch.Generator().manual_seed(seed)
    pages = 240
    k = torch.randn(pages, ps, hkv, d, generator=g).to(dtype)
    v = torch.randn(pages, ps, hkv, d, generator=g).to(dtype)
    width = max((p + n + ps - 1) // ps for p, n in zip(PREFIX, NEW, strict=True))
    table = torch.stack([torch.randperm(pages - 1, generator=g)[:width] + 1 for _ in PREFIX])
    q = torch.randn(sum(NEW), hq, d, generator=g).to(dtype)
    return q, k, v, table.to(torch.int32)


def _ours(q, k, v, table, spec, prefix=PREFIX, new=NEW):
    lens = [torch.tensor(x, dtype=torch.int32) for x in (prefix, new)]
    return window.attention(q, k, v, table, *lens, spec.scale, spec.window, spec.soft_cap)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 1, 256, 16), (6, 2, 24, 4), (8, 8, 64, 1)])
@pytest.mark.parametrize("spec", [LayerSpec(0.1, 16), LayerSpec(0.1, 7, 30.0),
                                  LayerSpec(0.1, None, 5.0), LayerSpec(0.1, 1),
                                  LayerSpec(0.1)])  # fmt: skip
def test_equals_the_reference(dtype, shape, spec):
    q, k, v, table = _case(dtype, *shape)
    expected = general_attention(q, k, v, table, PREFIX, NEW, spec)
    out = _ours(q, k, v, table, spec)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


def test_reads_no_page_before_a_querys_window():
    """Entries of the page table before the window (pages given back, stale or -1) may point
    anywhere: the output is the same when they point at a page of NaNs or out of the pool."""
    q, k, v, table = _case(torch.float32, 4, 2, 32, 4)
    spec = LayerSpec(0.2, 12)
    expected = _ours(q, k, v, table, spec)
    k[0], v[0] = float("nan"), float("nan")
    stale = table.clone()
    for b, p in enumerate(PREFIX):
        first = max(0, p - spec.window + 1)  # the first key any of the chunk's queries sees
        stale[b, : first // 4] = 0 if b % 2 else -1
    out = _ours(q, k, v, stale, spec)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_takes_no_other_pool_type():
    q, k, v, table = _case(torch.float32, 4, 2, 32, 4)
    assert _ours(q, k.to(torch.bfloat16), v.to(torch.bfloat16), table, LayerSpec(0.1, 8)) is None


def test_an_empty_step_and_zero_length_chunks():
    q, k, v, table = _case(torch.float32, 4, 2, 32, 4)
    spec = LayerSpec(0.1, 8)
    assert _ours(q[:0], k, v, table[:1], spec, [5], [0]).shape == (0, 4, 32)
    new = [0, *NEW[1:]]
    expected = general_attention(q[NEW[0] :], k, v, table, PREFIX, new, spec)
    torch.testing.assert_close(_ours(q[NEW[0] :], k, v, table, spec, PREFIX, new), expected)


@pytest.mark.slow
@pytest.mark.parametrize("openmp", [True, False])
def test_the_unit_compiles_without_warnings(openmp):
    assert native_build.compile_warnings(window.units(openmp)) == {}


def test_the_cpu_backend_runs_windows_past_their_length_in_the_kernel(tmp_path, monkeypatch):
    """A tiny Gemma 3 (window 8): prompts longer than the window, and one that decode takes
    past it, in one batch; no call reaches the reference's general path; tokens equal
    transformers'."""
    from runtime import Engine
    from runtime.attention import torch_backend
    from tests.support.family_models import expected_tokens, make_family_model
    from tests.support.tiny_models import PROMPTS

    folder = make_family_model(tmp_path / "gemma3", "gemma3")
    prompts = [PROMPTS[1], PROMPTS[2], PROMPTS[3]]  # 21, 6 and 17 tokens
    expected = expected_tokens(folder, prompts, 6)
    general = []
    reference = torch_backend.general_attention
    monkeypatch.setattr(torch_backend, "general_attention",
                        lambda *a, **k: general.append(1) or reference(*a, **k))  # fmt: skip
    greedy = dict(max_new_tokens=6, min_new_tokens=6, temperature=0.0)
    with Engine(str(folder), page_size=4, attention_backend="cpu") as e:
        assert len(e.encode(prompts[0])) > 8 >= len(e.encode(prompts[1]))
        out = [r.token_ids for r in e.generate(prompts, **greedy)]
    assert out == [expected[p] for p in prompts]
    assert general == []
