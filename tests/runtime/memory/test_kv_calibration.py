"""Calibrated fp8 KV storage (runtime/attention/kv_calibration.py) and the fused C kernels that
read and write fp8 pools: calibration is deterministic and independent of the serving backend,
scales and offsets change nothing but the rounding in every backend, the C write gives the
torch write's bytes, the C decode reads every fp8 byte exactly, and fp8 pools work with
jump-forward, preemption, tensor parallelism and the prefill-decode layout check."""

from __future__ import annotations

import functools
import json
import math
from types import SimpleNamespace

import pytest
import torch

from runtime.attention import LayerSpec, make_backend
from runtime.attention.kv_calibration import CALIBRATION_TEXT, calibrate, kv_calibration_kind
from runtime.errors import UnsupportedAttentionError
from runtime.kernels import reference
from runtime.kernels.cpu import fused as cpu_fused
from runtime.memory.kv_pool import KVPool
from tests.support.forward_batches import mixed_batch

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@functools.cache
def _loaded(model_dir):
    from runtime.models.loader import load_model_files

    return load_model_files(model_dir)


def _calibrate(model_dir, backend: str, smooth: bool = True):
    from runtime.models.registry import model_class

    loaded = _loaded(model_dir)
    model = model_class(loaded.config)(
        loaded.config, loaded.state_dict, torch.float32, attention=make_backend(backend)
    )
    return calibrate(model, loaded.config, loaded.tokenizer, torch.float32,
                     torch.float8_e4m3fn, smooth=smooth)  # fmt: skip


def test_calibration_is_deterministic_and_independent_of_the_serving_backend(model_dir):
    a, b = _calibrate(model_dir, "cpu"), _calibrate(model_dir, "torch")
    config = _loaded(model_dir).config
    assert set(a.scales) == {"k", "v"}
    for name in ("k", "v"):
        assert a.scales[name] == b.scales[name]
        assert len(a.scales[name]) == config.num_layers
        for s in a.scales[name]:
            assert s > 0 and math.log2(s) == round(math.log2(s))  # a power of two: exact
        for x, y in zip(a.offsets[name], b.offsets[name], strict=True):
            assert x.shape == (config.num_kv_heads, config.head_dim)
            assert torch.equal(x, y)
    plain = _calibrate(model_dir, "cpu", smooth=False)
    assert all(o is None for o in plain.offsets["k"] + plain.offsets["v"])
    assert "Q: How many legs" in CALIBRATION_TEXT  # shipped, nothing downloaded


def test_calibration_kinds():
    fp8 = torch.float8_e4m3fn
    assert kv_calibration_kind(torch.bfloat16, "smooth", {}) is None
    assert kv_calibration_kind(fp8, "smooth", {}) == "smooth"
    assert kv_calibration_kind(fp8, "none", {}) == "none"
    assert kv_calibration_kind(fp8, "smooth", {"k": [2.0]}) == "checkpoint"
    with pytest.raises(ValueError, match="kv_calibration"):
        kv_calibration_kind(fp8, "per-token", {})


# ---- scales and offsets in every backend ------------------------------------------------------
def _pool(dtype, scales=None, offsets=None):
    config = SimpleNamespace(
        num_layers=1, kv_layout=lambda: [("k", 2, 8), ("v", 2, 8)],
        kv_bytes_per_token=lambda b: 2 * 2 * 8 * b, layer_window=lambda i: None,
    )  # fmt: skip
    return KVPool(config, num_pages=8, page_size=4, dtype=dtype, scales=scales, offsets=offsets)


