"""GGUF files written from a `transformers` Llama (random or real weights) with the `gguf`
package's writer and quantizers, laid out as llama.cpp's converter lays them out: llama.cpp's
tensor names, q / k rows permuted for its rotary layout, the tokenizer and chat template of the
default model's GGUF copied into the metadata. The peer benchmark writes its ~1B-parameter
random Llama with it, the speculative benchmark the default model's dense folder (`folder_gguf`,
a target llama-server loads too); the tests write tiny ones.
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
    "self_attn.q_norm": "attn_q_norm",  # Qwen3's per-head query / key norms
    "self_attn.k_norm": "attn_k_norm",
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
    """Write a Llama or a Qwen3 (`config`: a transformers LlamaConfig / Qwen3Config, `state`:
    its state dict) as a GGUF whose matrices are `qtype` ("Q8_0", "Q4_0", "F16", ...;
    `overrides` maps a checkpoint name to another type) and whose vectors are F32. The
    tokenizer comes from `tokenizer_from` (default: the default model's GGUF; its vocabulary
    must have `config.vocab_size` tokens). A Qwen3 (config.model_type "qwen3") is written as
    llama.cpp's converter writes one: architecture `qwen3`, q / k rows as they are, the head
    size as key / value length."""
    import gguf
    from gguf import GGMLQuantizationType, quants

    from runtime.default_model import default_gguf_path

    arch = "qwen3" if getattr(config, "model_type", "llama") == "qwen3" else "llama"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    theta = getattr(config, "rope_theta", None)  # transformers 5: in rope_parameters
    theta = theta or (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    _copy_tokenizer(writer, tokenizer_from or default_gguf_path())
    overrides = overrides or {}
    for name, tensor in state.items():
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue
        w = tensor.detach().to(torch.float32).numpy()
        if arch != "llama":
            pass  # llama.cpp permutes q / k rows for its llama rotary layout only
        elif name.endswith("q_proj.weight"):
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


# A ~1.07B-parameter Llama (TinyLlama-1.1B's shape, the default model's vocabulary): the size
# where batch-1 decode is decided by how fast the weights stream from memory.
BIG_LLAMA = {
    "vocab_size": 49152,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}


# Qwen3-0.6B's shape (28 layers, 16 query / 8 KV heads of 128, hidden 1024, MLP 3072) with the
# default model's vocabulary instead of Qwen's 151,936 tokens: ~0.48B parameters.
QWEN3_06B = {
    "vocab_size": 49152,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}


class RandomLlamaState:
    """A Llama's (or a Qwen3's: q / k norms too) state dict with random weights (normal, std
    0.02; norms 1), each tensor made when `items()` reaches it, so writing a 1B model never
    holds its fp32 weights at once."""

    def __init__(self, config: Any, seed: int = 0) -> None:
        self.config, self.seed = config, seed

    def shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.config
        h, i = c.hidden_size, c.intermediate_size
        d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
        qk_norm = getattr(c, "model_type", "llama") == "qwen3"
        out = {"model.embed_tokens.weight": (c.vocab_size, h)}
        for n in range(c.num_hidden_layers):
            p = f"model.layers.{n}."
            if qk_norm:
                out[p + "self_attn.q_norm.weight"] = (d,)
                out[p + "self_attn.k_norm.weight"] = (d,)
            out.update({
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            })  # fmt: skip
        out["model.norm.weight"] = (h,)
        if not c.tie_word_embeddings:
            out["lm_head.weight"] = (c.vocab_size, h)
        return out

    def items(self):
        gen = torch.Generator().manual_seed(self.seed)
        for name, shape in self.shapes().items():
            if len(shape) == 1:
                yield name, torch.ones(shape)
            else:
                yield name, torch.randn(shape, generator=gen) * 0.02


def random_llama_gguf(folder: Path, qtype: str, seed: int = 0) -> Path:
    """`folder`/random-llama-1b.`qtype`.gguf (BIG_LLAMA's shape, random weights), written once
    (a few minutes) and reused."""
    from transformers import LlamaConfig

    return _random_gguf(Path(folder) / f"random-llama-1b.{qtype}.gguf", LlamaConfig(**BIG_LLAMA),
                        qtype, seed)  # fmt: skip


def random_qwen3_gguf(folder: Path, qtype: str, seed: int = 0) -> Path:
    """`folder`/random-qwen3-0.6b.`qtype`.gguf (QWEN3_06B's shape, random weights), written
    once and reused."""
    from transformers import Qwen3Config

    return _random_gguf(Path(folder) / f"random-qwen3-0.6b.{qtype}.gguf",
                        Qwen3Config(**QWEN3_06B), qtype, seed)  # fmt: skip


def _random_gguf(path: Path, config: Any, qtype: str, seed: int) -> Path:
    """`path` written from `config` with random weights unless it exists."""
    return _written_once(path, lambda partial: write_gguf(
        partial, config, RandomLlamaState(config, seed), qtype))  # fmt: skip


def _written_once(path: Path, write: Any) -> Path:
    """`path` made by `write(partial)` unless it exists (a `.partial` file renamed when
    complete, so an interrupted write is never taken for a model)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        write(partial)
        partial.rename(path)
    return path


def folder_gguf(folder: Path, path: Path, qtype: str = "Q8_0") -> Path:
    """A transformers Llama / Qwen3 folder (config.json and safetensors, e.g. the default
    model's dense folder) written as the GGUF `path` with `qtype` matrices ("Q8_0", "F16",
    "F32"; vectors F32) and the default model's tokenizer, once: an existing `path` is reused.
    llama-server loads it where it cannot load the folder, so both engines run one file."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    state: dict[str, torch.Tensor] = {}
    for part in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(str(part)))
    if not state:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    return _written_once(Path(path), lambda partial: write_gguf(partial, config, state, qtype))
