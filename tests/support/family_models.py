"""Tiny random folders of the families on the shared decoder (Qwen3, Qwen3-MoE, Gemma 3 text,
Mixtral, Phi-3), saved by `transformers` with SmolLM2's tokenizer, and their greedy tokens
from `transformers`' own `generate()`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.support.tiny_models import hf_greedy, hf_model, smollm_tokenizer

FAMILIES = ["qwen3", "qwen3_moe", "gemma3", "mixtral", "phi3"]
WINDOW = 8  # shorter than every prompt of PROMPTS past the first

_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2": {},
    "mistral": {},
    "qwen3": dict(head_dim=16),
    "qwen3_moe": dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      norm_topk_prob=True, num_hidden_layers=3, mlp_only_layers=[1]),
    "gemma3": dict(head_dim=16, num_hidden_layers=3, sliding_window=WINDOW,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   query_pre_attn_scalar=24, rope_parameters={
                       "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "phi3": dict(pad_token_id=0),
}  # fmt: skip


def family_config(kind: str, **overrides: Any):
    """A 2- or 3-layer GQA config of `kind` with SmolLM2's vocabulary."""
    import transformers

    cls = {
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
        "qwen3": transformers.Qwen3Config,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "gemma3": transformers.Gemma3TextConfig,
        "mixtral": transformers.MixtralConfig,
        "phi3": transformers.Phi3Config,
    }[kind]
    tok = smollm_tokenizer()
    base: dict[str, Any] = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=0.1,  # peaked logits: greedy ties are practically impossible
        tie_word_embeddings=kind == "gemma3",
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    base.update(_SHAPES[kind])
    base.update(overrides)
    return cls(**base)


def make_family_model(folder: Path, kind: str, seed: int = 0, **overrides: Any) -> Path:
    """Save a random tiny `kind` model plus SmolLM2's tokenizer into `folder`; returns it.
    Norm weights are drawn too (they start at one, or zero for Gemma's `1 + w`)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(kind, **overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    smollm_tokenizer().save_pretrained(folder)
    return folder


def expected_tokens(folder: Path, prompts: list[str], max_new_tokens: int) -> dict[str, list[int]]:
    """transformers' greedy tokens for each prompt."""
    model = hf_model(folder)
    tok = smollm_tokenizer()
    return {p: hf_greedy(model, tok(p)["input_ids"], max_new_tokens) for p in prompts}
