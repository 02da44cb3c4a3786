"""Prefill-sized products of bf16 inputs with the formats quant.c's products do not pack (Q5_0,
Q5_1, Q4_K, Q5_K, Q6_K) multiply a bf16 copy of the weight (csrc/dequant_bf16.c): the copy is
the float32 dequantization rounded to bf16, bit for bit; the product is torch's bf16 matmul of
it; fewer rows, float outputs, packed formats and CPUs without native bf16 keep their paths."""

from __future__ import annotations

import pytest
import torch

from runtime.kernels.cpu import quant as cpu_quant
from tests.runtime.kernels.test_quant import random_weight

pytestmark = pytest.mark.skipif(cpu_quant.library() is None, reason="no C compiler")

BF16_FORMATS = ["Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("name", BF16_FORMATS)
@pytest.mark.parametrize("threads", [1, 2])
def test_the_bf16_copy_is_the_float32_dequantization_rounded(name, threads):
    _, w = random_weight(name, 203, 512, seed=3)  # tail rows past an even split
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_quant.dequantize_bf16(w).clone()
    finally:
        torch.set_num_threads(before)
    assert torch.equal(_bits(got), _bits(w.dequantize().to(torch.bfloat16)))


def test_a_stack_with_a_packed_part_goes_through_float32_for_that_part():
    _, a = random_weight("Q5_0", 40, 256, seed=4)
    _, b = random_weight("Q8_0", 24, 256, seed=5)
    b.pack()  # a packed format: no bf16 pass of its own
    w = cpu_quant.stack_rows([a, b])
    expected = torch.cat([a.dequantize(), b.dequantize()]).to(torch.bfloat16)
    assert torch.equal(_bits(cpu_quant.dequantize_bf16(w)), _bits(expected))


@pytest.fixture
def native_bf16(monkeypatch):
    """The bf16 path as on a CPU with native bf16 dot products (it is decided per CPU)."""
    monkeypatch.setattr(cpu_quant, "_native_bf16", True)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_0"])
def test_prefill_sized_bf16_inputs_multiply_the_bf16_copy(name, native_bf16):
    _, w = random_weight(name, 96, 512, seed=6)
    x = torch.randn(cpu_quant.BF16_DENSE_ROWS + 5, 512).to(torch.bfloat16)
    y = cpu_quant.linear(x, w)
    assert y.dtype == torch.bfloat16
    expected = torch.nn.functional.linear(x, w.dequantize().to(torch.bfloat16))
    assert torch.equal(y, expected)
    # within bf16 rounding of the float32 product
    exact = torch.nn.functional.linear(x.float(), w.dequantize())
    assert (y.float() - exact).abs().max() <= 2e-2 * exact.abs().max()


def test_other_calls_keep_their_paths(native_bf16, monkeypatch):
    calls = []
    real = cpu_quant.dequantize_bf16
    monkeypatch.setattr(cpu_quant, "dequantize_bf16", lambda w: calls.append(1) or real(w))
    _, k = random_weight("Q4_K", 64, 256, seed=7)
    _, packed = random_weight("Q4_1", 64, 256, seed=8)
    many = torch.randn(cpu_quant.DENSE_ROWS + 3, 256).to(torch.bfloat16)
    few = many[: cpu_quant.BF16_DENSE_ROWS - 1].contiguous()
    cpu_quant.linear(few, k)  # fewer rows: the integer product
    cpu_quant.linear(many, k, float_out=True)  # a float32 result: the float32 product
    cpu_quant.linear(many.float(), k)  # float32 inputs
    cpu_quant.linear(many, packed)  # a packed format
    assert calls == []
    cpu_quant.linear(many, k)
    assert calls == [1]
    monkeypatch.setattr(cpu_quant, "_native_bf16", False)  # no native bf16: float32 as before
    y = cpu_quant.linear(many, k)
    expected = torch.nn.functional.linear(many.float(), k.dequantize()).to(torch.bfloat16)
    assert calls == [1] and torch.equal(y, expected)
