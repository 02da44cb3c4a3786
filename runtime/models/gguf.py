"""A GGUF file as it is: the config from its metadata, its weights kept in their block formats
(`cpu_quant.QuantTensor`), its tokenizer and chat template from the metadata. No weight is
converted or written to disk (the tokenizer's conversion is kept: gguf_tokenizer.py).

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
from runtime.models.chat_templates import family_turns
from runtime.models.gguf_arch import EXPERT_PARTS, Architecture, architecture, config_dict
from runtime.models.gguf_tokenizer import cached_tokenizer

logger = logging.getLogger(__name__)

# GGUF value types -> struct format (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # fmt: skip
_FLOAT_TYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


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


def config_of(meta: dict[str, Any], vocab_size: int, names: set[str] | None = None) -> ModelConfig:
    """The model config a GGUF's metadata (and, where the metadata leaves it open, its tensor
    names) describes: gguf_arch.py, per architecture."""
    return config_from_dict(config_dict(meta, names or set(), vocab_size))


def _unpermute(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q / k row permutation: its rows are [heads, d / 2, 2] of the
    original [heads, 2, d / 2] (rotary pairs made adjacent)."""
    rows = t.shape[0]
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


# a layer's tensors that the model files stack by rows (one matrix product instead of several)
_STACKED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))

Entry = tuple[str, tuple[int, ...], int, int]  # name, shape in torch order, ggml type, offset


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
    """One tensor: a plain tensor for F32 tensors and F16 / BF16 vectors, else a QuantTensor
    [rows, cols] (rows: every leading dimension; a float matrix too: the fused kernels read it
    as stored)."""
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


def _stacks(tensors: list[Entry]) -> list[list[int]]:
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


def _read_stack(f: BinaryIO, start: int, members: list[Entry], heads: dict) -> list[QuantTensor]:
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


def _per_expert(t, experts: int) -> list:
    """A [E * rows, cols] QuantTensor (or a plain [E, rows, cols] tensor) as E weights: views of
    its rows, no copy."""
    if isinstance(t, QuantTensor):
        rows = t.shape[0] // experts
        return [QuantTensor(t.data[e * rows : (e + 1) * rows], t.qtype, t.cols)
                for e in range(experts)]  # fmt: skip
    return list(t.unbind(0))


def _read_experts(f: BinaryIO, start: int, gate: Entry, up: Entry) -> list[tuple]:
    """A layer's routed gate and up projections [E, I, hidden], per expert (gate_e, up_e). Of
    one block format they are read interleaved into one buffer, expert by expert, so that each
    expert's gate | up stack is a view (one product), not a copy."""
    (gname, gshape, gtype, goff), (uname, ushape, utype, uoff) = gate, up
    experts, rows, cols = gshape
    if gtype != utype or gshape != ushape or gtype == 0:
        g = _per_expert(_read_tensor(f, start + goff, gname, gshape, gtype), experts)
        u = _per_expert(_read_tensor(f, start + uoff, uname, ushape, utype), experts)
        return list(zip(g, u, strict=True))
    _check(gname, gshape, gtype)
    width = row_bytes(gtype, cols)
    buf = huge_page_bytes(torch.Size((experts * 2 * rows, width)))
    out = []
    for e in range(experts):
        at = e * 2 * rows
        _read_into(f, start + goff + e * rows * width, gname, buf[at : at + rows])
        _read_into(f, start + uoff + e * rows * width, uname, buf[at + rows : at + 2 * rows])
        out.append((QuantTensor(buf[at : at + rows], gtype, cols),
                    QuantTensor(buf[at + rows : at + 2 * rows], gtype, cols)))  # fmt: skip
    return out


def _load_experts(f: BinaryIO, start: int, tensors: list[Entry], state: dict) -> set[str]:
    """Every layer's routed experts into `state` under per-expert names
    (`model.layers.N.mlp.experts.E.gate_proj.weight`); the names of the tensors read."""
    by_name = {t[0]: t for t in tensors}
    done: set[str] = set()
    for name in by_name:
        parts = name.split(".")
        if parts[0] != "blk" or len(parts) != 4 or parts[2] != "ffn_gate_exps":
            continue
        layer = parts[1]
        names = [f"blk.{layer}.{p}.weight" for p in EXPERT_PARTS]
        if not all(n in by_name for n in names):
            raise UnsupportedModelError(f"layer {layer}: routed experts without {names}")
        prefix = f"model.layers.{layer}.mlp.experts."
        pairs = _read_experts(f, start, by_name[names[0]], by_name[names[1]])
        _, shape, ggml_type, offset = by_name[names[2]]
        downs = _per_expert(_read_tensor(f, start + offset, names[2], shape, ggml_type), shape[0])
        for e, ((g, u), d) in enumerate(zip(pairs, downs, strict=True)):
            state[f"{prefix}{e}.gate_proj.weight"] = g
            state[f"{prefix}{e}.up_proj.weight"] = u
            state[f"{prefix}{e}.down_proj.weight"] = d
        done.update(names)
    return done


