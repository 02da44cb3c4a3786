"""DeepSeek V2 / V3 in the engine against `transformers`' own forward, on tiny random configs
(3 layers: 1 dense, 2 MoE of 8 experts; MLA with a 32 + 8 latent; V3 with q_lora_rank, groups
and sigmoid routing, V2 with softmax routing): greedy tokens alone, batched, with the cache on
and off, through chunked prefill, eviction and preemption; logits; the latent KV cache's size;
absorbed and decompressed attention agreeing; expert load; configs the engine cannot honour; the
model built by the one decoder (decoder.py with mla.py's attention)."""

from __future__ import annotations

import json

import pytest
import torch

from runtime import Engine
from runtime.config import FULL, config_from_dict, load_config
from runtime.errors import UnsupportedModelError
from runtime.kernels.cpu import quant as cpu_quant
from runtime.models import mla
from runtime.models.decoder import DecoderModel
from tests.support.tiny_models import PROMPTS, YARN, hf_greedy, hf_model, make_tiny_model

KINDS = ["deepseek_v3", "deepseek_v2"]
GREEDY = dict(max_new_tokens=10, min_new_tokens=10, temperature=0.0)


@pytest.fixture(scope="module", params=KINDS)
def tiny(request, tmp_path_factory):
    """(kind, folder, transformers' greedy tokens per prompt)."""
    folder = make_tiny_model(tmp_path_factory.mktemp(request.param) / "m", request.param)
    hf = hf_model(folder)
    tok = hf_tokenizer(folder)
    expected = {p: hf_greedy(hf, tok(p)["input_ids"], GREEDY["max_new_tokens"]) for p in PROMPTS}
    return request.param, folder, expected


def hf_tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize("cache", [True, False], ids=["cache-on", "cache-off"])
def test_greedy_tokens_match_transformers_alone_and_batched(tiny, cache):
    _, folder, expected = tiny
    with Engine(str(folder), page_size=4, chunked_prefill_tokens=8,
                enable_radix_cache=cache) as e:  # fmt: skip
        for p in PROMPTS[:2]:
            assert e.generate(p, **GREEDY).token_ids == expected[p]
        batch = PROMPTS * 2  # the second copies reuse the first ones' cached prefixes
        assert [r.token_ids for r in e.generate(batch, **GREEDY)] == [expected[p] for p in batch]
        stats = e.stats()
        assert (stats["cache_hit_tokens"] > 0) == cache
        e.check_integrity()


def test_tiny_pool_evicts_and_preempts_without_changing_outputs(tiny):
    _, folder, expected = tiny
    with Engine(str(folder), page_size=4, max_total_tokens=96, chunked_prefill_tokens=16) as e:
        results = e.generate(PROMPTS * 2, **GREEDY)
        assert [r.token_ids for r in results] == [expected[p] for p in PROMPTS * 2]
        assert e.stats()["preemptions"] > 0
        e.check_integrity()


def test_pool_holds_one_latent_per_token(tiny):
    kind, folder, _ = tiny
    config = load_config(folder)
    with Engine(str(folder), page_size=4) as e:
        latent = config.mla.kv_lora_rank + config.mla.qk_rope_head_dim
        assert e.stats()["kv_bytes_per_token"] == config.num_layers * latent * 4
        assert not e.pool.k and not e.pool.v
        assert e.pool.latent[0].shape[1:] == (4, 1, latent)
        # 2 x heads x head_dim would be 2 x 4 x (16 + 8) per layer: MLA holds 40 values
        assert latent < 2 * config.num_heads * config.mla.qk_head_dim
        # built by the one decoder: latent attention in place of q/k/v, and said to keep the
        # model off the one-call decode chain
        assert isinstance(e.model, DecoderModel)
        assert all(w.mla is not None and w.qkv is None for w in e.model.layers)
        assert "latent attention (MLA)" in e.model.decode_path


