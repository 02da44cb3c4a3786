"""The quantized-weight kernels (runtime/kernels/cpu/quant.py): dequantization bit-equal to the
`gguf` package's reference, products against float64, the portable build against the SIMD one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from runtime.errors import UnsupportedModelError
from runtime.kernels.cpu import quant as cpu_quant
from runtime.kernels.cpu.quant import QuantTensor

pytestmark = pytest.mark.skipif(cpu_quant.library() is None, reason="no C compiler")

FORMATS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16"]
K_FORMATS = {"Q4_K", "Q5_K", "Q6_K"}  # gguf has no numpy quantizer for these
# products on int16-quantized inputs: the 32-element formats and the K-quants
INT_FORMATS = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"} | K_FORMATS


def random_weight(name: str, rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, QuantTensor]:
    """(stored bytes [rows, row_bytes], the QuantTensor over them) of a random weight."""
    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType[name]
    if name in K_FORMATS:
        # random bytes are valid blocks once the fp16 super-block scales are finite and small
        _, size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
        scale = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        if name == "Q6_K":
            raw[..., 208:210] = scale
        else:
            raw[..., 0:2] = scale
            raw[..., 2:4] = np.frombuffer(np.float16(0.004).tobytes(), np.uint8)
        stored = raw.reshape(rows, -1)
    else:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        x *= rng.uniform(0.01, 2.0, (rows, 1)).astype(np.float32)  # rows of different scales
        stored = np.ascontiguousarray(quants.quantize(x, qtype)).view(np.uint8)
        stored = stored.reshape(rows, -1)
    w = QuantTensor(torch.from_numpy(stored.copy()), cpu_quant.TYPE_IDS[name], cols)
    return stored, w


def int16_inputs(x: torch.Tensor) -> torch.Tensor:
    """The inputs as the integer path sees them: blocks of 32, d = max|x| / 32767,
    q = round(x / d)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 32767.0
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    q = torch.round(blocks * inv).clamp(-32767, 32767)
    return (q.double() * d.double()).reshape(x.shape)


@pytest.mark.parametrize("name", FORMATS)
def test_dequantization_is_bit_equal_to_the_gguf_reference(name):
    stored, w = random_weight(name, 24, 512)
    ref = quants.dequantize(stored, GGMLQuantizationType[name]).astype(np.float32)
    for portable in (False, True):
        mine = w.dequantize(portable=portable).numpy()
        assert mine.shape == ref.shape
        assert np.array_equal(mine.view(np.uint32), ref.view(np.uint32)), (name, portable)


@pytest.mark.parametrize("rows", [1, 3, 9], ids=["matvec", "three-rows", "nine-rows"])
@pytest.mark.parametrize("name", FORMATS)
def test_product_matches_a_float64_product(name, rows):
    _, w = random_weight(name, 40, 512, seed=rows)
    torch.manual_seed(rows)
    x = torch.randn(rows, 512)
    y = cpu_quant.linear(x, w).double()
    # the block formats multiply the inputs as quantized (int16 blocks); F16 / BF16 as given
    xs = int16_inputs(x) if name in INT_FORMATS else x.double()
    exact = xs @ w.dequantize().double().T
    scale = xs.abs() @ w.dequantize().double().abs().T  # the sum's magnitude, per output
    assert torch.all((y - exact).abs() <= 1e-5 * scale + 1e-6), name


