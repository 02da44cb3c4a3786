"""Paged decode / extend attention: the torch reference against dense naive attention, and the
Triton kernels against the reference.

On CPU (the default, and CI) the Triton kernels run in Triton's interpreter
(tests/support/triton_kernels.py). ``SGL_KERNEL_TEST_DEVICE=cuda`` runs the same cases
compiled on a GPU (benchmarks/gpu_check.sh).

Tolerances (max abs and rel error, elementwise ``torch.testing.assert_close``), all computed
against outputs of magnitude ~1 (softmax-weighted averages of standard-normal V):
  fp32 1e-4 / 1e-4   (observed ~1e-6: same math, different summation order)
  fp16 5e-3 / 5e-3   (both sides round the output to fp16: <= 1 ulp apart, plus P cast to fp16)
  bf16 4e-2 / 2e-2   (same, with bf16's 8x coarser ulp)
Reference vs naive dense attention (float64 naive, fp32 reference): 1e-5 / 1e-5.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from runtime.kernels import kernel_backend, reference
from tests.support.triton_kernels import DEVICE, DTYPES, TOL, triton_kernels

# interpreted on CPU (TRITON_INTERPRET=1 for the whole session: tests/conftest.py)
triton_attention, TRITON_ERROR = triton_kernels("triton.attention")
needs_triton = pytest.mark.skipif(triton_attention is None, reason=TRITON_ERROR or "")
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("SGL_KERNEL_TEST_DEVICE=cuda but CUDA is not available", allow_module_level=True)


class PagedKV:
    """Per-request contiguous K/V, scattered into a shuffled page pool with a page table."""

    def __init__(self, lens, page_size, kv_heads, head_dim, dtype, seed):
        gen = torch.Generator().manual_seed(seed)
        self.lens = list(lens)
        self.keys = [torch.randn(n, kv_heads, head_dim, generator=gen) for n in lens]
        self.values = [torch.randn(n, kv_heads, head_dim, generator=gen) for n in lens]
        pages_per = [math.ceil(n / page_size) for n in lens]
        num_pages = sum(pages_per) + 2  # spare pages hold garbage that must never be read
        shape = (num_pages, page_size, kv_heads, head_dim)
        k_pool = torch.randn(shape, generator=gen) * 100
        v_pool = torch.randn(shape, generator=gen) * 100
        order = torch.randperm(num_pages, generator=gen)
        # one spare column of -1: entries past a request's last page are never dereferenced
        table = torch.full((len(lens), max(pages_per, default=0) + 1), -1, dtype=torch.int32)
        used = 0
        for b, n in enumerate(lens):
            table[b, : pages_per[b]] = order[used : used + pages_per[b]].int()
            used += pages_per[b]
            for p in range(n):
                page, off = int(table[b, p // page_size]), p % page_size
                k_pool[page, off] = self.keys[b][p]
                v_pool[page, off] = self.values[b][p]
        self.k_pool = k_pool.to(DEVICE, dtype)
        self.v_pool = v_pool.to(DEVICE, dtype)
        self.page_table = table.to(DEVICE)
        # the naive path sees exactly the (rounded) values the pool holds
        self.keys = [k.to(dtype).double() for k in self.keys]
        self.values = [v.to(dtype).double() for v in self.values]


def naive_attention(q, keys, values, q_positions, scale):
    """Dense float64 attention of q [M, Hq, D] at q_positions over keys/values [L, Hkv, D]."""
    group = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1)  # [L, Hq, D]
    v = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,lhd->hml", q.double().cpu(), k) * scale
    causal = torch.arange(keys.shape[0])[None, :] <= torch.tensor(q_positions)[:, None]
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.einsum("hml,lhd->mhd", torch.softmax(scores, dim=-1), v)


def random_q(tokens, q_heads, head_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randn(tokens, q_heads, head_dim, generator=gen).to(DEVICE, dtype)


# (seq lens, page size, kv heads, group = Hq / Hkv, head dim, dtype); lens mostly not multiples
# of the page size, and a page size of 1 where every position is its own page.
DECODE_CASES = [
    pytest.param([7], 1, 2, 1, 64, "f32", id="b1-ps1-g1-d64-f32"),
    pytest.param([5, 1, 37], 4, 1, 3, 64, "f32", id="b3-ps4-g3-d64-f32"),
    pytest.param([33, 70, 16, 2], 16, 1, 8, 128, "f32", id="b4-ps16-g8-d128-f32"),
    pytest.param([9, 21], 1, 2, 3, 128, "f32", id="b2-ps1-g3-d128-f32"),
    pytest.param([45, 3, 17], 16, 2, 3, 64, "f16", id="b3-ps16-g3-d64-f16"),
    pytest.param([30, 11], 4, 1, 8, 128, "f16", id="b2-ps4-g8-d128-f16"),
    pytest.param([19, 40], 4, 2, 1, 64, "bf16", id="b2-ps4-g1-d64-bf16"),
    pytest.param([12, 26, 3], 5, 1, 3, 64, "f32", id="b3-ps5-g3-d64-odd-page-f32"),
]

# (prefix lens, extend lens, page size, kv heads, group, head dim, dtype); includes an empty
# prefix, an empty chunk, and chunks longer than one 32-query block.
EXTEND_CASES = [
    pytest.param([0], [9], 1, 2, 1, 64, "f32", id="b1-ps1-g1-d64-noprefix-f32"),
    pytest.param([5, 0, 13], [3, 6, 1], 4, 1, 3, 64, "f32", id="b3-ps4-g3-d64-f32"),
    pytest.param([20, 7], [37, 0], 16, 1, 8, 128, "f32", id="b2-ps16-g8-d128-emptychunk-f32"),
    pytest.param([2, 11, 0, 6], [5, 2, 4, 3], 1, 2, 3, 128, "f32", id="b4-ps1-g3-d128-f32"),
    pytest.param([17, 3], [6, 34], 16, 2, 3, 64, "f16", id="b2-ps16-g3-d64-f16"),
    pytest.param([9], [14], 4, 1, 8, 128, "f16", id="b1-ps4-g8-d128-f16"),
    pytest.param([10, 1], [7, 5], 4, 2, 1, 64, "bf16", id="b2-ps4-g1-d64-bf16"),
    pytest.param([8, 0], [9, 13], 5, 1, 3, 64, "f32", id="b2-ps5-g3-d64-odd-page-f32"),
]


def _random_shape(rng: random.Random) -> tuple[int, int, int, int, str]:
    """(page size, kv heads, group, head dim, dtype id) drawn from the tested grid."""
    return (
        rng.choice([1, 4, 16]),
        rng.choice([1, 2]),
        rng.choice([1, 3, 8]),
        rng.choice([64, 128]),
        rng.choice(["f32", "f32", "f16", "bf16"]),
    )


def _random_decode_cases(count: int, seed: int = 1234) -> list:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        lens = [rng.randint(1, 90) for _ in range(rng.choice([1, 2, 3, 6]))]
        ps, kvh, g, d, dt = _random_shape(rng)
        name = f"rand{i}-b{len(lens)}-ps{ps}-g{g}-d{d}-{dt}"
        cases.append(pytest.param(lens, ps, kvh, g, d, dt, id=name))
    return cases


def _random_extend_cases(count: int, seed: int = 4321) -> list:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        batch = rng.choice([1, 2, 3, 5])
        prefixes = [rng.choice([0, rng.randint(1, 60)]) for _ in range(batch)]
        extends = [rng.randint(0 if batch > 1 else 1, 40) for _ in range(batch)]
        ps, kvh, g, d, dt = _random_shape(rng)
        name = f"rand{i}-b{batch}-ps{ps}-g{g}-d{d}-{dt}"
        cases.append(pytest.param(prefixes, extends, ps, kvh, g, d, dt, id=name))
    return cases


DECODE_CASES += _random_decode_cases(10)
EXTEND_CASES += _random_extend_cases(10)


def _decode_inputs(lens, page_size, kv_heads, group, head_dim, dtype, seed=0):
    kv = PagedKV(lens, page_size, kv_heads, head_dim, dtype, seed)
    q = random_q(len(lens), kv_heads * group, head_dim, dtype, seed)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    return kv, q, seq_lens, 1 / math.sqrt(head_dim)


def _extend_inputs(prefixes, extends, page_size, kv_heads, group, head_dim, dtype, seed=0):
    lens = [p + e for p, e in zip(prefixes, extends, strict=True)]
    kv = PagedKV(lens, page_size, kv_heads, head_dim, dtype, seed)
    q = random_q(sum(extends), kv_heads * group, head_dim, dtype, seed)
    prefix_lens = torch.tensor(prefixes, dtype=torch.int32, device=DEVICE)
    extend_lens = torch.tensor(extends, dtype=torch.int32, device=DEVICE)
    return kv, q, prefix_lens, extend_lens, 1 / math.sqrt(head_dim)


@pytest.mark.parametrize("lens,page_size,kv_heads,group,head_dim,dt", DECODE_CASES)
def test_decode_reference_matches_naive(lens, page_size, kv_heads, group, head_dim, dt):
    kv, q, seq_lens, scale = _decode_inputs(lens, page_size, kv_heads, group, head_dim, DTYPES[dt])
    got = reference.paged_decode_attention(
        q.float(), kv.k_pool.float(), kv.v_pool.float(), kv.page_table, seq_lens, scale
    )
    for b, n in enumerate(lens):
        want = naive_attention(q[b : b + 1], kv.keys[b], kv.values[b], [n - 1], scale)[0]
        torch.testing.assert_close(got[b].double().cpu(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prefixes,extends,page_size,kv_heads,group,head_dim,dt", EXTEND_CASES)
def test_extend_reference_matches_naive(
    prefixes, extends, page_size, kv_heads, group, head_dim, dt
):
    kv, q, prefix_lens, extend_lens, scale = _extend_inputs(
        prefixes, extends, page_size, kv_heads, group, head_dim, DTYPES[dt]
    )
    got = reference.paged_extend_attention(
        q.float(), kv.k_pool.float(), kv.v_pool.float(), kv.page_table, prefix_lens,
        extend_lens, scale,
    )  # fmt: skip
    start = 0
    for b, (prefix, extend) in enumerate(zip(prefixes, extends, strict=True)):
        positions = list(range(prefix, prefix + extend))
        chunk = q[start : start + extend]
        want = naive_attention(chunk, kv.keys[b], kv.values[b], positions, scale)
        torch.testing.assert_close(
            got[start : start + extend].double().cpu(), want, atol=1e-5, rtol=1e-5
        )
        start += extend


@pytest.mark.parametrize(
    "impl",
    [
        pytest.param("torch", id="torch"),
        pytest.param("triton", id="triton", marks=needs_triton),
    ],
)
def test_decode_empty_sequence_gives_zeros(impl):
    kv, q, _, scale = _decode_inputs([4, 6], 4, 1, 3, 64, torch.float32)
    seq_lens = torch.tensor([0, 6], dtype=torch.int32, device=DEVICE)
    module = reference if impl == "torch" else triton_attention
    out = module.paged_decode_attention(q, kv.k_pool, kv.v_pool, kv.page_table, seq_lens, scale)
    assert torch.count_nonzero(out[0]) == 0
    assert torch.isfinite(out).all()
    want = reference.paged_decode_attention(
        q[1:], kv.k_pool, kv.v_pool, kv.page_table[1:], seq_lens[1:], scale
    )
    torch.testing.assert_close(out[1:], want, **TOL[torch.float32])


@needs_triton
@pytest.mark.parametrize("lens,page_size,kv_heads,group,head_dim,dt", DECODE_CASES)
def test_decode_triton_matches_reference(lens, page_size, kv_heads, group, head_dim, dt):
    dtype = DTYPES[dt]
    kv, q, seq_lens, scale = _decode_inputs(lens, page_size, kv_heads, group, head_dim, dtype)
    args = (q, kv.k_pool, kv.v_pool, kv.page_table, seq_lens, scale)
    got = triton_attention.paged_decode_attention(*args)
    want = reference.paged_decode_attention(*args)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@needs_triton
@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_decode_triton_split_counts_agree(num_splits):
    # 8 splits of a 5-token sequence leave empty splits that the merge must ignore
    kv, q, seq_lens, scale = _decode_inputs([5, 26], 4, 1, 3, 64, torch.float32, seed=3)
    args = (q, kv.k_pool, kv.v_pool, kv.page_table, seq_lens, scale)
    got = triton_attention.paged_decode_attention(*args, num_splits=num_splits)
    torch.testing.assert_close(got, reference.paged_decode_attention(*args), **TOL[torch.float32])


@needs_triton
@pytest.mark.parametrize("prefixes,extends,page_size,kv_heads,group,head_dim,dt", EXTEND_CASES)
def test_extend_triton_matches_reference(
    prefixes, extends, page_size, kv_heads, group, head_dim, dt
):
    dtype = DTYPES[dt]
    kv, q, prefix_lens, extend_lens, scale = _extend_inputs(
        prefixes, extends, page_size, kv_heads, group, head_dim, dtype
    )
    args = (q, kv.k_pool, kv.v_pool, kv.page_table, prefix_lens, extend_lens, scale)
    got = triton_attention.paged_extend_attention(*args)
    want = reference.paged_extend_attention(*args)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@needs_triton
def test_extend_triton_small_blocks_cross_many_pages():
    # 16-wide blocks over page size 4: every block spans several pages and the causal edge
    kv, q, prefix_lens, extend_lens, scale = _extend_inputs(
        [13, 30], [21, 18], 4, 2, 3, 64, torch.float32, seed=5
    )
    args = (q, kv.k_pool, kv.v_pool, kv.page_table, prefix_lens, extend_lens, scale)
    got = triton_attention.paged_extend_attention(*args, block_m=16, block_n=16)
    torch.testing.assert_close(got, reference.paged_extend_attention(*args), **TOL[torch.float32])


def test_decode_extend_dispatch_follows_env(monkeypatch):
    q = torch.zeros(1, 2, 64, device=DEVICE)
    monkeypatch.setenv("SGL_KERNELS", "torch")
    assert kernel_backend(q) == "torch"
    monkeypatch.setenv("SGL_KERNELS", "cuda-please")
    with pytest.raises(ValueError, match="SGL_KERNELS"):
        kernel_backend(q)
    monkeypatch.delenv("SGL_KERNELS")
    want = "triton" if (q.is_cuda and triton_attention is not None) else "torch"
    assert kernel_backend(q) == want


@needs_triton
def test_decode_extend_forced_triton_through_package(monkeypatch):
    from runtime import kernels

    monkeypatch.setenv("SGL_KERNELS", "triton")
    assert kernels.kernel_backend(torch.zeros(1, device=DEVICE)) == "triton"
    kv, q, seq_lens, scale = _decode_inputs([6, 9], 4, 1, 3, 64, torch.float32, seed=7)
    args = (q, kv.k_pool, kv.v_pool, kv.page_table, seq_lens, scale)
    torch.testing.assert_close(
        kernels.paged_decode_attention(*args), reference.paged_decode_attention(*args)
    )
    kv, q, prefix_lens, extend_lens, scale = _extend_inputs([3], [4], 4, 1, 3, 64, torch.float32)
    args = (q, kv.k_pool, kv.v_pool, kv.page_table, prefix_lens, extend_lens, scale)
    torch.testing.assert_close(
        kernels.paged_extend_attention(*args), reference.paged_extend_attention(*args)
    )
