"""A GGUF file as it is: the config from its metadata, its weights kept in their block formats
(`cpu_quant.QuantTensor`), its tokenizer and chat template from the metadata. Nothing is
converted or written to disk.

The reader is ours (header, key-values, tensor table; the format is little-endian GGUF v2 / v3):
`gguf.GGUFReader` builds a numpy view per array element and takes ~13 s on the 49,152-token
vocabulary of the default model, this ~0.1 s. Tensors are read into memory (not memory-mapped),
so resident memory is what the weights take as stored. A layer's q, k, v (and gate, up) of one
format go into one buffer, one after another: the model files stack them by rows, and stacking
them is then a view of that buffer, not a second copy of the weights.

Names follow llama.cpp's (`blk.N.attn_q.weight`) and map onto the checkpoint names the model
files read (`model.layers.N.self_attn.q_proj.weight`). llama.cpp's converter permutes the rows
of Llama's q and k weights for its rotary layout; the rows are permuted back here (whole rows,
so quantized blocks move intact).
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from runtime.config import ModelConfig, config_from_dict
from runtime.errors import ModelNotFoundError, UnsupportedModelError
from runtime.kernels.cpu.quant import TYPES, QuantTensor, huge_page_bytes, row_bytes, type_name

logger = logging.getLogger(__name__)

# GGUF value types -> struct format (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # fmt: skip
_ARCHES = {"llama": "llama", "qwen2": "qwen2"}  # GGUF architecture -> transformers model_type
_FLOAT_TYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


class _Reader:
    """Sequential little-endian reads over a file's header."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.f.read(size))[0]

    def string(self) -> str:
        return self.f.read(self.scalar("Q")).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == 8:
            return self.string()
        if vtype == 9:
            item, count = self.scalar("I"), self.scalar("Q")
            if item == 8:
                return [self.string() for _ in range(count)]
            if item in _SCALARS:
                fmt = "<" + _SCALARS[item]
                data = self.f.read(struct.calcsize(fmt) * count)
                return np.frombuffer(data, dtype=np.dtype(fmt)).tolist()
            return [self.value(item) for _ in range(count)]
        if vtype not in _SCALARS:
            raise UnsupportedModelError(f"GGUF metadata value of unknown type {vtype}")
        return self.scalar(_SCALARS[vtype])


