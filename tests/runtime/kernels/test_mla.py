"""Paged latent (MLA) decode attention: the torch reference against dense naive attention over
pages gathered by hand, the Triton kernel against the reference, and the package dispatch.

On CPU (the default, and CI) the Triton kernel runs in Triton's interpreter
(tests/support/triton_kernels.py); ``SGL_KERNEL_TEST_DEVICE=cuda`` runs the same cases compiled
on a GPU (benchmarks/gpu_check.sh). Tolerances are those of
tests/runtime/kernels/test_attention.py: outputs are softmax-weighted averages of standard-normal
latents (magnitude ~1).
  fp32 1e-4 / 1e-4, fp16 5e-3 / 5e-3, bf16 4e-2 / 2e-2 (Triton vs reference, same dtype)
  reference (fp32) vs naive float64: 1e-5 / 1e-5
"""

from __future__ import annotations

import math

import pytest
import torch

from runtime.kernels import reference
from tests.support.triton_kernels import DEVICE, DTYPES, TOL, triton_kernels

# interpreted on CPU (TRITON_INTERPRET=1 for the whole session: tests/conftest.py)
triton_mla, TRITON_ERROR = triton_kernels("triton.mla")
needs_triton = pytest.mark.skipif(triton_mla is None, reason=TRITON_ERROR or "")
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("SGL_KERNEL_TEST_DEVICE=cuda but CUDA is not available", allow_module_level=True)


