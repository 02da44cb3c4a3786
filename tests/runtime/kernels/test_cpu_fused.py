"""The fused CPU kernels (runtime/kernels/cpu/fused.py) against the torch ops they replace, and
the Llama forward with them against the forward without them: same greedy tokens, logits
within float tolerance."""

from __future__ import annotations

import pytest
import torch

from runtime.attention import make_backend
from runtime.attention.cpu_backend import CPUBackend
from runtime.kernels import reference
from runtime.kernels.cpu import fused as cpu_fused
from runtime.models.layers import rms_norm
from runtime.models.loader import load_model_files
from runtime.models.registry import model_class
from runtime.models.rope import apply_rotary
from tests.support.forward_batches import decode_run
from tests.support.tiny_models import make_tiny_model

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
ATTENTION_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}

pytestmark = pytest.mark.skipif(
    not cpu_fused.available(torch.float32), reason="no C compiler: the torch ops run instead"
)


def _rand(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("lens", "heads", "kv_heads", "head_dim", "page_size"),
    [
        pytest.param([100], 9, 3, 64, 16, id="batch1-gqa3-d64"),
        pytest.param([100, 93, 1, 17], 9, 3, 64, 16, id="unequal-lengths"),
        pytest.param([40, 0, 5], 4, 2, 16, 4, id="empty-row-generic-shape"),
        pytest.param([33, 64], 8, 8, 128, 16, id="mha-d128"),
        pytest.param([7, 300], 6, 1, 32, 8, id="one-kv-head"),
    ],
)
def test_decode_attention_matches_the_reference(dtype, lens, heads, kv_heads, head_dim, page_size):
    b = len(lens)
    per = max(-(-max(lens) // page_size), 1)
    k_pool = _rand(b * per + 3, page_size, kv_heads, head_dim, dtype=dtype, seed=1)
    v_pool = _rand(b * per + 3, page_size, kv_heads, head_dim, dtype=dtype, seed=2)
    # shuffled pages; one spare column of -1 past every request's pages (never read)
    table = torch.randperm(b * per, generator=torch.Generator().manual_seed(3)) + 1
    table = torch.cat([table.view(b, per), torch.full((b, 1), -1)], dim=1).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = _rand(b, heads, head_dim, dtype=dtype, seed=4)
    want = reference.paged_decode_attention(q, k_pool, v_pool, table, seq_lens, 0.125)
    rows = cpu_fused.DecodeRows.of(table, seq_lens)
    got = cpu_fused.decode_attention(q, k_pool, v_pool, rows, 0.125)
    assert got.dtype == dtype and got.shape == q.shape
    assert (got.float() - want.float()).abs().max().item() < ATTENTION_TOLERANCE[dtype]
    assert torch.equal(got[seq_lens == 0], torch.zeros_like(got[seq_lens == 0]))


def test_decode_attention_over_the_quantized_kernels_pool_gives_the_same_bits():
    # with the quantized kernels loaded, several requests split over their pool, not OpenMP
    import ctypes

    from runtime.kernels.cpu import quant as cpu_quant

    lib = cpu_quant.library()
    if lib is None:
        pytest.skip("no quantized kernels")
    lens, heads, kv_heads, d, ps = [37, 5, 80, 1, 16, 33], 9, 3, 64, 16
    k_pool = _rand(40, ps, kv_heads, d, dtype=torch.bfloat16, seed=21)
    v_pool = _rand(40, ps, kv_heads, d, dtype=torch.bfloat16, seed=22)
    table = (torch.arange(36).view(6, 6) + 1).to(torch.int32)
    rows = cpu_fused.DecodeRows.of(table, torch.tensor(lens))
    q = _rand(6, heads, d, dtype=torch.bfloat16, seed=23)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pooled = cpu_fused.decode_attention(q, k_pool, v_pool, rows, 0.125)
        cpu_fused.run_attention_on(None)
        openmp = cpu_fused.decode_attention(q, k_pool, v_pool, rows, 0.125)
    finally:
        cpu_fused.run_attention_on(ctypes.cast(lib.q_pool_run, ctypes.c_void_p).value)
        torch.set_num_threads(threads)
    alone = [cpu_fused.decode_attention(q[i : i + 1], k_pool, v_pool,
                                        cpu_fused.DecodeRows.of(table[i : i + 1],
                                                                torch.tensor(lens[i : i + 1])),
                                        0.125) for i in range(6)]  # fmt: skip
    assert torch.equal(pooled, openmp) and torch.equal(pooled, torch.cat(alone))


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_requests_kv_heads_split_over_the_pool_give_the_same_bits(dtype):
    # a batch-1 decode step with a long context splits its kv heads over the quantized
    # kernels' pool (3 kv heads on 2 threads: 2 + 1); each head as on one thread
    import ctypes

    from runtime.kernels.cpu import quant as cpu_quant

    lib = cpu_quant.library()
    if lib is None:
        pytest.skip("no quantized kernels")
    heads, kv_heads, d, ps = 9, 3, 64, 16
    k_pool = _rand(12, ps, kv_heads, d, dtype=dtype, seed=31)
    v_pool = _rand(12, ps, kv_heads, d, dtype=dtype, seed=32)
    table = torch.tensor([[3, 9, 1, 4, 7, 2]], dtype=torch.int32)
    q = _rand(1, heads, d, dtype=dtype, seed=33)
    threads = torch.get_num_threads()
    try:
        cpu_fused.run_attention_on(ctypes.cast(lib.q_pool_run, ctypes.c_void_p).value)
        for length in (90, 33, 20):  # split, split, too short to split
            rows = cpu_fused.DecodeRows.of(table, torch.tensor([length]))
            torch.set_num_threads(2)
            split = cpu_fused.decode_attention(q, k_pool, v_pool, rows, 0.125)
            torch.set_num_threads(1)
            one = cpu_fused.decode_attention(q, k_pool, v_pool, rows, 0.125)
            assert torch.equal(split, one), length
            want = reference.paged_decode_attention(
                q, k_pool, v_pool, table, torch.tensor([length], dtype=torch.int32), 0.125
            )
            assert (split.float() - want.float()).abs().max().item() < ATTENTION_TOLERANCE[dtype]
    finally:
        torch.set_num_threads(threads)


def test_decode_attention_rejects_heads_that_do_not_group():
    pool = torch.zeros(2, 4, 3, 8)
    rows = cpu_fused.DecodeRows.of(torch.ones(1, 1), torch.ones(1))
    with pytest.raises(ValueError, match="multiple of kv heads"):
        cpu_fused.decode_attention(torch.zeros(1, 4, 8), pool, pool, rows, 1.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [pytest.param(1, id="one"), pytest.param(37, id="many")])
def test_rotary_and_kv_write_give_torchs_bits(dtype, tokens):
    hq, hkv, d, page_size = 6, 2, 32, 4
    qkv = _rand(tokens, (hq + 2 * hkv) * d, dtype=dtype, seed=5)
    cos, sin = _rand(512, d, dtype=dtype, seed=6), _rand(512, d, dtype=dtype, seed=7)
    positions = torch.randint(0, 512, (tokens,), generator=torch.Generator().manual_seed(8))
    slots = torch.randperm(64 * page_size, generator=torch.Generator().manual_seed(9))[:tokens]
    k_pool = torch.zeros(64, page_size, hkv, d, dtype=dtype)
    v_pool = torch.zeros_like(k_pool)
    q = cpu_fused.rotary_kv(qkv, cos, sin, positions, slots, k_pool, v_pool, hq)
    qk = apply_rotary(qkv[:, : (hq + hkv) * d].view(tokens, -1, d), cos[positions][:, None],
                      sin[positions][:, None])  # fmt: skip
    assert torch.equal(q, qk[:, :hq])
    assert torch.equal(k_pool.view(-1, hkv, d)[slots], qk[:, hq:])
    assert torch.equal(v_pool.view(-1, hkv, d)[slots], qkv[:, (hq + hkv) * d :].view(-1, hkv, d))
    untouched = torch.ones(64 * page_size, dtype=torch.bool)
    untouched[slots] = False
    assert not k_pool.view(-1, hkv, d)[untouched].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_decode_gives_the_bits_of_rotary_then_attention(dtype):
    # a decode step's layer in one call: the same kernels, so the same K/V writes and output
    hq, hkv, d, ps, lens = 9, 3, 64, 16, [30, 17, 1]
    b, per = len(lens), 2
    qkv = _rand(b, (hq + 2 * hkv) * d, dtype=dtype, seed=11)
    cos, sin = _rand(64, d, dtype=dtype, seed=12), _rand(64, d, dtype=dtype, seed=13)
    table = (torch.arange(b * per).view(b, per) + 1).to(torch.int32)
    positions = torch.tensor([n - 1 for n in lens])
    slots = torch.tensor([int(table[i, (n - 1) // ps]) * ps + (n - 1) % ps
                          for i, n in enumerate(lens)])  # fmt: skip
    pools = [_rand(b * per + 1, ps, hkv, d, dtype=dtype, seed=s) for s in (14, 15)]
    twin = [p.clone() for p in pools]
    rows = cpu_fused.DecodeRows.of(table, torch.tensor(lens))
    step = cpu_fused.RopeDecode(cos, sin, positions, slots, rows, hq, pools[0], dtype)
    got = step(qkv, pools[0], pools[1], 0.125)
    q = cpu_fused.rotary_kv(qkv, cos, sin, positions, slots, twin[0], twin[1], hq)
    want = cpu_fused.decode_attention(q, twin[0], twin[1], rows, 0.125)
    assert torch.equal(got, want)
    assert torch.equal(pools[0], twin[0]) and torch.equal(pools[1], twin[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128, 96])  # the vector kernels' head sizes, and another
@pytest.mark.parametrize("window", [12, 14, 16])
def test_rope_decode_with_a_window_attends_to_the_last_window_keys(dtype, d, window):
    """A sliding window in the fused decode step (decode chains of Gemma's local layers): each
    request attends to its last `window` keys, the window starting inside a page, on a page
    boundary, or before the first key (a request shorter than the window)."""
    hq, hkv, ps, lens = 4, 2, 16, [30, 17, 40, 5, 46]
    b, per, scale = len(lens), 3, 0.125
    qkv = _rand(b, (hq + 2 * hkv) * d, dtype=dtype, seed=21)
    cos, sin = _rand(64, d, dtype=dtype, seed=22), _rand(64, d, dtype=dtype, seed=23)
    table = (torch.arange(b * per).view(b, per) + 1).to(torch.int32)
    positions = torch.tensor([n - 1 for n in lens])
    slots = torch.tensor([int(table[i, (n - 1) // ps]) * ps + (n - 1) % ps
                          for i, n in enumerate(lens)])  # fmt: skip
    pools = [_rand(b * per + 1, ps, hkv, d, dtype=dtype, seed=s) for s in (24, 25)]
    rows = cpu_fused.DecodeRows.of(table, torch.tensor(lens))
    step = cpu_fused.RopeDecode(cos, sin, positions, slots, rows, hq, pools[0], dtype,
                                window=window)  # fmt: skip
    got = step(qkv, pools[0], pools[1], scale).float()
    q = step.q.float()  # the rotated queries; the pools hold the new keys and values
    k_flat, v_flat = (p.float().view(-1, hkv, d) for p in pools)
    for i, n in enumerate(lens):
        keys = torch.arange(max(0, n - window), n)
        where = table[i, keys // ps].long() * ps + keys % ps
        k = k_flat[where].repeat_interleave(hq // hkv, dim=1)  # [keys, hq, d]
        v = v_flat[where].repeat_interleave(hq // hkv, dim=1)
        p = torch.softmax(torch.einsum("hd,khd->hk", q[i] * scale, k), dim=-1)
        want = torch.einsum("hk,khd->hd", p, v)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got[i], want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("with_delta", "with_bias"),
    [
        pytest.param(False, False, id="norm-only"),
        pytest.param(True, False, id="residual"),
        pytest.param(True, True, id="residual-and-bias"),
    ],
)
def test_add_rms_norm_matches_torch(dtype, with_delta, with_bias):
    hidden = _rand(19, 200, dtype=dtype, seed=10) * 3
    delta = _rand(19, 200, dtype=dtype, seed=11) if with_delta else None
    bias = _rand(200, dtype=dtype, seed=12) if with_bias else None
    weight = _rand(200, dtype=dtype, seed=13)
    want_hidden = hidden if delta is None else hidden + (delta if bias is None else delta + bias)
    want = rms_norm(want_hidden, weight, 1e-5)
    got_hidden = hidden.clone()
    got = cpu_fused.add_rms_norm(got_hidden, delta, bias, weight, 1e-5)
    assert torch.equal(got_hidden, want_hidden)  # the residual add rounds as torch does
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)  # measured bit-equal; the sum order differs in fp32 only
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("kind", "overrides"),
    [
        pytest.param("llama", {}, id="llama"),
        pytest.param("qwen2", {}, id="qwen2-qkv-bias"),
        pytest.param("llama", {"attention_bias": True, "mlp_bias": True}, id="llama-biases"),
    ],
)
def test_fused_forward_matches_the_torch_forward(tmp_path, dtype, kind, overrides):
    loaded = load_model_files(make_tiny_model(tmp_path, kind, **overrides))
    model = model_class(loaded.config)(
        loaded.config, loaded.state_dict, dtype, attention=make_backend("cpu")
    )
    assert model.add_norm.fused
    prompts = [[5, 17, 300, 42, 9], [7, 7, 1000], [12] * 11]
    fused_tokens, fused_logits = decode_run(model, dtype, prompts, steps=12)
    model.add_norm.fused = False  # torch's ops for the norms, rotary and decode attention
    model.attention = CPUBackend(fused=False)
    torch_tokens, torch_logits = decode_run(model, dtype, prompts, steps=12)
    assert torch.equal(fused_tokens, torch_tokens)
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    assert (fused_logits - torch_logits).abs().max().item() < tolerance


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("SGL_FUSED_CPU", "0")
    assert not cpu_fused.available(torch.float32)
    monkeypatch.setenv("SGL_FUSED_CPU", "1")
    assert cpu_fused.available(torch.float32)
    assert not cpu_fused.available(torch.float16)


def test_a_failing_compiler_leaves_the_torch_ops(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_fused, "_lib", None)
    monkeypatch.setattr(cpu_fused, "_failed", False)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("SGL_NATIVE_CACHE", str(tmp_path / "cache"))  # nothing built there yet
    assert not cpu_fused.available(torch.float32)
    assert not cpu_fused.available(torch.bfloat16)  # the failure is remembered, not retried


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_offset_add_rms_norm_is_gemmas_norms_and_add(dtype):
    # hidden += norm(delta, w_delta); out = norm(hidden, w), norm(x, w) as Gemma's RMSNorm
    # computes it: F.rms_norm(x.float(), w) with float32 (1 + w) weights, then cast
    def norm(x, w):
        return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), w, 1e-6).to(x.dtype)

    torch.manual_seed(4)
    hidden = (torch.randn(5, 640) * 3).to(dtype)
    delta = (torch.randn(5, 640) * 50).to(dtype)
    w_delta, w = 1 + torch.randn(640) * 0.3, 1 + torch.randn(640) * 0.3
    ref_hidden = hidden + norm(delta, w_delta)
    ref = norm(ref_hidden, w)
    got_hidden = hidden.clone()
    got = cpu_fused.offset_add_rms_norm(got_hidden, delta, w_delta, w, 1e-6)
    ulp = 8e-3 if dtype == torch.bfloat16 else 3e-7  # the sum of squares' order: last bits
    for a, b in ((got_hidden, ref_hidden), (got, ref)):
        assert ((a.float() - b.float()).abs() <= ulp * b.float().abs() + 1e-6).all()
    if dtype == torch.bfloat16:
        assert (got == ref).float().mean() > 0.99 and torch.equal(got_hidden, ref_hidden)
    # no delta: only the norm, hidden untouched
    before = hidden.clone()
    alone = cpu_fused.offset_add_rms_norm(hidden, None, None, w, 1e-6)
    assert torch.equal(hidden, before)
    assert ((alone.float() - norm(hidden, w).float()).abs()
            <= ulp * norm(hidden, w).float().abs() + 1e-6).all()  # fmt: skip