def _backends():
    names = ["torch", "cpu"]
    try:
        make_backend("triton")
        names.append("triton")
    except UnsupportedAttentionError:
        pass
    return names


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("backend_name", _backends())
def test_offsets_and_scales_change_only_the_rounding(backend_name, fp8):
    """Keys and values around large per-channel means, stored minus offsets and over scales:
    attention over the fp8 pool equals attention over a float32 pool of what the fp8 values
    stand for (stored * scale + offset), in every backend."""
    g = torch.Generator().manual_seed(0)
    mean_k, mean_v = torch.randn(2, 8, generator=g) * 30, torch.randn(2, 8, generator=g) * 5
    k = mean_k + torch.randn(32, 2, 8, generator=g)
    v = mean_v + torch.randn(32, 2, 8, generator=g) * 0.1
    q = torch.randn(4, 4, 8, generator=g) * 0.2
    slots = torch.arange(32)
    scales, offsets = {"k": [0.0078125], "v": [0.001953125]}, {"k": [mean_k], "v": [mean_v]}

    def attend(pool, keys, values):
        pool.write("k", 0, slots, keys)
        pool.write("v", 0, slots, values)
        backend = make_backend(backend_name)
        backend.plan(mixed_batch(), pool)
        return backend.attend(0, q, LayerSpec(0.35))

    quantized = attend(_pool(fp8, scales, offsets), k, v)
    lim = torch.finfo(fp8).max
    k_back = ((k - mean_k) / scales["k"][0]).clamp(-lim, lim).to(fp8).float()
    v_back = ((v - mean_v) / scales["v"][0]).clamp(-lim, lim).to(fp8).float()
    k_back, v_back = k_back * scales["k"][0] + mean_k, v_back * scales["v"][0] + mean_v
    expected = attend(_pool(torch.float32), k_back, v_back)
    torch.testing.assert_close(quantized, expected, rtol=1e-4, atol=1e-4)
    # the offsets matter: without them the same store is much coarser
    plain = attend(_pool(fp8, scales), k, v)
    exact = attend(_pool(torch.float32), k, v)
    assert (quantized - exact).abs().max() < (plain - exact).abs().max()


# ---- the fused C kernels on fp8 pools ----------------------------------------------------------
def _fused_or_skip(fp8):
    if not cpu_fused.available(fp8):
        pytest.skip("no C compiler: the fused CPU kernels are not built")


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rotary_write_gives_the_pool_writes_bytes(fp8, dtype):
    """Values from 1e-6 to 1e4 (subnormals, rounding ties, clamping), with offsets and scales:
    the C write stores the bytes `KVPool.write` stores."""
    _fused_or_skip(fp8)
    n, hq, hkv, d = 48, 2, 2, 32
    g = torch.Generator().manual_seed(1)
    spread = torch.logspace(-6, 4, n)[:, None]
    qkv = (torch.randn(n, (hq + 2 * hkv) * d, generator=g) * spread).to(dtype)
    positions, slots = torch.arange(n), torch.randperm(n, generator=g)
    angle = positions[:, None].float() * torch.linspace(0.01, 1.0, d)[None]
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    offsets = {"k": [torch.randn(hkv, d, generator=g)], "v": [None]}
    ref = KVPool(_config(hkv, d), n // 4 + 1, 4, fp8, scales={"k": [0.5], "v": [4.0]},
                 offsets=offsets)  # fmt: skip
    fused = KVPool(_config(hkv, d), n // 4 + 1, 4, fp8, scales={"k": [0.5], "v": [4.0]},
                   offsets=offsets)  # fmt: skip
    q = cpu_fused.rotary_kv(
        qkv, cos, sin, positions, slots, fused.k[0], fused.v[0], hq,
        (fused.offset("k", 0), None, fused.inverse_scales["k"][0], fused.inverse_scales["v"][0]),
    )  # fmt: skip

    def rotate(x):  # what rope_store's torch path does, rounding in `dtype` after each op
        c, s = cos[:, None], sin[:, None]
        half = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
        return x * c + half * s

    qk = rotate(qkv[:, : (hq + hkv) * d].view(n, hq + hkv, d))
    ref.write("k", 0, slots, qk[:, hq:])
    ref.write("v", 0, slots, qkv[:, (hq + hkv) * d :].view(n, hkv, d))
    assert torch.equal(q, qk[:, :hq])
    for name in ("k", "v"):
        assert torch.equal(fused.buffers[name][0].view(torch.uint8),
                           ref.buffers[name][0].view(torch.uint8)), name  # fmt: skip


def _config(hkv, d):
    return SimpleNamespace(
        num_layers=1, kv_layout=lambda: [("k", hkv, d), ("v", hkv, d)],
        kv_bytes_per_token=lambda b: 2 * hkv * d * b, layer_window=lambda i: None,
    )  # fmt: skip


