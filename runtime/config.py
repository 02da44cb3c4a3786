"""The model shape the engine needs, read from a `transformers` config (dict or object).

Only plain JSON keys are read, so `python -m runtime.kv_size config.json` works on a bare config
file without importing `transformers`. Both the transformers 4 layout (`rope_theta` and
`rope_scaling` at the top level) and the 5 layout (`rope_parameters`) are understood.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.errors import ModelNotFoundError, UnsupportedModelError

# model_type -> whether q/k/v projections always carry a bias (Qwen2 does, without a flag)
SUPPORTED_MODEL_TYPES = {"llama": False, "mistral": False, "qwen2": True}
# the architecture a config without `architectures` (a bare or hand-written one) stands for
DEFAULT_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(slots=True)
class ModelConfig:
    model_type: str
    architecture: str  # picks the model class (runtime/models/registry.py)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None

    @property
    def rope_type(self) -> str:
        return str(self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default")))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V, every layer: 2 x layers x kv_heads x head_dim x dtype_bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def _eos_ids(raw: Any) -> tuple[int, ...]:
    if raw is None:
        return ()
    if isinstance(raw, int):
        return (raw,)
    return tuple(int(x) for x in raw)


def config_from_dict(cfg: dict[str, Any]) -> ModelConfig:
    """Build a `ModelConfig` from a config.json dict; unsupported models raise clearly."""
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        archs = cfg.get("architectures")
        raise UnsupportedModelError(
            f"model_type {model_type!r} (architectures {archs}) is not supported; "
            f"supported: {sorted(SUPPORTED_MODEL_TYPES)}"
        )
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only 'silu')")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    rope: dict[str, Any] = dict(cfg.get("rope_parameters") or {})
    rope.update(cfg.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope scaling {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
        )
    always_bias = SUPPORTED_MODEL_TYPES[model_type]
    attention_bias = bool(cfg.get("attention_bias", False))
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    archs = cfg.get("architectures") or [DEFAULT_ARCHITECTURES[model_type]]
    return ModelConfig(
        model_type=model_type,
        architecture=str(archs[0]),
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        rope_theta=theta,
        rope_scaling=rope,
        qkv_bias=always_bias or attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        hidden_act=act,
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
        sliding_window=int(window) if window else None,
    )


def load_config(path: str | Path) -> ModelConfig:
    """Read `config.json` from a model folder, or a config file given directly."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ModelNotFoundError(f"no model config at {file}")
    with open(file) as f:
        return config_from_dict(json.load(f))
