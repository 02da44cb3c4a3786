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
SUPPORTED_MODEL_TYPES = {
    "llama": False,
    "mistral": False,
    "qwen2": True,
    "deepseek_v2": False,
    "deepseek_v3": False,
    "qwen3": False,
    "qwen3_moe": False,
    "gemma3_text": False,
    "mixtral": False,
    "phi3": False,
}
# the architecture a config without `architectures` (a bare or hand-written one) stands for
DEFAULT_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "phi3": "Phi3ForCausalLM",
}
# the families on the shared decoder (runtime/models/decoder.py): windows, LongRoPE
DECODER_TYPES = frozenset({"qwen3", "qwen3_moe", "gemma3_text", "mixtral", "phi3"})
# the families whose sliding windows are honoured (Mistral's on every layer, as transformers;
# Qwen2's / Qwen3's from `max_window_layers` on where the config lists no layer_types)
WINDOW_TYPES = DECODER_TYPES | {"mistral", "qwen2"}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# hidden_act / hidden_activation values -> how the MLP's gate is activated
SUPPORTED_ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh")
# layer_types entries: full causal attention, or attention to the last `sliding_window` tokens
FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(slots=True, frozen=True)
class MLAConfig:
    """Multi-head Latent Attention (DeepSeek V2 / V3): per token the cache holds one latent of
    `kv_lora_rank` values plus a shared rotated key of `qk_rope_head_dim`."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    rope_interleave: bool = True  # rotary pairs (x0, x1), (x2, x3), ... as DeepSeek lays them

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(slots=True, frozen=True)
class MoEConfig:
    """Routed plus shared experts after the first `first_k_dense_replace` (dense) layers."""

    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    n_shared_experts: int
    first_k_dense_replace: int
    scoring: str  # "softmax" (V2) or "sigmoid" (V3, with e_score_correction_bias)
    topk_method: str  # "greedy" | "group_limited_greedy" (V2) | "noaux_tc" (V3)
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    decoder_sparse_step: int = 1  # Qwen3-MoE: every step-th layer is sparse
    mlp_only_layers: tuple[int, ...] = ()  # Qwen3-MoE: layers kept dense

    def sparse_layer(self, layer: int) -> bool:
        """Whether `layer` runs the experts (else a dense MLP of `intermediate_size`)."""
        return (
            layer >= self.first_k_dense_replace
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )


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
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None
    # per layer FULL or SLIDING; empty: every layer FULL (the Llama family ignores windows)
    layer_types: tuple[str, ...] = ()
    # the sliding layers' own RoPE (Gemma 3: another base), {"rope_theta": ..., scaling keys}
    local_rope: dict[str, Any] | None = None
    qk_norm: bool = False  # RMSNorm over each query / key head before RoPE (Qwen3, Gemma 3)
    partial_rotary_factor: float = 1.0  # the share of each head that RoPE rotates
    query_pre_attn_scalar: float | None = None  # Gemma: scale = this ** -0.5, not head_dim's
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None

    @property
    def rope_type(self) -> str:
        return str(self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default")))

    @property
    def rope_dim(self) -> int:
        """The dimensions each head rotates (MLA: only the rope part of a head)."""
        if self.mla:
            return self.mla.qk_rope_head_dim
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_window(self, layer: int) -> int | None:
        """The attention window of `layer` in tokens (its own included), None for full."""
        if self.layer_types and self.layer_types[layer] == SLIDING:
            return self.sliding_window
        return None

    @property
    def window_layers(self) -> int:
        """How many layers attend through a sliding window."""
        return sum(self.layer_window(i) is not None for i in range(self.num_layers))

    def kv_layout(self) -> tuple[tuple[str, int, int], ...]:
        """What the pool holds per layer and token: (name, heads, dim) per tensor. K and V of
        every KV head, or for MLA one latent "head" of kv_lora_rank + qk_rope_head_dim."""
        if self.mla:
            return (("latent", 1, self.mla.latent_dim),)
        return (("k", self.num_kv_heads, self.head_dim), ("v", self.num_kv_heads, self.head_dim))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Every layer's KV: layers x (2 x kv_heads x head_dim, or the MLA latent) x bytes."""
        per_layer = sum(heads * dim for _, heads, dim in self.kv_layout())
        return self.num_layers * per_layer * dtype_bytes


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
    act = cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise UnsupportedModelError(
            f"hidden_act {act!r} is not supported; supported: {SUPPORTED_ACTIVATIONS}"
        )
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError("use_bidirectional_attention is not supported (causal only)")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    theta, rope, local_rope = _rope_parts(cfg)
    if rope.get("rope_type", rope.get("type")) == "longrope" and model_type not in DECODER_TYPES:
        raise UnsupportedModelError(
            f"rope scaling 'longrope' is supported for {sorted(DECODER_TYPES)}, not {model_type}"
        )
    partial = float(rope.pop("partial_rotary_factor", cfg.get("partial_rotary_factor") or 1.0))
    mla = moe = None
    if model_type.startswith("deepseek"):
        mla, moe = _deepseek_parts(cfg, model_type)
    elif model_type in ("qwen3_moe", "mixtral"):
        moe = _routed_moe(cfg, model_type)
    always_bias = SUPPORTED_MODEL_TYPES[model_type]
    attention_bias = bool(cfg.get("attention_bias", False))
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    archs = cfg.get("architectures") or [DEFAULT_ARCHITECTURES[model_type]]
    num_layers = int(cfg["num_hidden_layers"])
    softcap = cfg.get("attn_logit_softcapping")
    final_softcap = cfg.get("final_logit_softcapping")
    return ModelConfig(
        model_type=model_type,
        architecture=str(archs[0]),
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=num_layers,
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
        mla=mla,
        moe=moe,
        layer_types=_layer_types(cfg, model_type, num_layers, window),
        local_rope=local_rope,
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
        partial_rotary_factor=partial,
        query_pre_attn_scalar=_optional_float(cfg.get("query_pre_attn_scalar")),
        attn_logit_softcapping=_optional_float(softcap),
        final_logit_softcapping=_optional_float(final_softcap),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _rope_parts(cfg: dict[str, Any]) -> tuple[float, dict[str, Any], dict[str, Any] | None]:
    """(rope_theta, the scaling keys, the sliding layers' own rope or None) from either
    layout: transformers 4 (`rope_theta`, `rope_scaling`, Gemma's `rope_local_base_freq` at the
    top level) or 5 (`rope_parameters`, per layer type for Gemma 3)."""
    params: dict[str, Any] = dict(cfg.get("rope_parameters") or {})
    local: dict[str, Any] | None = None
    if FULL in params or SLIDING in params:  # one rope per layer type
        local = dict(params.get(SLIDING) or {})
        params = dict(params.get(FULL) or {})
    elif cfg.get("rope_local_base_freq") is not None:
        local = {"rope_theta": float(cfg["rope_local_base_freq"])}
    rope = dict(params)
    rope.update(cfg.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    for kind, parts in (("", rope), ("sliding layers' ", local or {})):
        rope_type = parts.get("rope_type", parts.get("type", "default"))
        if rope_type == "su":  # Phi-3's older name for LongRoPE
            parts["rope_type"] = rope_type = "longrope"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"{kind}rope scaling {rope_type!r} is not supported; "
                f"supported: {SUPPORTED_ROPE_TYPES}"
            )
    if rope.get("rope_type", rope.get("type")) == "longrope":
        rope.setdefault(
            "original_max_position_embeddings",
            cfg.get("original_max_position_embeddings") or cfg.get("max_position_embeddings"),
        )
    return theta, rope, local


def _layer_types(
    cfg: dict[str, Any], model_type: str, num_layers: int, window: Any
) -> tuple[str, ...]:
    """FULL / SLIDING per layer for the families whose windows the engine honours: the config's
    `layer_types` when it has them, else (Qwen2 / Qwen3) the layers from `max_window_layers` on,
    else every layer sliding when a window is set (Mistral, Mixtral, Phi-3)."""
    if model_type not in WINDOW_TYPES:
        return ()
    types = cfg.get("layer_types")
    if types is None and model_type in ("qwen2", "qwen3", "qwen3_moe"):
        start = int(cfg.get("max_window_layers", 28))  # transformers' default
        types = [SLIDING if window and i >= start else FULL for i in range(num_layers)]
    if types is None and model_type == "gemma3_text":  # older configs: a pattern of 6
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if types is None:
        types = [SLIDING if window else FULL] * num_layers
    types = tuple(str(t) for t in types)
    if len(types) != num_layers or not set(types) <= {FULL, SLIDING}:
        raise UnsupportedModelError(
            f"layer_types {list(types)} must list {FULL!r} or {SLIDING!r} for each of the "
            f"{num_layers} layers"
        )
    if SLIDING in types and not window:
        if model_type == "qwen3" or model_type == "qwen3_moe":
            return tuple(FULL for _ in types)  # use_sliding_window off: windows unused
        raise UnsupportedModelError(f"layer_types has {SLIDING!r} layers but no sliding_window")
    return types


def _routed_moe(cfg: dict[str, Any], model_type: str) -> MoEConfig:
    """Qwen3-MoE and Mixtral: softmax over all experts, top-k, renormalised (always for
    Mixtral, when `norm_topk_prob` for Qwen3-MoE); no shared experts."""
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if not experts:
        raise UnsupportedModelError(f"{model_type} config names no experts (num_experts)")
    mixtral = model_type == "mixtral"
    return MoEConfig(
        n_routed_experts=int(experts),
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 2),
        moe_intermediate_size=int(
            cfg["intermediate_size"] if mixtral else cfg["moe_intermediate_size"]
        ),
        n_shared_experts=0,
        first_k_dense_replace=0,
        scoring="softmax",
        topk_method="greedy",
        n_group=1,
        topk_group=1,
        norm_topk_prob=mixtral or bool(cfg.get("norm_topk_prob", False)),
        routed_scaling_factor=1.0,
        decoder_sparse_step=int(cfg.get("decoder_sparse_step") or 1),
        mlp_only_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()),
    )