@pytest.mark.parametrize("fp8", FP8)
def test_fused_decode_reads_every_fp8_byte_exactly(fp8):
    """One key per request, q = 0: the output is the value row, so all 256 bytes (but NaN)
    come back as torch converts them."""
    _fused_or_skip(fp8)
    every = torch.arange(256, dtype=torch.uint8).view(fp8)
    v_pool = every.view(16, 1, 1, 16)  # 16 pages of one token of 16 values
    rows = cpu_fused.DecodeRows.of(torch.arange(16, dtype=torch.int32)[:, None],
                                   torch.ones(16, dtype=torch.int32))  # fmt: skip
    out = cpu_fused.decode_attention(torch.zeros(16, 1, 16), torch.zeros_like(v_pool), v_pool,
                                     rows, 1.0).reshape(-1)  # fmt: skip
    finite = torch.isfinite(every.float())
    assert torch.equal(out[finite], every.float()[finite])


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128, 24])  # the two specialised head sizes and the rest
def test_fused_fp8_decode_equals_the_reference(fp8, dtype, d):
    _fused_or_skip(fp8)
    g = torch.Generator().manual_seed(2)
    k_pool = (torch.randn(12, 16, 2, d, generator=g) * 3).to(fp8)
    v_pool = torch.randn(12, 16, 2, d, generator=g).to(fp8)
    table = torch.randint(1, 12, (3, 4), generator=g, dtype=torch.int32)
    lens = torch.tensor([50, 17, 5], dtype=torch.int32)
    q = torch.randn(3, 6, d, generator=g).to(dtype)
    ref = reference.paged_decode_attention(q, k_pool.float(), v_pool.float(), table, lens, 0.2)
    got = cpu_fused.decode_attention(q, k_pool, v_pool, cpu_fused.DecodeRows.of(table, lens), 0.2)
    assert got.dtype == dtype
    # float32 summation order; bf16 outputs: one rounding of the same float32 result
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got.float(), ref.float(), **tol)


# ---- in the engine -----------------------------------------------------------------------------
def test_fp8_jump_forward_agrees_across_backends_and_keeps_the_pool_whole(model_dir):
    """Jump-forward extends forced text and rolls back retokenized positions: with a
    calibrated fp8 pool the cpu backend (fused C write and decode) gives the torch backend's
    output, valid, and the pages stay accounted for."""
    from runtime import Engine

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
              "ok": {"type": "boolean"}}, "required": ["name", "ok"],
              "additionalProperties": False}  # fmt: skip
    texts = {}
    for backend in ("torch", "cpu"):
        with Engine(str(model_dir), page_size=4, max_total_tokens=1024, kv_cache_dtype="fp8_e4m3",
                    attention_backend=backend) as engine:  # fmt: skip
            assert engine.stats()["kv_calibration"] == "smooth"
            out = engine.generate(["A person:", "Another:"], json_schema=schema,
                                  max_new_tokens=60, temperature=0.0,
                                  jump_forward=True)  # fmt: skip
            texts[backend] = [r.text for r in out]
            engine.check_integrity()
    assert texts["cpu"] == texts["torch"]
    for text in texts["cpu"]:
        assert set(json.loads(text)) == {"name", "ok"}


@pytest.mark.timeout(300)
def test_fp8_tensor_parallel_equals_the_single_process_engine(model_dir):
    """The driver calibrates on the whole model and each rank keeps its layers' and heads'
    scales and offsets: TP=2 gives the single-process fp8 engine's tokens, preemption and
    the radix cache in play."""
    from runtime import Engine
    from tests.support.tiny_models import PROMPTS

    kw = dict(page_size=4, chunked_prefill_tokens=16, max_total_tokens=96,
              kv_cache_dtype="fp8_e4m3")  # fmt: skip
    greedy = dict(max_new_tokens=10, min_new_tokens=10, temperature=0.0)
    with Engine(str(model_dir), **kw) as e:
        expected = [r.token_ids for r in e.generate(PROMPTS * 2, **greedy)]
        digest = e.pool.calibration_digest()
    with Engine(str(model_dir), tp_size=2, **kw) as e:
        got = [r.token_ids for r in e.generate(PROMPTS * 2, **greedy)]
        stats = e.stats()
        assert e.pool.calibration_digest() == digest  # the driver's allocator pool
    assert got == expected
    assert stats["preemptions"] > 0 and stats["kv_calibration"] == "smooth"


def test_pd_layout_check_names_a_calibration_mismatch():
    from runtime.disaggregation.modes import pool_layout

    offsets = {"k": [torch.ones(2, 8)], "v": [None]}
    a = pool_layout(_pool(torch.float8_e4m3fn, {"k": [0.5], "v": [1.0]}, offsets), "m")
    b = pool_layout(_pool(torch.float8_e4m3fn, {"k": [0.5], "v": [1.0]}), "m")
    c = pool_layout(_pool(torch.float8_e4m3fn, {"k": [0.5], "v": [1.0]}, offsets), "m")
    assert a.mismatch(c) is None
    why = a.mismatch(b)
    assert why is not None and "kv_calibration" in why
    assert type(a).from_json(a.to_json()) == a