def _dense(t) -> torch.Tensor:
    return t.dequantize() if isinstance(t, QuantTensor) else t.float()


def _split_kv_b(state: dict, raw: dict, config: ModelConfig) -> None:
    """DeepSeek files with only `attn_k_b` [H, R, nope] and `attn_v_b` [H, v, R]: the
    checkpoint's `kv_b_proj` [H * (nope + v), R], in float32 (MLA multiplies it densely)."""
    mla = config.mla
    for name in [n for n in raw if n.endswith(".attn_k_b.weight")]:
        layer = name.split(".")[1]
        kv = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        if kv in state:
            continue
        heads, rank = config.num_heads, mla.kv_lora_rank
        k_b = _dense(raw[name]).reshape(heads, rank, mla.qk_nope_head_dim).transpose(1, 2)
        v_b = _dense(raw[f"blk.{layer}.attn_v_b.weight"]).reshape(heads, mla.v_head_dim, rank)
        state[kv] = torch.cat((k_b, v_b), dim=1).reshape(-1, rank).contiguous()


def _fix(t, hf: str, desc: Architecture, config: ModelConfig):
    """llama.cpp's storage conventions undone: Llama's q / k rows, Gemma's `1 + w` norms."""
    if desc.permuted_qk and hf.endswith(("q_proj.weight", "k_proj.weight")):
        heads = config.num_heads if "q_proj" in hf else config.num_kv_heads
        if isinstance(t, QuantTensor):
            return QuantTensor(_unpermute(t.data, heads).contiguous(), t.qtype, t.cols)
        return _unpermute(t, heads).contiguous()
    if desc.norm_offset and hf.endswith("norm.weight"):
        return t.float() - 1.0
    return t


def load_gguf(path: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """Config and state dict (checkpoint names; quantized weights as QuantTensor)."""
    meta, tensors, start = read_header(path)
    vocab = len(meta.get("tokenizer.ggml.tokens", [])) or 0
    config = config_of(meta, vocab, {t[0] for t in tensors})
    _, desc = architecture(meta)
    state: dict[str, Any] = {}
    raw: dict[str, Any] = {}  # tensors read under their own names (DeepSeek's k_b / v_b)
    with open(path, "rb") as f:
        for members in _stacks(tensors):
            group = [tensors[i] for i in members]
            heads = {}  # llama's q and k rows are permuted back
            for name, *_ in group if desc.permuted_qk else []:
                if ".attn_q." in name or ".attn_k." in name:
                    heads[name] = config.num_heads if ".attn_q." in name else config.num_kv_heads
            for (name, *_), t in zip(group, _read_stack(f, start, group, heads), strict=True):
                state[desc.checkpoint_name(name)] = t
        done = _load_experts(f, start, tensors, state)
        for name, shape, ggml_type, offset in tensors:
            hf = desc.checkpoint_name(name)
            if hf in state or name in done:
                continue
            if name.endswith((".attn_k_b.weight", ".attn_v_b.weight")) or name.startswith(
                "rope_factors_"
            ):
                raw[name] = _read_tensor(f, start + offset, name, shape, ggml_type)
                continue
            if hf is None:
                if name.startswith("rope_freqs"):
                    raise UnsupportedModelError(f"tensor {name!r} (rope frequency factors)")
                logger.info("GGUF tensor %s not used", name)
                continue
            t = _read_tensor(f, start + offset, name, shape, ggml_type)
            state[hf] = _fix(t, hf, desc, config)
    if config.mla is not None:
        _split_kv_b(state, raw, config)
    if config.rope_type == "longrope":  # Phi-3's factors are tensors
        for kind in ("long", "short"):
            config.rope_scaling[f"{kind}_factor"] = raw[f"rope_factors_{kind}.weight"].tolist()
    if "lm_head.weight" not in state:
        config.tie_word_embeddings = True
    return config, state


def load_tokenizer(path: Path) -> Any:
    """The tokenizer (with its chat template) the file's metadata describes, built by
    transformers' GGUF tokenizer converters once and then read from the cache
    (gguf_tokenizer.py; `AutoTokenizer(gguf_file=)` where those helpers are missing: it reads
    the file more slowly). A file without a chat template gets its family's turn format
    (chat_templates.py) where the vocabulary has its markers; UnsupportedModelError for an
    architecture gguf_arch.py does not know."""
    meta, _, start = read_header(path)
    arch = architecture(meta)[0]  # a file the runtime cannot run is refused before converting
    try:
        import transformers.integrations.gguf.gguf_tokenizer_mapping  # noqa: F401
    except ImportError:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    else:
        tokens = len(meta.get("tokenizer.ggml.tokens", ()))
        tokenizer = cached_tokenizer(path, start, tokens)
    if not getattr(tokenizer, "chat_template", None):
        template = family_turns(str(arch), tokenizer.get_vocab())
        if template is not None:
            tokenizer.chat_template = template
    return tokenizer