@pytest.mark.parametrize("name", FORMATS)
def test_portable_build_gives_the_simd_builds_bits(name):
    if cpu_quant.library(portable=True) is None:
        pytest.skip("portable build failed")
    _, w = random_weight(name, 64, 768, seed=7)
    for rows in (1, 6):  # one row takes weight rows in pairs; several share each block
        x = torch.randn(rows, 768)
        simd = cpu_quant.linear(x, w)
        portable = cpu_quant.linear(x, w, portable=True, threads=1)
        assert torch.equal(simd, portable), rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_input_quantization_edge_cases_give_the_portable_builds_bits(dtype):
    # the SIMD input quantization (int16 blocks) against the portable one: a zero block, ties
    # of the rounding (a block whose maximum is 32767: scale 1), tiny and huge blocks
    if cpu_quant.library(portable=True) is None:
        pytest.skip("portable build failed")
    _, w = random_weight("Q4_1", 40, 256, seed=9)
    torch.manual_seed(9)
    x = torch.randn(3, 256)
    x[0, :32] = 0.0
    x[0, 32:64] = torch.tensor([32767.0] + [k + 0.5 for k in range(-16, 15)])
    x[1, 64:96] *= 1e-30
    x[1, 96:128] *= 1e30
    x[2, 128:160] = -x[2, 128:160].abs()  # all negative
    x = x.to(dtype)
    for rows in (1, 3):
        simd = cpu_quant.linear(x[:rows], w)
        portable = cpu_quant.linear(x[:rows], w, portable=True, threads=1)
        assert simd.dtype == dtype and torch.equal(simd, portable), rows


