"""The three attention backends run a whole tiny model and agree: `torch` (reference kernels),
`cpu` (the planned CPU paths) and `triton` (the Triton kernels, interpreted on CPU) give the
same greedy tokens for decode, extend against a cached prefix, chunked prefill and constrained
decoding through the bitmask kernel, on a tiny random Llama and a tiny DeepSeek (MLA latents).
Also: the `LayerSpec` features (sliding window, soft-capping) against a dense computation, and
the refusal of the backend without them."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from runtime.attention import LayerSpec, make_backend, resolve_backend
from runtime.attention.forward_batch import ForwardBatch
from runtime.attention.torch_backend import general_attention
from runtime.errors import UnsupportedAttentionError
from runtime.memory.kv_pool import KVPool

ON_CPU = os.environ.get("SGL_KERNEL_TEST_DEVICE", "cpu") == "cpu"
PROMPTS = [
    "The quick brown fox jumps over the lazy dog and",
    "Hello",
    "The quick brown fox jumps over the lazy dog but",  # shares a cached prefix with the first
]
REGEX = r"(yes|no), [a-z]{2,5}\."


def _triton_or_skip() -> None:
    if not ON_CPU:
        pytest.skip("the engine runs on CPU here; the triton check uses the interpreter")
    try:
        make_backend("triton")
    except UnsupportedAttentionError as exc:
        pytest.skip(str(exc))


@functools.cache
def _run(model_dir, backend: str, constrained: bool = True) -> dict:
    """The same workload through one backend (cached: the reference run serves every test)."""
    from runtime import Engine

    # chunks of 8 prompt tokens: later chunks extend against a cached prefix; the first prompt
    # runs alone first so that the third one finds its prefix in the radix cache
    with Engine(
        str(model_dir), page_size=4, chunked_prefill_tokens=8, max_total_tokens=2048,
        attention_backend=backend,
    ) as engine:  # fmt: skip
        first = engine.generate(PROMPTS[0], max_new_tokens=6, temperature=0.0)
        batch = engine.generate(PROMPTS, max_new_tokens=6, temperature=0.0)
        out = {
            "tokens": [first.token_ids] + [r.token_ids for r in batch],
            "scores": engine.score("The capital of France is", [" Paris", " London"]),
            "cached": engine.stats()["cache_hit_tokens"],
            "backend": engine.stats()["attention_backend"],
        }
        if constrained:
            r = engine.generate("Answer:", max_new_tokens=12, temperature=0.0, regex=REGEX)
            out["constrained"] = r.token_ids
    return out


def test_auto_is_the_cpu_backend_on_a_cpu():
    assert resolve_backend("auto", "cpu") == "cpu"
    with pytest.raises(ValueError, match="attention_backend"):
        resolve_backend("flash")


def test_llama_cpu_backend_gives_the_reference_tokens(model_dir):
    ref, cpu = _run(model_dir, "torch"), _run(model_dir, "cpu")
    assert (ref["backend"], cpu["backend"]) == ("torch", "cpu")
    assert ref["cached"] > 0  # the extend-with-cached-prefix path ran
    assert cpu["tokens"] == ref["tokens"]
    assert cpu["constrained"] == ref["constrained"]
    assert cpu["scores"] == pytest.approx(ref["scores"], abs=1e-4)


def test_llama_triton_backend_gives_the_reference_tokens(model_dir):
    _triton_or_skip()
    ref, tri = _run(model_dir, "torch"), _run(model_dir, "triton")
    assert tri["backend"] == "triton"
    assert tri["tokens"] == ref["tokens"]
    assert tri["constrained"] == ref["constrained"]
    assert tri["scores"] == pytest.approx(ref["scores"], abs=1e-4)


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_deepseek_latent_attention_agrees_across_backends(deepseek_dir, backend):
    if backend == "triton":
        _triton_or_skip()
    ref = _run(deepseek_dir, "torch", constrained=False)
    other = _run(deepseek_dir, backend, constrained=False)
    assert other["tokens"] == ref["tokens"]
    assert other["scores"] == pytest.approx(ref["scores"], abs=1e-4)


# ---- LayerSpec features -------------------------------------------------------------------------
def _pool_and_batch(seed: int = 0):
    """One layer of K/V for two requests (a 5-token decode row, a 3-token chunk after 6 cached
    tokens), written at random into a pool of pages of 4."""
    g = torch.Generator().manual_seed(seed)
    from types import SimpleNamespace

    config = SimpleNamespace(
        num_layers=1, kv_layout=lambda: [("k", 2, 8), ("v", 2, 8)],
        kv_bytes_per_token=lambda b: 2 * 2 * 8 * b, layer_window=lambda i: None,
    )  # fmt: skip
    pool = KVPool(config, num_pages=8, page_size=4, dtype=torch.float32)
    pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=g))
    pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=g))
    batch = ForwardBatch(
        input_ids=torch.zeros(4, dtype=torch.long), positions=torch.tensor([4, 6, 7, 8]),
        out_slots=torch.tensor([20, 26, 27, 28]), num_decode=1,
        decode_page_table=torch.tensor([[3, 5]], dtype=torch.int32),
        decode_seq_lens=torch.tensor([5], dtype=torch.int32),
        extend_page_table=torch.tensor([[1, 6, 7]], dtype=torch.int32),
        extend_prefix_lens=torch.tensor([6], dtype=torch.int32),
        extend_lens=torch.tensor([3], dtype=torch.int32), logit_rows=torch.tensor([0, 3]),
    )  # fmt: skip
    q = torch.randn(4, 4, 8, generator=g)
    return pool, batch, q


def _dense(q, keys, values, pos, spec):
    """One query row [H, D] at position `pos` against keys / values [L, Hkv, D], by hand."""
    k = keys.repeat_interleave(2, dim=1)
    v = values.repeat_interleave(2, dim=1)
    s = torch.einsum("hd,lhd->hl", q, k) * spec.scale
    if spec.soft_cap:
        s = spec.soft_cap * torch.tanh(s / spec.soft_cap)
    j = torch.arange(k.shape[0])
    lo = pos - spec.window + 1 if spec.window else 0
    s = s.masked_fill(~((j <= pos) & (j >= lo)), -torch.inf)
    return torch.einsum("hl,lhd->hd", s.softmax(-1), v)


@pytest.mark.parametrize("backend_name", ["torch", "cpu"])
@pytest.mark.parametrize("spec", [LayerSpec(0.3, window=3), LayerSpec(0.3, soft_cap=2.0),
                                  LayerSpec(0.5, window=2, soft_cap=1.5)])  # fmt: skip
def test_windows_and_soft_caps_match_a_dense_computation(spec, backend_name):
    pool, batch, q = _pool_and_batch()
    backend = make_backend(backend_name)
    backend.plan(batch, pool)
    out = backend.attend(0, q, spec)
    k, v = pool.k[0].view(-1, 2, 8), pool.v[0].view(-1, 2, 8)
    dec_slots = torch.tensor([12, 13, 14, 15, 20])  # pages 3, 5
    ext_slots = torch.tensor([4, 5, 6, 7, 24, 25, 26, 27, 28])  # pages 1, 6, 7
    expected = [_dense(q[0], k[dec_slots], v[dec_slots], 4, spec)]
    expected += [_dense(q[1 + i], k[ext_slots], v[ext_slots], 6 + i, spec) for i in range(3)]
    torch.testing.assert_close(out, torch.stack(expected), atol=1e-5, rtol=1e-5)
    # without the features, the general path equals the reference kernels
    plain = LayerSpec(spec.scale)
    ref = backend.attend(0, q, plain)
    general = general_attention(q[1:], pool.k[0], pool.v[0], batch.extend_page_table, [6], [3],
                                plain)  # fmt: skip
    torch.testing.assert_close(general, ref[1:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", [LayerSpec(0.3, window=3), LayerSpec(0.3, soft_cap=2.0)])
def test_triton_backend_refuses_what_it_lacks_naming_it(spec):
    _triton_or_skip()
    pool, batch, q = _pool_and_batch()
    backend = make_backend("triton")
    backend.plan(batch, pool)
    name = "window" if spec.window else "soft_cap"
    with pytest.raises(UnsupportedAttentionError, match=name):
        backend.attend(0, q, spec)


def test_layer_spec_rejects_a_bad_window():
    with pytest.raises(ValueError, match="window"):
        LayerSpec(1.0, window=0)


def test_the_server_flag_reaches_the_engine_and_refuses_unknown_names(capsys):
    from runtime.server.__main__ import engine_kwargs, parse_args

    assert engine_kwargs(parse_args(["--attention-backend", "torch"]))["attention_backend"] == (
        "torch"
    )
    assert engine_kwargs(parse_args([]))["attention_backend"] == "auto"
    with pytest.raises(SystemExit):
        parse_args(["--attention-backend", "flash"])
    assert "--attention-backend" in capsys.readouterr().err
