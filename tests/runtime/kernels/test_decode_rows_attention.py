"""Decode attention for several rows of one request (a verify's rows: one page table, positions
p, p + 1, ...): read together, each row gets the bits it gets alone, and what torch's softmax
attention over its own keys gives (bf16 / fp32, head sizes 64 / 96 / 128, windows)."""

from __future__ import annotations

import pytest
import torch

from runtime.kernels.cpu import fused as cpu_fused

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
PS = 16

pytestmark = pytest.mark.skipif(
    not cpu_fused.available(torch.float32), reason="no C compiler: the torch ops run instead"
)


def _rand(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _request(lens: list[int], hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int):
    """Pools, one shuffled page table repeated for every row, the rows' queries."""
    pages = -(-max(lens) // PS) + 1
    k_pool = _rand(pages + 4, PS, hkv, d, dtype=dtype, seed=seed)
    v_pool = _rand(pages + 4, PS, hkv, d, dtype=dtype, seed=seed + 1)
    order = torch.randperm(pages + 3, generator=torch.Generator().manual_seed(seed + 2))[:pages]
    table = (order + 1).to(torch.int32).repeat(len(lens), 1)
    q = _rand(len(lens), hq, d, dtype=dtype, seed=seed + 3)
    return k_pool, v_pool, table, q


def _torch_attention(q, k_pool, v_pool, table_row, n, hq, window, scale):
    """One row against its keys (the last `window` of its n, or all) with torch.softmax."""
    hkv, d = k_pool.shape[2], k_pool.shape[3]
    keys = torch.arange(max(0, n - window) if window else 0, n)
    where = table_row[keys // PS].long() * PS + keys % PS
    k = k_pool.float().view(-1, hkv, d)[where].repeat_interleave(hq // hkv, dim=1)
    v = v_pool.float().view(-1, hkv, d)[where].repeat_interleave(hq // hkv, dim=1)
    p = torch.softmax(torch.einsum("hd,khd->hk", q.float() * scale, k), dim=-1)
    return torch.einsum("hk,khd->hd", p, v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "d"), [(9, 3, 64), (4, 2, 96), (8, 2, 128)])
@pytest.mark.parametrize(
    "lens",
    [
        pytest.param(list(range(100, 109)), id="nine-rows"),
        pytest.param(list(range(31, 34)), id="across-a-page-end"),
        pytest.param(list(range(1, 17)), id="sixteen-from-one-key"),
        pytest.param(list(range(60, 80)), id="twenty-rows"),  # more than one group
    ],
)
def test_rows_together_equal_rows_alone_and_torch(dtype, hq, hkv, d, lens):
    k_pool, v_pool, table, q = _request(lens, hq, hkv, d, dtype, seed=len(lens) + d)
    rows = cpu_fused.DecodeRows.of(table, torch.tensor(lens))
    together = cpu_fused.decode_attention(q, k_pool, v_pool, rows, 0.125)
    for i, n in enumerate(lens):
        one = cpu_fused.DecodeRows.of(table[i : i + 1], torch.tensor([n]))
        alone = cpu_fused.decode_attention(q[i : i + 1], k_pool, v_pool, one, 0.125)
        assert torch.equal(together[i], alone[0])  # the same sums in the same order
        want = _torch_attention(q[i], k_pool, v_pool, table[i], n, hq, 0, 0.125)
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(together[i].float(), want, atol=tol, rtol=tol)


def test_rows_with_different_tables_or_gaps_are_attended_each_alone():
    # same lengths pattern, but the second row's table differs and the fourth skips a position:
    # each row still attends to its own pages and keys
    dtype, hq, hkv, d, lens = torch.float32, 4, 2, 64, [40, 41, 42, 44, 45]
    k_pool, v_pool, table, q = _request(lens, hq, hkv, d, dtype, seed=7)
    table[1] = table[1].flip(0)
    rows = cpu_fused.DecodeRows.of(table, torch.tensor(lens))
    got = cpu_fused.decode_attention(q, k_pool, v_pool, rows, 0.125)
    for i, n in enumerate(lens):
        want = _torch_attention(q[i], k_pool, v_pool, table[i], n, hq, 0, 0.125)
        torch.testing.assert_close(got[i], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("window", [12, 16, 40])
def test_rows_together_with_a_window(dtype, d, window):
    """Each row of a request attends to its own last `window` keys (each row's window starts
    one key later), through the fused decode step that carries the window."""
    hq, hkv, lens, scale = 4, 2, list(range(30, 39)), 0.125
    b = len(lens)
    k_pool, v_pool, table, _ = _request(lens, hq, hkv, d, dtype, seed=d + window)
    qkv = _rand(b, (hq + 2 * hkv) * d, dtype=dtype, seed=31)
    cos, sin = _rand(64, d, dtype=dtype, seed=32), _rand(64, d, dtype=dtype, seed=33)
    positions = torch.tensor([n - 1 for n in lens])
    slots = torch.tensor([int(table[i, (n - 1) // PS]) * PS + (n - 1) % PS
                          for i, n in enumerate(lens)])  # fmt: skip
    rows = cpu_fused.DecodeRows.of(table, torch.tensor(lens))
    step = cpu_fused.RopeDecode(cos, sin, positions, slots, rows, hq, k_pool, dtype,
                                window=window)  # fmt: skip
    got = step(qkv, k_pool, v_pool, scale)
    for i, n in enumerate(lens):
        want = _torch_attention(step.q[i], k_pool, v_pool, table[i], n, hq, window, scale)
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(got[i].float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_together_over_an_fp8_pool_equal_rows_alone(dtype):
    if not cpu_fused.available(torch.float8_e4m3fn):
        pytest.skip("no fp8 decode attention in this build")
    lens, hq, hkv, d = list(range(50, 59)), 9, 3, 64
    k_pool, v_pool, table, q = _request(lens, hq, hkv, d, dtype, seed=41)
    k_pool, v_pool = k_pool.to(torch.float8_e4m3fn), v_pool.to(torch.float8_e4m3fn)
    rows = cpu_fused.DecodeRows.of(table, torch.tensor(lens))
    together = cpu_fused.decode_attention(q, k_pool, v_pool, rows, 0.125)
    for i, n in enumerate(lens):
        one = cpu_fused.DecodeRows.of(table[i : i + 1], torch.tensor([n]))
        alone = cpu_fused.decode_attention(q[i : i + 1], k_pool, v_pool, one, 0.125)
        assert torch.equal(together[i], alone[0])
        want = _torch_attention(q[i], k_pool, v_pool, table[i], n, hq, 0, 0.125)
        torch.testing.assert_close(together[i].float(), want, atol=2e-2, rtol=2e-2)