# (model_type, field) -> the values the engine honours (None: the key may be absent)
_DEEPSEEK_CHOICES = {
    ("deepseek_v2", "topk_method"): (None, "greedy", "group_limited_greedy"),
    ("deepseek_v2", "scoring_func"): (None, "softmax"),
    ("deepseek_v3", "topk_method"): (None, "noaux_tc"),
    ("deepseek_v3", "scoring_func"): (None, "sigmoid"),
}


def _deepseek_parts(cfg: dict[str, Any], model_type: str) -> tuple[MLAConfig, MoEConfig | None]:
    """The MLA and MoE shapes of a DeepSeek V2 / V3 config; a field whose value the engine
    cannot honour raises UnsupportedModelError naming it."""
    for (kind, key), allowed in _DEEPSEEK_CHOICES.items():
        if kind == model_type and cfg.get(key) not in allowed:
            raise UnsupportedModelError(
                f"{key} {cfg.get(key)!r} is not supported for {model_type}; "
                f"supported: {[a for a in allowed if a is not None]}"
            )
    q_lora = cfg.get("q_lora_rank")
    mla = MLAConfig(
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
        v_head_dim=int(cfg["v_head_dim"]),
        q_lora_rank=int(q_lora) if q_lora else None,
        # V2 always rotates interleaved pairs; V3 says so with rope_interleave (default true)
        rope_interleave=model_type == "deepseek_v2" or bool(cfg.get("rope_interleave", True)),
    )
    experts = cfg.get("n_routed_experts")
    if not experts:
        return mla, None
    v3 = model_type == "deepseek_v3"
    default_method = "noaux_tc" if v3 else "greedy"
    moe = MoEConfig(
        n_routed_experts=int(experts),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["moe_intermediate_size"]),
        n_shared_experts=int(cfg.get("n_shared_experts") or 0),
        first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
        scoring="sigmoid" if v3 else "softmax",
        topk_method=str(cfg.get("topk_method") or default_method),
        n_group=int(cfg.get("n_group") or 1),
        topk_group=int(cfg.get("topk_group") or 1),
        # transformers' V2 router never renormalises the top-k weights; V3's does when asked
        norm_topk_prob=v3 and bool(cfg.get("norm_topk_prob", False)),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
    )
    if moe.n_routed_experts % moe.n_group:
        raise UnsupportedModelError(
            f"n_routed_experts {moe.n_routed_experts} is not a multiple of n_group {moe.n_group}"
        )
    return mla, moe


def load_config(path: str | Path) -> ModelConfig:
    """Read `config.json` from a model folder, or a config file given directly."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ModelNotFoundError(f"no model config at {file}")
    with open(file) as f:
        return config_from_dict(json.load(f))