def test_absorbed_and_decompressed_attention_agree(tiny, monkeypatch):
    """Absorbed (decode rows through csrc/mla.c where it is built, checked against the torch
    ops at every layer call), decompressed and transformers give the same tokens."""
    _, folder, expected = tiny
    diffs = compare_decode_kernel(monkeypatch)
    with Engine(str(folder), page_size=4, chunked_prefill_tokens=8) as e:
        absorbed = [r.token_ids for r in e.generate(PROMPTS[:3], **GREEDY)]
        e.flush_cache()
        e.model.absorb = False
        decompressed = [r.token_ids for r in e.generate(PROMPTS[:3], **GREEDY)]
    assert absorbed == decompressed == [expected[p] for p in PROMPTS[:3]]
    if cpu_quant.library() is not None:  # every decode step's layers took the kernel
        assert diffs and max(diffs) < 1e-5


def compare_decode_kernel(monkeypatch) -> list[float]:
    """Every decode-only layer call of mla.py's C kernel checked against its torch ops on the
    same inputs (the torch ops store the latents first, the kernel again): the max absolute
    difference of each call's output, in a list the test reads."""
    diffs: list[float] = []
    kernel = mla.decode_kernel

    def both(w, q, proj, config, attention, layer, spec, cos_sin):
        monkeypatch.setattr(mla, "C_DECODE", False)
        ref = mla.latent_attention(w, proj[:, : w.q_rows], _Same(proj, q, w.q_b), config,
                                   attention, layer, spec, cos_sin)  # fmt: skip
        monkeypatch.setattr(mla, "C_DECODE", True)
        out = kernel(w, q, proj, config, attention, layer, spec, cos_sin)
        if out is not None:
            diffs.append(float((out.float() - ref.float()).abs().max()))
        return out

    monkeypatch.setattr(mla, "decode_kernel", both)
    return diffs


class _Same:
    """An `mm` that gives back the products already made (x_proj's, and q_b's query)."""

    def __init__(self, proj, q, q_b) -> None:
        self.proj, self.q, self.q_b = proj, q, q_b

    def __call__(self, x, w, bias=None):
        return self.q if w is self.q_b and w is not None else self.proj


def test_expert_load_counts_every_routed_token(tiny):
    _, folder, _ = tiny
    config = load_config(folder)
    with Engine(str(folder), page_size=4) as e:
        r = e.generate("The quick brown fox jumps", max_new_tokens=3, temperature=0.0)
        stats = e.stats()
    k = config.moe.num_experts_per_tok
    moe_layers = config.num_layers - config.moe.first_k_dense_replace
    last, total = stats["expert_load_last_step"], stats["expert_load_total"]
    assert len(last) == moe_layers and all(len(row) == config.moe.n_routed_experts for row in last)
    assert all(sum(row) == k for row in last)  # the last step decoded one token
    # every token the model ran went to k experts in each MoE layer
    forwarded = r.usage.prompt_tokens + r.usage.completion_tokens - 1
    assert all(sum(row) == k * forwarded for row in total)


def test_greedy_tokens_match_with_yarn_and_non_interleaved_rope(tmp_path):
    """V3 with YaRN scaling (mscale in the softmax scale and on cos/sin) and rope_interleave
    off (the logits themselves: tests/runtime/models/test_forward.py)."""
    folder = make_tiny_model(tmp_path / "m", "deepseek_v3", rope_scaling=YARN,
                             rope_interleave=False)  # fmt: skip
    hf = hf_model(folder)
    ids = hf_tokenizer(folder)(PROMPTS[1])["input_ids"]
    with Engine(str(folder), page_size=4) as e:
        assert e.generate(ids, **GREEDY).token_ids == hf_greedy(hf, ids, 10)
    assert load_config(folder).rope_type == "yarn"


@pytest.mark.parametrize(
    "kind, field, value",
    [
        ("deepseek_v2", "topk_method", "noaux_tc_v9"),
        ("deepseek_v3", "topk_method", "greedy"),
        ("deepseek_v3", "scoring_func", "softmax"),
        ("deepseek_v2", "scoring_func", "sigmoid"),
    ],
)
def test_a_field_the_engine_cannot_honour_is_named(kind, field, value):
    from tests.support.tiny_models import tiny_config

    cfg = tiny_config(kind).to_dict()
    cfg[field] = value
    with pytest.raises(UnsupportedModelError, match=f"{field} {value!r}"):
        config_from_dict(cfg)


def test_an_unknown_rope_scaling_is_named(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "deepseek_v3")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="longrope"):
        load_config(folder)