def read_header(path: Path) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]],
                                     int]:  # fmt: skip
    """(metadata, [(name, shape in torch order, ggml type, offset)], data start)."""
    with open(path, "rb") as f:
        r = _Reader(f)
        if f.read(4) != b"GGUF":
            raise ModelNotFoundError(f"{path} is not a GGUF file (no GGUF magic)")
        version = r.scalar("I")
        if version not in (2, 3):
            raise UnsupportedModelError(f"GGUF version {version} of {path} is not supported")
        n_tensors, n_kv = r.scalar("Q"), r.scalar("Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.scalar("I"))
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            dims = [r.scalar("Q") for _ in range(r.scalar("I"))]
            ggml_type, offset = r.scalar("I"), r.scalar("Q")
            tensors.append((name, tuple(reversed(dims)), ggml_type, offset))
        align = int(meta.get("general.alignment", 32))
        start = -(-f.tell() // align) * align
    return meta, tensors, start


def config_of(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    """The model config a GGUF's metadata describes (llama / qwen2 architectures)."""
    arch = meta.get("general.architecture")
    if arch not in _ARCHES:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported; supported: {sorted(_ARCHES)}"
        )

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise UnsupportedModelError(f"GGUF metadata {arch}.{name} is missing")
        return value

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    cfg: dict[str, Any] = {
        "model_type": _ARCHES[arch],
        "vocab_size": int(meta.get(f"{arch}.vocab_size", vocab_size)),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(key("context_length", 2048)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        factor = float(key("rope.scaling.factor"))
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": factor}
    return config_from_dict(cfg)


def _hf_name(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    return None


def _unpermute(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q / k row permutation: its rows are [heads, d / 2, 2] of the
    original [heads, 2, d / 2] (rotary pairs made adjacent)."""
    rows = t.shape[0]
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


# a layer's tensors that the model files stack by rows (one matrix product instead of several)
_STACKED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))


def _check(name: str, shape: tuple[int, ...], ggml_type: int) -> None:
    if ggml_type not in TYPES:
        raise UnsupportedModelError(
            f"tensor {name!r} is {type_name(ggml_type)} (GGML type {ggml_type}), which this "
            f"engine cannot run; supported: {sorted(n for n, _, _ in TYPES.values())}"
        )
    _, block, _ = TYPES[ggml_type]
    if shape[-1] % block:
        raise UnsupportedModelError(
            f"tensor {name!r}: {shape[-1]} columns are not whole {type_name(ggml_type)} blocks"
        )


def _read_into(f: BinaryIO, at: int, name: str, out: torch.Tensor) -> None:
    f.seek(at)
    if f.readinto(memoryview(out.numpy()).cast("B")) != out.numel():
        raise ModelNotFoundError(f"GGUF tensor {name!r} is cut short (truncated file?)")


def _read_tensor(f: BinaryIO, at: int, name: str, shape: tuple[int, ...], ggml_type: int):
    """One tensor: a plain tensor for F32 / F16 / BF16 vectors, else a QuantTensor [rows, cols]
    (a float matrix too: the fused kernels read it as stored)."""
    _check(name, shape, ggml_type)
    cols = shape[-1]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    if ggml_type in _FLOAT_TYPES and (len(shape) == 1 or ggml_type == 0):
        buf = torch.empty(rows * row_bytes(ggml_type, cols), dtype=torch.uint8)
        _read_into(f, at, name, buf)
        return buf.view(_FLOAT_TYPES[ggml_type]).reshape(shape)
    buf = huge_page_bytes(torch.Size((rows, row_bytes(ggml_type, cols))))
    _read_into(f, at, name, buf)
    return QuantTensor(buf, ggml_type, cols)


def _stacks(tensors: list[tuple[str, tuple[int, ...], int, int]]) -> list[list[int]]:
    """Indices into `tensors` of each layer's _STACKED group whose members are all there, are
    matrices of one block format (not F32: those load as plain tensors) and one width."""
    index = {t[0]: i for i, t in enumerate(tensors)}
    groups = []
    for name, *_ in tensors:
        parts = name.split(".")
        if parts[0] != "blk" or len(parts) != 4 or parts[3] != "weight":
            continue
        for group in _STACKED:
            if parts[2] != group[0]:
                continue
            names = [f"blk.{parts[1]}.{member}.weight" for member in group]
            if not all(n in index for n in names):
                continue
            members = [index[n] for n in names]
            kinds = {(tensors[i][2], tensors[i][1][-1], len(tensors[i][1])) for i in members}
            if len(kinds) == 1 and next(iter(kinds))[2] == 2 and tensors[members[0]][2] != 0:
                groups.append(members)
    return groups


def _read_stack(
    f: BinaryIO, start: int, members: list[tuple[str, tuple[int, ...], int, int]], heads: dict
) -> list[QuantTensor]:
    """Matrices of one format and width read one after another into one buffer: a QuantTensor
    over each one's rows (rows permuted back where `heads` names a head count)."""
    for name, shape, ggml_type, _ in members:
        _check(name, shape, ggml_type)
    ggml_type, cols = members[0][2], members[0][1][-1]
    width = row_bytes(ggml_type, cols)
    buf = huge_page_bytes(torch.Size((sum(m[1][0] for m in members), width)))
    out, at = [], 0
    for name, shape, _, offset in members:
        rows = buf[at : at + shape[0]]
        if name in heads:  # read aside, then the rows in their original order
            raw = torch.empty(rows.shape, dtype=torch.uint8)
            _read_into(f, start + offset, name, raw)
            rows.copy_(_unpermute(raw, heads[name]))
        else:
            _read_into(f, start + offset, name, rows)
        out.append(QuantTensor(rows, ggml_type, cols))
        at += shape[0]
    return out


def load_gguf(path: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """Config and state dict (checkpoint names; quantized weights as QuantTensor)."""
    meta, tensors, start = read_header(path)
    vocab = len(meta.get("tokenizer.ggml.tokens", [])) or 0
    config = config_of(meta, vocab)
    state: dict[str, Any] = {}
    permute = config.model_type == "llama"
    with open(path, "rb") as f:
        for members in _stacks(tensors):
            group = [tensors[i] for i in members]
            heads = {}  # llama's q and k rows are permuted back
            for name, *_ in group if permute else []:
                if ".attn_q." in name or ".attn_k." in name:
                    heads[name] = config.num_heads if ".attn_q." in name else config.num_kv_heads
            for (name, *_), t in zip(group, _read_stack(f, start, group, heads), strict=True):
                state[_hf_name(name)] = t
        for name, shape, ggml_type, offset in tensors:
            hf = _hf_name(name)
            if hf in state:
                continue
            if hf is None:
                if name.startswith("rope_freqs"):
                    raise UnsupportedModelError(f"tensor {name!r} (rope frequency factors)")
                logger.info("GGUF tensor %s not used", name)
                continue
            t = _read_tensor(f, start + offset, name, shape, ggml_type)
            if permute and hf.endswith(("q_proj.weight", "k_proj.weight")):
                heads = config.num_heads if "q_proj" in hf else config.num_kv_heads
                if isinstance(t, QuantTensor):
                    t = QuantTensor(_unpermute(t.data, heads).contiguous(), t.qtype, t.cols)
                else:
                    t = _unpermute(t, heads).contiguous()
            state[hf] = t
    if "lm_head.weight" not in state:
        config.tie_word_embeddings = True
    return config, state


def load_tokenizer(path: Path) -> Any:
    """The tokenizer (with its chat template) the file's metadata describes, built by
    transformers' GGUF tokenizer converters; `AutoTokenizer(gguf_file=)` where those helpers
    are missing (it reads the file more slowly)."""
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            convert_gguf_tokenizer,
            get_gguf_tokenizer,
        )
    except ImportError:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(path))
    backend, extra = convert_gguf_tokenizer(arch, tokenizer_dict)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config, **extra)