class PagedLatent:
    """Per-request latents [n, R + Dr] scattered into a shuffled page pool with a page table."""

    def __init__(self, lens, page_size, width, dtype, seed):
        gen = torch.Generator().manual_seed(seed)
        pages_per = [math.ceil(n / page_size) for n in lens]
        num_pages = sum(pages_per) + 2  # spare pages hold garbage that must never be read
        pool = torch.randn(num_pages, page_size, 1, width, generator=gen) * 100
        order = torch.randperm(num_pages, generator=gen)
        # one spare column of -1: entries past a request's last page are never dereferenced
        table = torch.full((len(lens), max(pages_per, default=0) + 1), -1, dtype=torch.int32)
        used = 0
        for b, n in enumerate(lens):
            table[b, : pages_per[b]] = order[used : used + pages_per[b]].int()
            used += pages_per[b]
            for j in range(n):  # in-page slots past the request's length keep the garbage
                pool[table[b, j // page_size], j % page_size, 0] = torch.randn(width, generator=gen)
        self.pool = pool.to(DEVICE, dtype)
        self.page_table = table.to(DEVICE)
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)


def naive_latent_attention(q, pool, page_table, lens, scale, rank):
    """Dense float64 MLA decode: each request's latents gathered token by token."""
    out = torch.zeros(q.shape[0], q.shape[1], rank, dtype=torch.float64)
    pool, table = pool.double().cpu(), page_table.cpu()
    page_size = pool.shape[1]
    for b, n in enumerate(lens):
        if n == 0:
            continue
        latent = torch.stack([pool[table[b, j // page_size], j % page_size, 0] for j in range(n)])
        scores = (q[b].double().cpu() @ latent.T) * scale  # [H, n]
        out[b] = torch.softmax(scores, dim=-1) @ latent[:, :rank]
    return out


def _inputs(lens, page_size, heads, rank, rope_dim, dtype, seed=0):
    kv = PagedLatent(lens, page_size, rank + rope_dim, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(lens), heads, rank + rope_dim, generator=gen).to(DEVICE, dtype)
    return kv, q, 1 / math.sqrt(rank + rope_dim)


# (seq lens, page size, heads, R, Dr, dtype): lens mostly not multiples of the page size, an
# empty sequence, heads below / above one 16-head block, R + Dr = 48 and DeepSeek's 512 + 64.
CASES = [
    pytest.param([7], 1, 1, 32, 16, "f32", id="b1-ps1-h1-r32-f32"),
    pytest.param([5, 1, 37], 4, 3, 32, 16, "f32", id="b3-ps4-h3-r32-f32"),
    pytest.param([33, 0, 16], 16, 16, 32, 16, "f32", id="b3-ps16-h16-r32-empty-f32"),
    pytest.param([12, 26], 5, 20, 32, 16, "f32", id="b2-ps5-h20-r32-odd-page-f32"),
    pytest.param([19, 40], 4, 8, 32, 16, "bf16", id="b2-ps4-h8-r32-bf16"),
    pytest.param([9, 3], 16, 5, 32, 16, "f16", id="b2-ps16-h5-r32-f16"),
    pytest.param([10, 2], 4, 6, 40, 8, "f32", id="b2-ps4-h6-r40-dr8-f32"),
    pytest.param([3, 20], 16, 4, 512, 64, "f32", id="b2-ps16-h4-r512-f32"),
    pytest.param([21, 0, 6], 8, 18, 512, 64, "bf16", id="b3-ps8-h18-r512-empty-bf16"),
]


@pytest.mark.parametrize("lens,page_size,heads,rank,rope_dim,dt", CASES)
def test_latent_reference_matches_naive(lens, page_size, heads, rank, rope_dim, dt):
    kv, q, scale = _inputs(lens, page_size, heads, rank, rope_dim, DTYPES[dt])
    got = reference.paged_latent_decode_attention(
        q.float(), kv.pool.float(), kv.page_table, kv.seq_lens, scale, rank
    )
    assert got.shape == (len(lens), heads, rank) and got.dtype == torch.float32
    want = naive_latent_attention(q, kv.pool, kv.page_table, lens, scale, rank)
    torch.testing.assert_close(got.double().cpu(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "impl",
    [
        pytest.param("torch", id="torch"),
        pytest.param("triton", id="triton", marks=needs_triton),
    ],
)
def test_latent_empty_batch_and_sequences(impl):
    module = reference if impl == "torch" else triton_mla
    kv, q, scale = _inputs([0, 0], 4, 3, 32, 16, torch.float32)
    out = module.paged_latent_decode_attention(q, kv.pool, kv.page_table, kv.seq_lens, scale, 32)
    assert out.shape == (2, 3, 32) and torch.count_nonzero(out) == 0
    empty = module.paged_latent_decode_attention(
        q[:0], kv.pool, kv.page_table[:0], kv.seq_lens[:0], scale, 32
    )
    assert empty.shape == (0, 3, 32)


@needs_triton
@pytest.mark.parametrize("lens,page_size,heads,rank,rope_dim,dt", CASES)
def test_latent_triton_matches_reference(lens, page_size, heads, rank, rope_dim, dt):
    dtype = DTYPES[dt]
    kv, q, scale = _inputs(lens, page_size, heads, rank, rope_dim, dtype)
    args = (q, kv.pool, kv.page_table, kv.seq_lens, scale, rank)
    got = triton_mla.paged_latent_decode_attention(*args)
    want = reference.paged_latent_decode_attention(*args)
    assert got.dtype == dtype and got.shape == (len(lens), heads, rank)
    assert torch.count_nonzero(got[[b for b, n in enumerate(lens) if n == 0]]) == 0
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@needs_triton
@pytest.mark.parametrize("num_splits,block_n", [(1, 16), (3, 16), (8, 32)])
def test_latent_triton_split_counts_agree(num_splits, block_n):
    # 8 splits of a 5-token sequence leave empty splits that the merge must ignore
    kv, q, scale = _inputs([5, 26], 4, 3, 32, 16, torch.float32, seed=3)
    args = (q, kv.pool, kv.page_table, kv.seq_lens, scale, 32)
    got = triton_mla.paged_latent_decode_attention(*args, num_splits=num_splits, block_n=block_n)
    torch.testing.assert_close(got, reference.paged_latent_decode_attention(*args))


@needs_triton
def test_latent_triton_wider_head_blocks():
    kv, q, scale = _inputs([11, 30], 4, 40, 32, 16, torch.float32, seed=4)
    args = (q, kv.pool, kv.page_table, kv.seq_lens, scale, 32)
    got = triton_mla.paged_latent_decode_attention(*args, block_h=32)
    torch.testing.assert_close(got, reference.paged_latent_decode_attention(*args))


@pytest.mark.parametrize(
    "impl",
    [
        pytest.param("torch", id="torch"),
        pytest.param("triton", id="triton", marks=needs_triton),
    ],
)
def test_latent_shape_errors(impl):
    module = reference if impl == "torch" else triton_mla
    kv, q, scale = _inputs([4], 4, 2, 32, 16, torch.float32)
    table, lens = kv.page_table, kv.seq_lens
    cases = [
        (q[..., :40], kv.pool, 32, "latent width mismatch"),
        (q, kv.pool.expand(-1, -1, 2, -1), 32, r"latent_pool must be \[num_pages"),
        (q[0], kv.pool, 32, r"q must be \[batch, heads"),
        (q, kv.pool, 0, "rank must be in 1..48"),
        (q, kv.pool, 49, "rank must be in 1..48"),
    ]
    for q_arg, pool, rank, message in cases:
        with pytest.raises(ValueError, match=message):
            module.paged_latent_decode_attention(q_arg, pool, table, lens, scale, rank)
    if impl == "triton":
        with pytest.raises(ValueError, match="contiguous"):
            module.paged_latent_decode_attention(
                q.transpose(1, 2).contiguous().transpose(1, 2), kv.pool, table, lens, scale, 32
            )
        with pytest.raises(ValueError, match="latent_pool is torch.bfloat16"):
            module.paged_latent_decode_attention(q, kv.pool.bfloat16(), table, lens, scale, 32)


@needs_triton
def test_latent_dispatch_through_package(monkeypatch):
    from runtime import kernels

    assert "paged_latent_decode_attention" in kernels.__all__
    kv, q, scale = _inputs([6, 9], 4, 3, 32, 16, torch.float32, seed=7)
    args = (q, kv.pool, kv.page_table, kv.seq_lens, scale, 32)
    want = reference.paged_latent_decode_attention(*args)
    monkeypatch.setenv("SGL_KERNELS", "triton")
    assert kernels.kernel_backend(q) == "triton"
    torch.testing.assert_close(kernels.paged_latent_decode_attention(*args), want)
    monkeypatch.setenv("SGL_KERNELS", "torch")
    torch.testing.assert_close(kernels.paged_latent_decode_attention(*args), want)
