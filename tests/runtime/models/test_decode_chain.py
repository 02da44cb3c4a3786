"""The one-call decode chain (quant_chain.py) against decoder.py's per-layer loop on the same
kernels, bit for bit: a Llama with biases on all four products (q/k/v as Qwen2's; o, gate | up
and down as `attention_bias` / `mlp_bias`), and per-layer hooks (quant_chain.ChainHook: a
layer's attention or MLP half run by a C function of the chain's `chain_half_fn` type in place
of the built-in one; here ctypes callbacks that run the per-layer path's own code for their
half)."""

from __future__ import annotations

import ctypes
import dataclasses

import pytest
import torch

from benchmarks.peers.gguf_models import write_gguf
from runtime.kernels.cpu import quant as cpu_quant
from runtime.models.gguf import load_gguf
from tests.support.tiny_models import tiny_config

pytestmark = pytest.mark.skipif(cpu_quant.library() is None, reason="no C compiler")


def _view(address: int, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    buf = (ctypes.c_char * (rows * cols * dtype.itemsize)).from_address(address)
    return torch.frombuffer(buf, dtype=dtype).view(rows, cols)


BIASES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip


def _with_biases(config, state: dict) -> dict:
    """`state` plus a random bias for every product of every layer."""
    g = torch.Generator().manual_seed(11)
    state = dict(state)
    for i in range(config.num_layers):
        for name in BIASES:
            w = state[f"model.layers.{i}.{name}.weight"]
            state[f"model.layers.{i}.{name}.bias"] = 0.1 * torch.randn(w.shape[0], generator=g)
    return state


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    config = tiny_config("llama")
    state = AutoModelForCausalLM.from_config(config).eval().state_dict()
    for name in state:  # norms of their own (transformers starts them all at 1)
        if name.endswith("norm.weight"):
            state[name] = 1 + 0.2 * torch.randn(state[name].shape)
    root = tmp_path_factory.mktemp("hooks")
    return write_gguf(root / "tiny.Q8_0.gguf", config, state, "Q8_0")


def _same_decode(model, chain, dtype) -> None:
    """`chain`'s decode steps and the per-layer loop's: the same logits, bit for bit, and the
    same greedy tokens, for three requests."""
    from tests.support.forward_batches import decode_run

    prompts = [[5, 17, 300, 42, 9], [7, 7, 1000], [12] * 11]
    model._chain, chain.runs = chain, 0
    chained_tokens, chained = decode_run(model, dtype, prompts, steps=4)
    assert chain.runs == 4
    model._chain = None  # the per-layer loop
    tokens, plain = decode_run(model, dtype, prompts, steps=4)
    assert torch.equal(chained, plain)
    assert torch.equal(chained_tokens, tokens)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_biases_and_hooked_halves_give_the_per_layer_bits(tiny_file, dtype):
    from runtime.attention import make_backend
    from runtime.kernels.cpu.quant_chain import HALF_FN, ChainHook, DecodeChain
    from runtime.models.llama import LlamaModel

    config, state = load_gguf(tiny_file)
    model = LlamaModel(config, _with_biases(config, state), dtype, attention=make_backend("cpu"))
    built_in = model._chain
    assert isinstance(built_in, DecodeChain), model.decode_path
    assert "q / k / v, o, gate / up, down biases" in model.decode_path
    _same_decode(model, built_in, dtype)

    hidden = config.hidden_size
    calls: list[tuple] = []  # (half, layer, rows, the step's pools and rope arguments)

    def attention(ctx, x, rows, out, bf16, scratch, step):
        li = ctypes.c_int64.from_address(ctx).value  # ctx: the layer's index
        s = step.contents
        calls.append(("attn", s.layer, rows, s.k_pool, s.v_pool, bool(s.rope_step), bf16))
        layer = model.layers[li]
        got = model._attention_block(li, layer, _view(x, rows, hidden, dtype), {})
        _view(out, rows, hidden, dtype).copy_(got)
        return 0

    def mlp(ctx, x, rows, out, bf16, scratch, step):
        li = ctypes.c_int64.from_address(ctx).value
        calls.append(("mlp", step.contents.layer, rows, li))
        got = model._mlp_block(model.layers[li], _view(x, rows, hidden, dtype), None)
        _view(out, rows, hidden, dtype).copy_(got)
        return 0

    attn_fn, mlp_fn = HALF_FN(attention), HALF_FN(mlp)
    weights, extras = list(built_in._weights), list(built_in._extras)
    # layer 0: its own MLP half, layer 1: its own attention half (their matrices left out)
    norm1, qkv, o, norm2, _, _ = weights[0]
    weights[0] = (norm1, qkv, o, norm2, None, None)
    index = [ctypes.c_int64(0), ctypes.c_int64(1)]
    address = [ctypes.addressof(i) for i in index]
    hook = ChainHook(ctypes.cast(mlp_fn, ctypes.c_void_p).value, address[0], (mlp_fn, index))
    extras[0] = dataclasses.replace(extras[0], mlp_half=hook)
    norm1, _, _, norm2, gate_up, down = weights[1]
    weights[1] = (norm1, None, None, norm2, gate_up, down)
    hook = ChainHook(ctypes.cast(attn_fn, ctypes.c_void_p).value, address[1], (attn_fn, index))
    extras[1] = dataclasses.replace(extras[1], attn_half=hook)
    family = built_in.family
    assert DecodeChain.supported(weights, dtype, family, extras)
    assert not DecodeChain.supported(weights, dtype, family, None)  # matrices missing, no hook
    hooked = DecodeChain(weights, built_in._scales, built_in.eps, dtype, family, extras)
    _same_decode(model, hooked, dtype)
    assert [c[:3] for c in calls] == [("mlp", 0, 3), ("attn", 1, 3)] * 4
    assert all(calls[1][3:6])  # the layer's pools and rope arguments
    assert calls[1][6] == int(dtype == torch.bfloat16)


def test_partial_rotary_on_the_chain_and_on_rope_attend(tiny_file):
    """Partial rotary (the first half of each head rotated, Phi-4-mini's kind): the chain gives
    the per-layer loop's bits (both through the fused C rotary + attention), and the per-layer
    loop with rope_attend gives the torch rotation's tokens (logits to rounding)."""
    from runtime.attention import make_backend
    from runtime.models.llama import LlamaModel
    from tests.support.forward_batches import decode_run

    dtype = torch.float32
    config, state = load_gguf(tiny_file)
    config = dataclasses.replace(config, partial_rotary_factor=0.5)
    assert config.rope_dim == config.head_dim // 2
    model = LlamaModel(config, state, dtype, attention=make_backend("cpu"))
    assert model._chain is not None, model.decode_path
    assert f"partial rotary ({config.rope_dim} of {config.head_dim})" in model.decode_path
    assert all(layer.rope_attend for layer in model.layers)
    _same_decode(model, model._chain, dtype)
    prompts = [[5, 17, 300, 42, 9], [7, 7, 1000]]
    fused_tokens, fused = decode_run(model, dtype, prompts, steps=4)  # rope_attend, no chain
    for layer in model.layers:  # the torch rotation (decoder._rotate), then attend
        layer.rope_attend = False
    model._explicit_rope = True
    tokens, plain = decode_run(model, dtype, prompts, steps=4)
    assert torch.equal(fused_tokens, tokens)
    torch.testing.assert_close(fused, plain, atol=1e-5 * plain.abs().max(), rtol=0)


def test_longrope_decode_on_the_chain(tiny_file):
    """LongRoPE (Phi-3's) on the chain and on the per-layer loop's rope_attend (decode-only
    steps): a decode token at or past the original context (16 here) rotates with the long
    factors, one before it with the short ones; with partial rotary. Chain and rope_attend the
    same bits; the same tokens as the per-token torch rotation, logits to rounding, for
    requests on either side of the boundary and one crossing it during the steps."""
    from runtime.attention import make_backend
    from runtime.models.llama import LlamaModel
    from tests.support.forward_batches import decode_run

    dtype = torch.float32
    config, state = load_gguf(tiny_file)
    rd = config.head_dim // 2
    scaling = {"rope_type": "longrope", "original_max_position_embeddings": 16,
               "short_factor": [1.0 + k / 4 for k in range(rd // 2)],
               "long_factor": [2.0 + k for k in range(rd // 2)]}  # fmt: skip
    config = dataclasses.replace(config, rope_scaling=scaling, partial_rotary_factor=0.5)
    model = LlamaModel(config, state, dtype, attention=make_backend("cpu"))
    assert model._chain is not None and "LongRoPE" in model.decode_path, model.decode_path
    prompts = [[5, 17, 300, 42, 9], [7] * 14, [12] * 20]
    model._chain.runs = 0
    tokens, chained = decode_run(model, dtype, prompts, steps=5)
    assert model._chain.runs == 5
    chain, model._chain = model._chain, None
    fused_tokens, fused = decode_run(model, dtype, prompts, steps=5)  # per layer, rope_attend
    assert torch.equal(tokens, fused_tokens) and torch.equal(chained, fused)
    model.longrope_decode = False  # the per-token torch rotation (its short / long rows)
    plain_tokens, plain = decode_run(model, dtype, prompts, steps=5)
    assert torch.equal(tokens, plain_tokens)
    torch.testing.assert_close(chained, plain, atol=1e-5 * plain.abs().max(), rtol=0)
    short_only = dataclasses.replace(config, rope_scaling={**scaling, "long_factor":
                                                           scaling["short_factor"]})  # fmt: skip
    model = LlamaModel(short_only, state, dtype, attention=make_backend("cpu"))
    _, other = decode_run(model, dtype, prompts, steps=5)
    assert not torch.allclose(other[:, 2], plain[:, 2], atol=1e-3)  # the long factors matter
    assert chain.runs == 5


def test_soft_capped_scores_on_the_chain(tiny_file):
    """Attention logit soft-capping (cap * tanh(s / cap)) in the chain's C decode attention:
    the per-layer loop's bits on the cpu backend (the same fused step), and the torch
    backend's reference attention's tokens (logits to rounding); the cap changes them."""
    from runtime.attention import make_backend
    from runtime.models.llama import LlamaModel
    from tests.support.forward_batches import decode_run

    dtype = torch.float32
    config, state = load_gguf(tiny_file)
    capped = dataclasses.replace(config, attn_logit_softcapping=0.5)
    model = LlamaModel(capped, state, dtype, attention=make_backend("cpu"))
    assert model._chain is not None and "soft-capping" in model.decode_path, model.decode_path
    chain = model._chain
    _same_decode(model, chain, dtype)
    prompts = [[5, 17, 300, 42, 9], [7] * 14]
    model._chain, chain.runs = chain, 0
    tokens, chained = decode_run(model, dtype, prompts, steps=4)
    assert chain.runs == 4
    reference = LlamaModel(capped, state, dtype, attention=make_backend("torch"))
    ref_tokens, ref = decode_run(reference, dtype, prompts, steps=4)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(chained, ref, atol=1e-4 * ref.abs().max(), rtol=0)
    _, uncapped = decode_run(LlamaModel(config, state, dtype, attention=make_backend("torch")),
                             dtype, prompts, steps=4)  # fmt: skip
    assert not torch.allclose(uncapped, ref, atol=1e-3)
