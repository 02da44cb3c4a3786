"""The per-step decode plan (runtime/kernels/decode_plan.py) gives exactly the reference's
numbers: same gathers, same SDPA call, planned once for all layers."""

from __future__ import annotations

import pytest
import torch

from runtime.kernels import reference
from runtime.kernels.decode_plan import plan_decode, planned_decode_attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "lens",
    [pytest.param([1, 5, 9, 30, 17], id="ragged"), pytest.param([8, 8, 8, 8, 8], id="equal"),
     pytest.param([0, 3, 4, 0, 1], id="empty-rows"), pytest.param([], id="no-rows")],
)  # fmt: skip
def test_planned_decode_equals_reference(dtype, lens):
    g = torch.Generator().manual_seed(len(lens))
    batch, q_heads, kv_heads, dim, page_size, pages = len(lens), 6, 2, 16, 4, 50
    k_pool = torch.randn(pages, page_size, kv_heads, dim, generator=g).to(dtype)
    v_pool = torch.randn(pages, page_size, kv_heads, dim, generator=g).to(dtype)
    table = torch.randint(0, pages, (batch, 8), dtype=torch.int32, generator=g)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(batch, q_heads, dim, generator=g).to(dtype)
    want = reference.paged_decode_attention(q, k_pool, v_pool, table, seq_lens, 0.3)
    plan = plan_decode(table, seq_lens, page_size, pages)
    got = planned_decode_attention(q, k_pool, v_pool, plan, 0.3)
    assert torch.equal(got, want)
