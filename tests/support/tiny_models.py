"""Tiny randomly initialised models (with SmolLM2's real tokenizer) for the runtime tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

_tokenizer = None


def smollm_tokenizer():
    """SmolLM2's tokenizer, from the converted default model (converted on first use)."""
    global _tokenizer
    if _tokenizer is None:
        from transformers import AutoTokenizer

        from runtime.default_model import ensure_default_model

        _tokenizer = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    return _tokenizer


# DeepSeek V2 / V3 shapes: MLA (latent 32 + rope 8), 3 layers (1 dense, 2 MoE of 8 experts)
DEEPSEEK = dict(
    num_hidden_layers=3,
    num_key_value_heads=4,
    moe_intermediate_size=32,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
)
DEEPSEEK_VERSIONS = {
    "deepseek_v2": dict(q_lora_rank=None, topk_method="greedy"),
    "deepseek_v3": dict(q_lora_rank=24, n_group=2, topk_group=1),
}


def tiny_config(kind: str = "llama", **overrides: Any):
    """A 2-layer GQA config of the given family with SmolLM2's vocabulary size (DeepSeek: the
    MLA + MoE shapes above)."""
    from transformers import (
        DeepseekV2Config,
        DeepseekV3Config,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
    )

    tok = smollm_tokenizer()
    base = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=0.1,  # peaked logits: greedy ties are practically impossible
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    if kind in DEEPSEEK_VERSIONS:
        base.update(DEEPSEEK, **DEEPSEEK_VERSIONS[kind])
    base.update(overrides)
    cls = {
        "llama": LlamaConfig,
        "qwen2": Qwen2Config,
        "mistral": MistralConfig,
        "deepseek_v2": DeepseekV2Config,
        "deepseek_v3": DeepseekV3Config,
    }[kind]
    return cls(**base)


def make_tiny_model(folder: Path, kind: str = "llama", seed: int = 0, **overrides: Any) -> Path:
    """Save a random tiny model plus SmolLM2's tokenizer into `folder`; returns it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind, **overrides)).eval()
    with torch.no_grad():  # Qwen2 biases start at zero: make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(folder)
    smollm_tokenizer().save_pretrained(folder)
    return folder


def hf_model(folder: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # compare fixed-length greedy runs
    model.generation_config.pad_token_id = 0
    return model


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' generate(), greedy, exactly `max_new_tokens` tokens."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return out[0, len(prompt_ids) :].tolist()


PROMPTS = [
    "The quick brown fox",
    "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole,",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there was a small village where",
    "1, 2, 3, 4,",
    "The quick brown fox jumps over the lazy dog and then",
]
