"""Packed Q4_0 / Q4_1 products of several input rows (csrc/pk_q4_vnni.h where the CPU has VNNI,
from 6 rows two groups at once where it has AVX-512, pk_group_rows elsewhere): each row gives
the bits it gives alone, over any thread count (5 groups: two pairs and one alone; over 3
threads a pair that starts at an odd group), and
the portable build's bits, at the integer sums' extremes (4-bit values 0 and 15 against
inputs of +-32767, whose high bytes are 127 and -128)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from runtime.kernels.cpu import quant as cpu_quant
from runtime.kernels.cpu.quant import QuantTensor

pytestmark = pytest.mark.skipif(cpu_quant.library() is None, reason="no C compiler")

COLS = 320  # 10 blocks a row


def _weight(name: str, rows: int, seed: int) -> QuantTensor:
    """Random rows, then every fourth row's 4-bit values all 15 and every fifth's all 0 (the
    block sums' extremes), with finite scales and minimums."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, COLS)).astype(np.float32)
    qtype = GGMLQuantizationType[name]
    stored = np.ascontiguousarray(quants.quantize(x, qtype)).view(np.uint8).reshape(rows, -1)
    blocks = stored.reshape(rows, COLS // 32, -1)
    head = 4 if name == "Q4_1" else 2  # d (and m) as fp16 before the 16 bytes of nibbles
    blocks[::4, :, head:] = 0xFF
    blocks[::5, :, head:] = 0x00
    return QuantTensor(torch.from_numpy(stored.copy()), cpu_quant.TYPE_IDS[name], COLS)


def _inputs(rows: int, seed: int) -> torch.Tensor:
    """Random rows; in each, blocks whose largest value is positive, negative, and a block of
    equal values (every q = +-32767)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, COLS, generator=g) * torch.rand(rows, 1, generator=g) * 4
    x[:, 0:32] = x[:, 0:32].abs()
    x[:, 32:64] = -x[:, 32:64].abs()
    x[::2, 64:96] = -3.0
    x[1::2, 64:96] = 3.0
    x[:, 96:128] = 0.0  # an all-zero block
    return x


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1"])
def test_rows_together_give_each_rows_bits_alone(name):
    w = _weight(name, 40, seed=5)  # five groups of 8 (packed)
    x = _inputs(19, seed=5)  # 16 rows sharing each unpacked block, then 3
    w.pack()
    assert w.packed
    alone = torch.cat([cpu_quant.linear(x[i : i + 1], w, threads=1) for i in range(len(x))])
    for rows in (2, 3, 5, 9, 16, 19):
        together = cpu_quant.linear(x[:rows], w, threads=1)
        assert torch.equal(together, alone[:rows]), rows
    assert torch.equal(cpu_quant.linear(x, w, threads=3), alone)  # groups over threads
    if cpu_quant.library(portable=True) is not None:
        assert torch.equal(cpu_quant.linear(x, w, portable=True, threads=1), alone)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1"])
def test_rows_together_match_a_float64_product(name):
    w = _weight(name, 24, seed=9)
    x = _inputs(6, seed=9)
    ref = w.dequantize().double()
    w.pack()
    y = cpu_quant.linear(x, w, threads=1).double()
    blocks = x.reshape(len(x), -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 32767.0
    q = torch.round(blocks / torch.where(d == 0, torch.ones_like(d), d)).clamp(-32767, 32767)
    xs = (q.double() * d.double()).reshape(x.shape)  # the int16 inputs the kernels multiply
    exact = xs @ ref.T
    scale = xs.abs() @ ref.abs().T
    assert torch.all((y - exact).abs() <= 1e-5 * scale + 1e-6)