def test_packed_weights_follow_each_other_from_a_huge_page_boundary(monkeypatch):
    # the arena: the first weight on a 2 MB boundary, each next one on the next cache line;
    # the products as before
    shapes = (("Q4_0", 40), ("Q8_0", 24), ("Q4_1", 16))
    twins = [random_weight(name, rows, 256, seed=rows)[1] for name, rows in shapes]
    for w in twins:  # packed into plain tensors
        w.pack()
    assert all(w.packed for w in twins)
    monkeypatch.setattr(cpu_quant, "_arena", cpu_quant._Arena())
    weights = [random_weight(name, rows, 256, seed=rows)[1] for name, rows in shapes]
    before = [w.dequantize() for w in weights]
    for w in weights:
        w.pack()
    at = [w.data.data_ptr() for w in weights]
    assert at[0] % (1 << 21) == 0
    for prev, p, w in zip(at, at[1:], weights, strict=False):
        assert p - prev == -(-w.nbytes // 64) * 64
    x = torch.randn(2, 256)
    for w, twin, dense in zip(weights, twins, before, strict=True):
        assert torch.equal(w.dequantize(), dense)
        assert torch.equal(cpu_quant.linear(x, w), cpu_quant.linear(x, twin))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_each_row_is_the_same_whatever_the_batch_and_threads(name):
    # 21 rows: the packed kernels share each unpacked block among 16 rows, then 5
    _, w = random_weight(name, 96, 768, seed=3)
    x = torch.randn(21, 768)
    together = cpu_quant.linear(x, w, threads=2)
    alone = torch.cat([cpu_quant.linear(x[i : i + 1], w, threads=1) for i in range(21)])
    assert torch.equal(together, alone)
    assert torch.equal(cpu_quant.linear(x[:7], w), together[:7])


@pytest.mark.parametrize("name", [*sorted(K_FORMATS), "Q5_0"])
def test_rows_longer_than_the_unpacking_stack_buffer_multiply_alike(name):
    # 16640 columns: past the 8192 a weight row unpacks into on the stack (then the heap);
    # against float64 and, in the portable build, bit for bit
    _, w = random_weight(name, 8, 16640, seed=13)
    torch.manual_seed(13)
    x = torch.randn(5, 16640)
    y = cpu_quant.linear(x, w)
    xs = int16_inputs(x)
    exact = xs @ w.dequantize().double().T
    scale = xs.abs() @ w.dequantize().double().abs().T
    assert torch.all((y.double() - exact).abs() <= 1e-5 * scale + 1e-6), name
    if cpu_quant.library(portable=True) is not None:
        assert torch.equal(y, cpu_quant.linear(x, w, portable=True, threads=1))


def test_bf16_inputs_bias_and_output_dtype():
    _, w = random_weight("Q8_0", 32, 256)
    x = torch.randn(2, 256).bfloat16()
    bias = torch.randn(32)
    y = cpu_quant.linear(x, w, bias)
    assert y.dtype == torch.bfloat16
    ref = cpu_quant.linear(x.float(), w) + bias
    assert torch.equal(y, ref.bfloat16())
    assert cpu_quant.linear(x, w, bias, float_out=True).dtype == torch.float32


def test_rows_slices_and_cat_keep_the_format():
    _, a = random_weight("Q4_1", 32, 256, seed=1)
    _, b = random_weight("Q6_K", 16, 256, seed=2)
    x = torch.randn(3, 256)
    same = torch.cat([a[:16], a[16:]])
    assert isinstance(same, QuantTensor) and torch.equal(same.data, a.data)
    mixed = torch.cat([a, b])  # different formats: one output, a product per part
    assert isinstance(mixed, cpu_quant.QuantStack) and mixed.shape == (48, 256)
    y = cpu_quant.linear(x, mixed)
    assert torch.equal(y, torch.cat([cpu_quant.linear(x, a), cpu_quant.linear(x, b)], dim=1))
    cols = a[:, 64:128]
    assert torch.equal(cols.dequantize(), a.dequantize()[:, 64:128])
    with pytest.raises(UnsupportedModelError, match="columns 0:40"):
        a[:, 0:40]


def test_embedding_rows_are_the_dequantized_rows():
    _, w = random_weight("Q8_0", 50, 256)
    ids = torch.tensor([[3, 0], [49, 3]])
    rows = cpu_quant.embedding(ids, w, torch.float32)
    assert torch.equal(rows, w.dequantize()[ids])
    with pytest.raises(IndexError):
        cpu_quant.embedding(torch.tensor([50]), w, torch.float32)


def test_prefill_sized_inputs_take_the_dequantized_product():
    _, w = random_weight("Q4_1", 64, 256, seed=5)
    x = torch.randn(cpu_quant.DENSE_ROWS + 3, 256)
    y = cpu_quant.linear(x, w)
    exact = x.double() @ w.dequantize().double().T
    assert torch.allclose(y.double(), exact, rtol=1e-4, atol=1e-4)
    # the integer path (forced: a thread count given) agrees to within its input rounding
    forced = cpu_quant.linear(x, w, threads=1)
    assert (forced - y).abs().max() <= 1e-4 * y.abs().max()


def test_prefill_sized_bf16_inputs_multiply_in_float32():
    # a CPU without native bf16 dot products runs torch's bf16 matmul several times slower:
    # the dequantized product is float32, rounded to bf16 once at the end
    _, w = random_weight("Q4_1", 64, 256, seed=6)
    x = torch.randn(cpu_quant.DENSE_ROWS + 3, 256).to(torch.bfloat16)
    y = cpu_quant.linear(x, w)
    assert y.dtype == torch.bfloat16
    expect = torch.nn.functional.linear(x.float(), w.dequantize())
    assert torch.equal(y, expect.to(torch.bfloat16))
    assert torch.equal(cpu_quant.linear(x, w, float_out=True), expect)


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q6_K"])
def test_a_large_weight_dequantizes_over_threads_as_on_one(name):
    # 203 rows x 512: past the size one thread does alone, with tail rows after the groups of 8
    stored, w = random_weight(name, 203, 512, seed=9)
    ref = quants.dequantize(stored, GGMLQuantizationType[name]).astype(np.float32)
    w.pack()
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(w.dequantize())
    finally:
        torch.set_num_threads(before)
    for out in results:
        assert np.array_equal(out.numpy(), ref)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
def test_packed_weights_keep_their_values_and_products(name):
    # 45 rows: five groups of 8 packed, 5 tail rows as stored
    stored, w = random_weight(name, 45, 256, seed=11)
    ref = w.dequantize()
    w.pack()
    assert w.packed and w.data.shape == stored.shape
    assert not np.array_equal(w.data.numpy(), stored)  # rearranged
    assert np.array_equal(w.stored().numpy(), stored)  # and back, byte for byte
    assert torch.equal(w.dequantize(), ref)
    assert torch.equal(w.dequantize(portable=True), ref)
    assert torch.equal(cpu_quant.embedding(torch.tensor([44, 3, 17]), w, torch.float32),
                       ref[[44, 3, 17]])  # fmt: skip
    assert torch.equal(w[8:20].dequantize(), ref[8:20])  # slices come as stored
    x = torch.randn(3, 256)
    simd = cpu_quant.linear(x, w)
    assert torch.equal(simd, cpu_quant.linear(x, w, threads=3))  # groups split over threads
    if cpu_quant.library(portable=True) is not None:
        assert torch.equal(simd, cpu_quant.linear(x, w, portable=True, threads=1))
    exact = int16_inputs(x) @ ref.double().T
    scale = int16_inputs(x).abs() @ ref.double().abs().T
    assert torch.all((simd.double() - exact).abs() <= 1e-5 * scale + 1e-6)


def test_a_large_lone_weight_packs_where_it_lies_and_a_shared_one_into_a_copy(monkeypatch):
    # 3 chunks of groups (the last one short) and 5 tail rows; the in-place size lowered
    monkeypatch.setattr(cpu_quant, "IN_PLACE_BYTES", 1)
    monkeypatch.setattr(cpu_quant, "_PACK_CHUNK_BYTES", 16 * 272)
    stored, copied = random_weight("Q8_0", 45, 256, seed=3)
    copied.data = copied.data.clone()
    other = QuantTensor(copied.data, copied.qtype, copied.cols)  # shares its bytes: copied
    copied.pack()
    assert np.array_equal(other.data.numpy(), stored)  # the sharer's bytes untouched
    lone = QuantTensor(torch.from_numpy(stored.copy()), copied.qtype, copied.cols)
    where = lone.data.data_ptr()
    lone.pack()
    assert lone.packed and lone.data.data_ptr() == where  # packed where it lies
    assert torch.equal(lone.data, copied.data)  # the same bytes as the packed copy
    # the loader's large buffers (huge_page_bytes): a view of a tensor over a mapping
    view = torch.frombuffer(bytearray(stored.tobytes()), dtype=torch.uint8).view(stored.shape)
    mapped = QuantTensor(view, copied.qtype, copied.cols)
    del view
    where = mapped.data.data_ptr()
    mapped.pack()
    assert mapped.data.data_ptr() == where and torch.equal(mapped.data, copied.data)


def test_a_lone_weights_first_product_packs_it_where_it_lies(monkeypatch):
    # the product packs on first use (a tied GGUF head: also the embedding table) without a
    # reference of its own over the bytes, which would make every weight look shared
    monkeypatch.setattr(cpu_quant, "IN_PLACE_BYTES", 1)
    stored, _ = random_weight("Q8_0", 40, 256, seed=6)
    w = QuantTensor(torch.from_numpy(stored.copy()), int(GGMLQuantizationType.Q8_0), 256)
    dense = w.dequantize().float()
    where = w.data.data_ptr()
    x = torch.randn(3, 256)
    y = cpu_quant.linear(x, w, float_out=True)
    assert w.packed and w.data.data_ptr() == where
    torch.testing.assert_close(y, x @ dense.T, rtol=1e-2, atol=1e-2)
    ids = torch.tensor([0, 7, 8, 39])
    assert torch.equal(cpu_quant.embedding(ids, w, torch.float32), dense[ids])


def test_a_bf16_result_is_rounded_as_torch_rounds():
    _, w = random_weight("Q4_1", 64, 512, seed=4)
    x = torch.randn(5, 512).bfloat16()
    wide = cpu_quant.linear(x, w, float_out=True)
    narrow = cpu_quant.linear(x, w)
    assert narrow.dtype == torch.bfloat16 and torch.equal(narrow, wide.bfloat16())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q5_0", "Q6_K"])
def test_swiglu_input_gives_the_product_of_torchs_silu_times_up(name, dtype):
    # the SiLU in the C (its own exp, within ~1 ulp of torch's): the products of the MLP's
    # down projection as torch's `F.silu(gate) * up` feeds it; large gates of both signs too
    _, w = random_weight(name, 48, 512, seed=5)
    torch.manual_seed(5)
    gate_up = (torch.randn(6, 1024) * 4).to(dtype)
    gate_up[0, :6] = torch.tensor([100.0, -100.0, 0.0, -90.0, 88.5, -87.5])
    gate, up = gate_up.chunk(2, dim=-1)
    ref = cpu_quant.linear(torch.nn.functional.silu(gate) * up, w)
    fused = cpu_quant.linear(gate_up, w, swiglu=True)
    assert fused.dtype == dtype
    close = (fused.float() - ref.float()).abs() <= 1e-6 * ref.float().abs().amax() + 1e-30
    assert close.all() and (fused == ref).float().mean() > 0.95, name
    # one row at a time, over threads and in the portable build: the same bits
    alone = torch.cat([cpu_quant.linear(gate_up[i : i + 1], w, swiglu=True) for i in range(6)])
    assert torch.equal(alone, fused)
    assert torch.equal(cpu_quant.linear(gate_up, w, swiglu=True, threads=2), fused)
    if cpu_quant.library(portable=True) is not None:
        portable = cpu_quant.linear(gate_up, w, swiglu=True, portable=True, threads=1)
        assert torch.equal(portable, fused)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_geglu_input_gives_the_product_of_torchs_gelu_tanh_times_up(name, dtype):
    # Gemma's GeGLU in the C input stage (GELU-tanh as g / (1 + exp(-2u)): a few ulps of torch's
    # tanh form): the down projection's products as `F.gelu(gate, "tanh") * up` feeds it
    code = cpu_quant.GATES["gelu_pytorch_tanh"]
    _, w = random_weight(name, 48, 512, seed=6)
    torch.manual_seed(6)
    gate_up = (torch.randn(6, 1024) * 3).to(dtype)
    gate_up[0, :6] = torch.tensor([30.0, -30.0, 0.0, -5.0, 1e-3, -1e-3])
    gate, up = gate_up.chunk(2, dim=-1)
    act = torch.nn.functional.gelu(gate, approximate="tanh") * up
    ref = cpu_quant.linear(act, w)
    fused = cpu_quant.linear(gate_up, w, swiglu=code)
    assert fused.dtype == dtype
    close = (fused.float() - ref.float()).abs() <= 1e-5 * ref.float().abs().amax() + 1e-30
    # float32: the activation's few-ulp differences reach some products' last bits; bf16
    # rounds most of them away
    same = (fused == ref).float().mean()
    assert close.all() and same > (0.9 if dtype == torch.bfloat16 else 0.5), (name, same)
    # not SiLU's product
    assert not torch.equal(fused, cpu_quant.linear(gate_up, w, swiglu=True))
    # one row at a time, over threads and in the portable build: the same bits
    alone = torch.cat([cpu_quant.linear(gate_up[i : i + 1], w, swiglu=code) for i in range(6)])
    assert torch.equal(alone, fused)
    assert torch.equal(cpu_quant.linear(gate_up, w, swiglu=code, threads=2), fused)
    if cpu_quant.library(portable=True) is not None:
        portable = cpu_quant.linear(gate_up, w, swiglu=code, portable=True, threads=1)
        assert torch.equal(portable, fused)
    # past the C's row limit the torch ops run: the same activation
    assert cpu_quant.linear(gate_up.repeat(30, 1), w, swiglu=code).shape == (180, 48)
