"""What a GGUF file's `general.architecture` means: the `transformers`-style config its metadata
describes and the checkpoint name of each of its tensors, one `Architecture` per family.

Facts of llama.cpp's converter this table relies on (each family's keys are
`<arch>.<key>`, its tensors `blk.N.<part>.weight`):

- `llama` holds Llama, Mistral and Mixtral (a file with `expert_count` is Mixtral); its q / k
  rows are permuted for llama.cpp's rotary layout, and only its (gguf.py permutes them back).
- `gemma3` stores every RMSNorm weight as `1 + w` (the norm multiplies by it as it is); the
  checkpoint convention is `w` (the model adds the one), so 1 is subtracted at load, as
  `transformers` does. Embeddings are scaled by sqrt(hidden) at run time, not in the file.
  Local layers use RoPE base 10,000 and one layer in six is global; the softmax scale is
  head_dim ** -0.5 (hidden / heads for the 62-layer 27B), as llama.cpp sets them.
- `phi3` keeps q / k / v in one `attn_qkv` and gate / up in one `ffn_up`; LongRoPE's factors are
  the tensors `rope_factors_long` / `rope_factors_short`.
- `qwen3moe` renormalises the top-k routing weights (llama.cpp always does); a layer with a
  dense `ffn_gate` instead of experts is one of `mlp_only_layers`.
- `deepseek2` is DeepSeek V2 and V3 (sigmoid gating, `expert_gating_func` 2, is V3). Files
  written for llama.cpp's MLA store the attention as one KV head of `kv_lora_rank + rope`
  (`key_length`) with the real head sizes under `key_length_mla` / `value_length_mla`, and
  `kv_b` also split into `attn_k_b` (transposed) and `attn_v_b`.
- Routed experts are one 3-D tensor per projection, `ffn_{gate,up,down}_exps` [E, rows, cols].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.config import FULL, SLIDING
from runtime.errors import UnsupportedModelError

# llama.cpp's layer tensor names -> the checkpoint names the model files read
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# routed experts: one 3-D tensor per projection
EXPERT_PARTS = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}


class Meta:
    """A file's metadata under one architecture's prefix."""

    def __init__(self, meta: dict[str, Any], arch: str) -> None:
        self.meta, self.arch = meta, arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(f"{self.arch}.{key}", default)

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise UnsupportedModelError(f"GGUF metadata {self.arch}.{key} is missing")
        return value

    def count(self, key: str, default: Any = None) -> Any:
        """An integer key that some files write per layer: one value for all layers."""
        value = self.get(key, default)
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise UnsupportedModelError(
                    f"GGUF metadata {self.arch}.{key} differs between layers ({sorted(set(value))})"
                )
            value = value[0]
        return value


@dataclass(frozen=True)
class Architecture:
    """One GGUF architecture: how its metadata becomes a config dict and its names ours."""

    config: Callable[[Meta, set[str]], dict[str, Any]]
    layer_names: dict[str, str] = field(default_factory=dict)  # overrides of _LAYER_NAMES
    permuted_qk: bool = False  # llama.cpp permuted q / k rows for its rotary layout
    norm_offset: bool = False  # norm weights stored as 1 + w

    def checkpoint_name(self, name: str) -> str | None:
        """`blk.3.ffn_up.weight` -> `model.layers.3.mlp.up_proj.weight` (None: not read here;
        routed experts and DeepSeek's split kv_b are gguf.py's to read)."""
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) == 4:
            if parts[2] == "exp_probs_b":
                return f"model.layers.{parts[1]}.mlp.gate.e_score_correction_bias"
            hf = self.layer_names.get(parts[2], _LAYER_NAMES.get(parts[2]))
            return None if hf is None else f"model.layers.{parts[1]}.{hf}.{parts[3]}"
        if parts[0] == "blk" and len(parts) == 5 and parts[2] in ("ffn_gate", "ffn_up", "ffn_down"):
            # older Mixtral files: one tensor per expert, `blk.N.ffn_gate.E.weight`
            proj = _LAYER_NAMES[parts[2]].split(".")[1]
            return f"model.layers.{parts[1]}.mlp.experts.{parts[3]}.{proj}.{parts[4]}"
        if len(parts) == 2 and parts[0] in _TOP_NAMES:
            return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
        return None


def _common(m: Meta, model_type: str) -> dict[str, Any]:
    heads = int(m.count("attention.head_count"))
    hidden = int(m.need("embedding_length"))
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(m.need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(m.count("attention.head_count_kv", heads)),
        "head_dim": int(m.get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(m.get("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(m.get("context_length", 2048)),
        "rope_theta": float(m.get("rope.freq_base", 10000.0)),
        "eos_token_id": m.meta.get("tokenizer.ggml.eos_token_id"),
    }
    ffn = m.count("feed_forward_length")
    if ffn:
        cfg["intermediate_size"] = int(ffn)
    if m.get("vocab_size") is not None:
        cfg["vocab_size"] = int(m.get("vocab_size"))
    scaling = m.get("rope.scaling.type")
    if scaling not in (None, "none"):
        factor = float(m.need("rope.scaling.factor"))
        rope: dict[str, Any] = {"rope_type": scaling, "factor": factor}
        original = m.get("rope.scaling.original_context_length")
        if original:
            rope["original_max_position_embeddings"] = int(original)
        cfg["rope_scaling"] = rope
    return cfg


def _layers_with(names: set[str], part: str) -> list[int]:
    return sorted(int(n.split(".")[1]) for n in names if n.split(".")[2:3] == [part])


def _llama(m: Meta, names: set[str]) -> dict[str, Any]:
    experts = m.get("expert_count")
    if not experts:
        return _common(m, "llama")
    cfg = _common(m, "mixtral")
    cfg["num_local_experts"] = int(experts)
    cfg["num_experts_per_tok"] = int(m.need("expert_used_count"))
    if m.get("expert_feed_forward_length"):
        cfg["intermediate_size"] = int(m.get("expert_feed_forward_length"))
    return cfg


def _qwen3moe(m: Meta, names: set[str]) -> dict[str, Any]:
    cfg = _common(m, "qwen3_moe")
    cfg["num_experts"] = int(m.need("expert_count"))
    cfg["num_experts_per_tok"] = int(m.need("expert_used_count"))
    cfg["moe_intermediate_size"] = int(m.need("expert_feed_forward_length"))
    cfg.setdefault("intermediate_size", cfg["moe_intermediate_size"])
    cfg["norm_topk_prob"] = True
    cfg["mlp_only_layers"] = _layers_with(names, "ffn_gate")
    return cfg


def _gemma3(m: Meta, names: set[str]) -> dict[str, Any]:
    cfg = _common(m, "gemma3_text")
    layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    cfg["hidden_activation"] = "gelu_pytorch_tanh"
    cfg["sliding_window"] = int(m.need("attention.sliding_window"))
    cfg["rope_local_base_freq"] = 10000.0
    pattern = m.get("attention.sliding_window_pattern")
    if isinstance(pattern, list):  # per layer: true where the layer is local
        cfg["layer_types"] = [SLIDING if p else FULL for p in pattern]
    else:
        cfg["layer_types"] = [SLIDING if (i + 1) % 6 else FULL for i in range(layers)]
    big = layers == 62  # the 27B: its scale is hidden / heads, not head_dim
    cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // heads if big else cfg["head_dim"]
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if m.get(key):
            cfg[key] = float(m.get(key))
    if "rope_scaling" in cfg:  # the global layers' (4B and larger: linear, factor 8)
        cfg["rope_scaling"] = {k: v for k, v in cfg["rope_scaling"].items()
                               if k in ("rope_type", "factor")}  # fmt: skip
    return cfg


def _phi3(m: Meta, names: set[str]) -> dict[str, Any]:
    cfg = _common(m, "phi3")
    rope_dim = m.get("rope.dimension_count")
    if rope_dim:
        cfg["partial_rotary_factor"] = int(rope_dim) / cfg["head_dim"]
    if m.get("attention.sliding_window"):
        cfg["sliding_window"] = int(m.get("attention.sliding_window"))
    original = m.get("rope.scaling.original_context_length")
    if "rope_factors_long.weight" in names and original:
        # the factors are tensors: gguf.py reads them into "long_factor" / "short_factor"
        rope = {"rope_type": "longrope", "original_max_position_embeddings": int(original)}
        if m.get("rope.scaling.attn_factor"):
            rope["attention_factor"] = float(m.get("rope.scaling.attn_factor"))
        cfg["rope_scaling"] = rope
    return cfg


def _deepseek2(m: Meta, names: set[str]) -> dict[str, Any]:
    v3 = int(m.get("expert_gating_func", 1)) == 2  # 1 softmax (V2), 2 sigmoid (V3)
    cfg = _common(m, "deepseek_v3" if v3 else "deepseek_v2")
    rope = int(m.need("rope.dimension_count"))
    key = int(m.get("attention.key_length_mla") or m.need("attention.key_length"))
    value = int(m.get("attention.value_length_mla") or m.need("attention.value_length"))
    cfg.update(
        num_key_value_heads=cfg["num_attention_heads"],  # MLA: MQA in the file, MHA here
        head_dim=key,
        kv_lora_rank=int(m.need("attention.kv_lora_rank")),
        q_lora_rank=int(m.get("attention.q_lora_rank") or 0) or None,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=key - rope,
        v_head_dim=value,
    )
    if m.get("expert_count"):
        groups = int(m.get("expert_group_count") or 1)
        cfg.update(
            n_routed_experts=int(m.get("expert_count")),
            num_experts_per_tok=int(m.need("expert_used_count")),
            moe_intermediate_size=int(m.need("expert_feed_forward_length")),
            n_shared_experts=int(m.get("expert_shared_count") or 0),
            first_k_dense_replace=int(m.get("leading_dense_block_count") or 0),
            routed_scaling_factor=float(m.get("expert_weights_scale") or 1.0),
            norm_topk_prob=bool(m.get("expert_weights_norm", False)),
            n_group=groups,
            topk_group=int(m.get("expert_group_used_count") or 1),
            topk_method="noaux_tc" if v3 else ("group_limited_greedy" if groups > 1 else "greedy"),
        )
    if cfg.get("rope_scaling", {}).get("rope_type") == "yarn":
        # llama.cpp keeps 0.1 * mscale_all_dim; DeepSeek's configs set mscale to the same value
        mscale = float(m.get("rope.scaling.yarn_log_multiplier") or 0.0) / 0.1
        if mscale:
            cfg["rope_scaling"].update(mscale=mscale, mscale_all_dim=mscale)
    return cfg


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(_llama, permuted_qk=True),
    "qwen2": Architecture(lambda m, names: _common(m, "qwen2")),
    "qwen3": Architecture(lambda m, names: _common(m, "qwen3")),
    "qwen3moe": Architecture(_qwen3moe),
    "gemma3": Architecture(
        _gemma3,
        layer_names={
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
        norm_offset=True,
    ),
    "phi3": Architecture(
        _phi3, layer_names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
    ),
    "deepseek2": Architecture(_deepseek2),
}


def architecture(meta: dict[str, Any]) -> tuple[str, Architecture]:
    """The file's architecture name and description; UnsupportedModelError naming it and the
    supported ones otherwise."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        )
    return arch, ARCHITECTURES[arch]


def config_dict(meta: dict[str, Any], names: set[str], vocab_size: int) -> dict[str, Any]:
    """The config dict (as config.json spells it) a file's metadata and tensor names describe."""
    arch, desc = architecture(meta)
    cfg = desc.config(Meta(meta, arch), names)
    cfg.setdefault("vocab_size", vocab_size)
    if "intermediate_size" not in cfg:
        raise UnsupportedModelError(f"GGUF metadata {arch}.feed_forward_length is missing")
    if "output.weight" not in names:
        cfg["tie_word_embeddings"] = True
    return cfg
