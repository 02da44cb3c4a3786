"""Qwen3, Qwen3-MoE, Gemma 3 text, Mixtral and Phi-3 in the engine against `transformers`'
`generate()` on tiny random folders: greedy tokens alone and batched, with the radix cache on and
off, through chunked prefill, eviction and preemption, and prompts longer than Gemma 3's
window; configs the engine cannot honour are refused by name."""

from __future__ import annotations

import pytest

from runtime import Engine
from runtime.config import SLIDING, config_from_dict, load_config
from runtime.errors import UnsupportedModelError
from tests.support.family_models import FAMILIES, WINDOW, expected_tokens, make_family_model
from tests.support.tiny_models import PROMPTS, smollm_tokenizer

NEW = 8
GREEDY = dict(max_new_tokens=NEW, min_new_tokens=NEW, temperature=0.0)


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    """(kind, folder, transformers' greedy tokens per prompt)."""
    folder = make_family_model(tmp_path_factory.mktemp(request.param) / "m", request.param)
    return request.param, folder, expected_tokens(folder, PROMPTS, NEW)


@pytest.mark.parametrize("cache", [True, False], ids=["cache-on", "cache-off"])
def test_greedy_tokens_match_transformers_alone_and_batched(tiny, cache):
    _, folder, expected = tiny
    with Engine(str(folder), page_size=4, chunked_prefill_tokens=8,
                enable_radix_cache=cache, mem_budget_gb=0.02) as e:  # fmt: skip
        for p in PROMPTS[:2]:
            assert e.generate(p, **GREEDY).token_ids == expected[p]
        batch = PROMPTS * 2  # the second copies reuse the first ones' cached prefixes
        assert [r.token_ids for r in e.generate(batch, **GREEDY)] == [expected[p] for p in batch]
        assert (e.stats()["cache_hit_tokens"] > 0) == cache
        e.check_integrity()


def test_tiny_pool_evicts_and_preempts_without_changing_outputs(tiny):
    _, folder, expected = tiny
    with Engine(str(folder), page_size=4, max_total_tokens=96, chunked_prefill_tokens=16) as e:
        results = e.generate(PROMPTS * 2, **GREEDY)
        assert [r.token_ids for r in results] == [expected[p] for p in PROMPTS * 2]
        assert e.stats()["preemptions"] > 0
        e.check_integrity()


def test_gemma3_prompts_outrun_the_window():
    """The fixture's Gemma 3 window is shorter than the prompts the tests compare on."""
    tok = smollm_tokenizer()
    assert sum(len(tok(p)["input_ids"]) > WINDOW for p in PROMPTS) >= 4


LONGROPE = {"rope_type": "longrope", "original_max_position_embeddings": 16,
            "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 4.0, 6.0, 9.0]}  # fmt: skip


@pytest.mark.parametrize(
    "kind, overrides",
    [
        pytest.param("gemma3", dict(final_logit_softcapping=5.0), id="gemma3-final-soft-cap"),
        pytest.param("phi3", dict(rope_parameters=dict(LONGROPE, rope_theta=10000.0,
                                                       partial_rotary_factor=0.5)),
                     id="phi3-longrope-partial-rotary"),
        pytest.param("phi3", dict(sliding_window=WINDOW), id="phi3-sliding-window"),
        pytest.param("mistral", dict(sliding_window=WINDOW), id="mistral-sliding-window"),
        pytest.param("qwen2", dict(use_sliding_window=True, sliding_window=WINDOW,
                                   max_window_layers=1), id="qwen2-window-past-layer-1"),
        pytest.param("qwen3", dict(use_sliding_window=True, sliding_window=WINDOW,
                                   max_window_layers=1), id="qwen3-window-past-layer-1"),
        pytest.param("qwen3_moe", dict(decoder_sparse_step=2, mlp_only_layers=[],
                                       norm_topk_prob=False), id="qwen3-moe-sparse-step"),
        pytest.param("mixtral", dict(sliding_window=WINDOW, num_experts_per_tok=1),
                     id="mixtral-window-top1"),
    ],
)  # fmt: skip
def test_configured_variants_match_transformers(tmp_path, kind, overrides):
    """Final-logit soft-capping, LongRoPE past the original context with partial rotary,
    windows on every layer or past `max_window_layers`, sparse steps, top-1 routing: one chunk
    per prompt (LongRoPE picks its factors per forward call in transformers, so chunks would
    differ there)."""
    folder = make_family_model(tmp_path / "m", kind, **overrides)
    prompts = PROMPTS[1:4]
    expected = expected_tokens(folder, prompts, NEW)
    with Engine(str(folder), page_size=4, mem_budget_gb=0.02) as e:
        got = [r.token_ids for r in e.generate(prompts, **GREEDY)]
    assert got == [expected[p] for p in prompts]


def _config(kind: str, **changes):
    from tests.support.family_models import family_config

    cfg = family_config(kind).to_dict()
    cfg.update(changes)
    return cfg


def test_parsed_shapes():
    gemma = config_from_dict(_config("gemma3"))
    assert gemma.layer_types[1] != SLIDING and gemma.layer_window(0) == WINDOW
    assert gemma.layer_window(1) is None and gemma.local_rope["rope_theta"] == 10_000.0
    assert gemma.rope_theta == 1_000_000.0 and gemma.qk_norm
    assert gemma.hidden_act == "gelu_pytorch_tanh" and gemma.query_pre_attn_scalar == 24
    moe = config_from_dict(_config("qwen3_moe"))
    assert [moe.moe.sparse_layer(i) for i in range(3)] == [True, False, True]
    mixtral = config_from_dict(_config("mixtral"))
    assert mixtral.moe.norm_topk_prob and mixtral.moe.moe_intermediate_size == 128
    phi = config_from_dict(
        _config("phi3", rope_parameters=dict(LONGROPE, rope_theta=1e4, partial_rotary_factor=0.5))
    )
    assert phi.rope_type == "longrope" and phi.rope_dim == 8
    assert not config_from_dict(_config("qwen3")).window_layers


@pytest.mark.parametrize(
    "kind, changes, named",
    [
        ("gemma3", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
        ("gemma3", dict(hidden_activation="relu2"), "relu2"),
        ("gemma3", dict(layer_types=["sliding_attention"]), "layer_types"),
        ("phi3", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "dynamic"),
        ("qwen3_moe", dict(num_experts=None, num_local_experts=None), "num_experts"),
    ],
)
def test_a_config_the_engine_cannot_honour_is_named(kind, changes, named):
    with pytest.raises(UnsupportedModelError, match=named):
        config_from_dict(_config(kind, **changes))


def test_window_layers_of_a_saved_folder(tiny):
    kind, folder, _ = tiny
    config = load_config(folder)
    assert config.window_layers == (2 if kind == "gemma3" else 0)
