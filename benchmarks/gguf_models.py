"""GGUF files written from a `transformers` Llama (random or real weights) with the `gguf`
package's writer and quantizers, laid out as llama.cpp's converter lays them out: llama.cpp's
tensor names, q / k rows permuted for its rotary layout, the tokenizer and chat template of the
default model's GGUF copied into the metadata. The peer benchmark writes its ~1B-parameter
random Llama with it; the tests write tiny ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_name(name: str) -> str:
    """llama.cpp's name of a checkpoint tensor (`model.layers.3.mlp.up_proj.weight` ->
    `blk.3.ffn_up.weight`)."""
    base, suffix = name.rsplit(".", 1)
    if base in _TOP:
        return f"{_TOP[base]}.{suffix}"
    parts = base.split(".")
    return f"blk.{parts[2]}.{_LAYER['.'.join(parts[3:])]}.{suffix}"


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q / k permutation: rows [heads, 2, d / 2] -> [heads, d / 2, 2]."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _copy_tokenizer(writer: Any, source: Path) -> None:
    from runtime.models.gguf import read_header

    meta, _, _ = read_header(source)
    writer.add_tokenizer_model(meta["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(meta.get("tokenizer.ggml.pre", "default"))
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_token_merges(meta["tokenizer.ggml.merges"])
    writer.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    writer.add_add_bos_token(bool(meta.get("tokenizer.ggml.add_bos_token", False)))
    if "tokenizer.chat_template" in meta:
        writer.add_chat_template(meta["tokenizer.chat_template"])


def write_gguf(
    path: Path,
    config: Any,
    state: dict[str, torch.Tensor],
    qtype: str,
    tokenizer_from: Path | None = None,
    overrides: dict[str, str] | None = None,
) -> Path:
    """Write a Llama (`config`: a transformers LlamaConfig, `state`: its state dict) as a GGUF
    whose matrices are `qtype` ("Q8_0", "Q4_0", "F16", ...; `overrides` maps a checkpoint name
    to another type) and whose vectors are F32. The tokenizer comes from `tokenizer_from`
    (default: the default model's GGUF; its vocabulary must have `config.vocab_size` tokens)."""
    import gguf
    from gguf import GGMLQuantizationType, quants

    from runtime.default_model import default_gguf_path

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    _copy_tokenizer(writer, tokenizer_from or default_gguf_path())
    overrides = overrides or {}
    for name, tensor in state.items():
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue
        w = tensor.detach().to(torch.float32).numpy()
        if name.endswith("q_proj.weight"):
            w = permute_rows(w, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = permute_rows(w, config.num_key_value_heads)
        kind = GGMLQuantizationType[overrides.get(name, qtype)] if w.ndim == 2 else None
        if kind is None or kind == GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(w, dtype=np.float32))
        else:
            data = quants.quantize(np.ascontiguousarray(w), kind)
            writer.add_tensor(gguf_name(name), data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