def test_constrained_json_with_jump_forward_on_the_latent_cache(tiny):
    """Jump-forward re-tokenises and rolls back KV: on the latent cache too."""
    _, folder, _ = tiny
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
              "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"],
              "additionalProperties": False}  # fmt: skip
    with Engine(str(folder), page_size=4) as e:
        r = e.generate("Give a person as JSON:", json_schema=schema, max_new_tokens=60,
                       temperature=0.0)  # fmt: skip
        e.check_integrity()
    assert r.finish_reason == "stop", r
    value = json.loads(r.text)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)


def test_the_c_decode_attention_matches_the_torch_ops_in_bf16(tiny):
    """Decode-only steps with each layer's latent attention in one C call (csrc/mla.c) against
    mla.py's torch ops on the same bf16 model: the same greedy tokens, logits equal to rounding
    (the C sums in float32, torch rounds each op to bf16), three requests of different lengths
    (float32: every layer call in test_absorbed_and_decompressed_attention_agree)."""
    dtype = torch.bfloat16
    from runtime.attention import make_backend
    from runtime.models.loader import load_model_files
    from runtime.models.registry import model_class
    from tests.support.forward_batches import decode_run

    if cpu_quant.library() is None:
        pytest.skip("no C compiler: the torch ops are the only path")
    _, folder, _ = tiny
    loaded = load_model_files(folder)
    model = model_class(loaded.config)(loaded.config, loaded.state_dict, dtype,
                                       attention=make_backend("cpu"))  # fmt: skip
    prompts = [[5, 17, 300, 42, 9] * 3, [7, 7, 1000], [12] * 9]
    before = mla.c_steps
    tokens, logits = decode_run(model, dtype, prompts, steps=4)
    assert mla.c_steps - before == 4 * loaded.config.num_layers
    mla.C_DECODE = False
    try:
        plain_tokens, plain = decode_run(model, dtype, prompts, steps=4)
    finally:
        mla.C_DECODE = True
    assert torch.equal(tokens, plain_tokens)
    torch.testing.assert_close(logits, plain, atol=3e-2 * plain.abs().max(), rtol=0)


def test_tensor_parallel_ranks_hold_their_heads(tiny):
    """Two tensor ranks' latent attention (each its heads' rows of q_proj or q_b_proj and
    kv_b_proj, the latent replicated) joined by heads is the whole model's, and their o partial
    products sum to its o product (V2: q_proj split; V3: q_b_proj), on a decode + extend step."""
    from runtime.attention import make_backend
    from runtime.memory.kv_pool import KVPool
    from runtime.models.loader import load_model_files
    from runtime.models.registry import model_class
    from runtime.parallel.shard import Shard
    from tests.support.forward_batches import mixed_batch

    _, folder, _ = tiny
    loaded = load_model_files(folder)
    config, cls = loaded.config, model_class(loaded.config)
    models = [cls(config, loaded.state_dict, torch.float32, attention=make_backend("torch"))]
    models += [cls(config, loaded.state_dict, torch.float32, shard=Shard(tp_rank=r, tp_size=2),
                   attention=make_backend("torch")) for r in range(2)]  # fmt: skip
    assert [m.num_heads for m in models] == [config.num_heads] + [config.num_heads // 2] * 2
    batch, g = mixed_batch(), torch.Generator().manual_seed(0)
    x = torch.randn(batch.input_ids.shape[0], config.hidden_size, generator=g)
    latents = torch.randn(8, 4, 1, config.mla.kv_lora_rank + config.mla.qk_rope_head_dim,
                          generator=g)  # fmt: skip
    outs, projected = [], []
    for m in models:
        pool = KVPool(config, 8, 4, torch.float32)
        pool.latent[0].copy_(latents)  # the cached prefixes
        m.attention.plan(batch, pool)
        layer = m.layers[0]
        cos_sin = m.rotary[FULL].cos_sin(batch.positions)
        out = mla.latent_attention(layer.mla, x, m.mm, config, m.attention, 0, layer.spec,
                                   cos_sin)  # fmt: skip
        outs.append(out)
        projected.append(m.mm(out, layer.o))
    torch.testing.assert_close(torch.cat(outs[1:], dim=-1), outs[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(projected[1] + projected[2], projected[0], atol=1e-5, rtol=1e-5)
