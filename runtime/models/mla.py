"""Multi-head Latent Attention over the paged latent cache.

Per token the pool holds `[c, k_rope]`: the normalised compressed KV `c` (kv_lora_rank = R
values) and the rotated rope key shared by all heads (Dr values). `kv_b_proj` expands `c` into
each head's nope key (`W_uk` [H, nope, R]) and value (`W_uv` [H, v, R]).

Absorbed (the default, decode and prefill): the key up-projection is folded into the query,
`q_lat = q_nope @ W_uk` [H, R], so a head's score is `q_lat . c + q_rope . k_rope`, one dot
product with the latent itself; attention averages latents, and `W_uv` is applied once to that
average. Cached tokens never get per-head K/V. To the attention kernels this is multi-query
attention with one KV "head" of R + Dr dimensions.

Decompressed (for checks and the benchmark): every cached token's latent is expanded to per-head
K and V at each step, as a generic engine would, then ordinary attention.

A layer's latent-attention weights (`MLAWeights`, read by `load_mla`) and its attention block
(`latent_attention`: projections, norms, the rope split, the latent store and the attention
above) are what decoder.py runs in place of q/k/v for a config with `mla` (DeepSeek V2 / V3):
the query comes from `q_proj`, or from `q_a_proj` -> RMSNorm -> `q_b_proj` when `q_lora_rank`
is set; `kv_a_proj_with_mqa` gives the latent `c` (RMSNorm'd) and the shared rope key; RoPE
(interleaved pairs where `rope_interleave`) rotates only the rope parts. `q_proj` (or `q_a_proj`)
and `kv_a_proj_with_mqa`, which both multiply the layer's input, are joined into one matrix at
load (`x_proj`; a GGUF's parts of different block formats stacked): one product instead of
two. Weights in a GGUF block format stay in it, multiplied through the model's `mm`;
`kv_b_proj`, multiplied densely per head, is dequantized.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import torch

from runtime.attention import AttentionBackend, LayerSpec
from runtime.config import ModelConfig
from runtime.errors import UnsupportedAttentionError
from runtime.kernels.cpu import quant as cpu_quant
from runtime.models.layers import dense_weight, rms_norm
from runtime.models.rope import apply_rotary, apply_rotary_interleaved


@dataclass(slots=True)
class MLAWeights:
    """One layer's latent-attention weights (o_proj is the decoder layer's `o`)."""

    x_proj: torch.Tensor  # [q_proj or q_a_proj | kv_a_proj_with_mqa], [q_rows + R + Dr, hidden]
    x_proj_bias: torch.Tensor | None
    q_rows: int  # the rows of x_proj that are q_proj's (or q_a_proj's)
    q_a_norm: torch.Tensor | None  # with q_lora_rank
    q_b: torch.Tensor | None
    kv_a_norm: torch.Tensor
    w_uk: torch.Tensor  # [H, nope, R]
    w_uv: torch.Tensor  # [H, v, R]

    def projections(self) -> list[torch.Tensor]:
        """The matrices multiplied through the model's `mm` (packed where it packs)."""
        return [t for t in (self.x_proj, self.q_b) if t is not None]

    def tensors(self) -> list[torch.Tensor]:
        names = [n for n in MLAWeights.__slots__ if n != "q_rows"]
        return [t for t in (getattr(self, n) for n in names) if t is not None]


def load_mla(take: Callable, maybe: Callable, prefix: str, config: ModelConfig,
             dtype: torch.dtype, heads: range | None = None) -> MLAWeights:  # fmt: skip
    """A layer's MLA weights from `{prefix}q_proj.weight` ... (transformers' names); `take`
    raises naming a missing weight, `maybe` gives None for an absent one. `heads`: the query
    heads this tensor-parallel rank holds (None: all): their rows of q_proj (or q_b_proj) and
    kv_b_proj; q_a_proj and kv_a_proj_with_mqa (the latent and the rope key) are every rank's."""
    mla = config.mla
    heads = heads if heads is not None else range(config.num_heads)
    kv_b = dense_weight(take(prefix + "kv_b_proj.weight"), dtype)
    kv_b = kv_b.view(config.num_heads, mla.qk_nope_head_dim + mla.v_head_dim, mla.kv_lora_rank)
    kv_b = kv_b[heads.start : heads.stop]
    lora = mla.q_lora_rank is not None
    q_name = prefix + ("q_a_proj" if lora else "q_proj")
    q_rows = slice(heads.start * mla.qk_head_dim, heads.stop * mla.qk_head_dim)
    q, kv_a = take(q_name + ".weight"), take(prefix + "kv_a_proj_with_mqa.weight")
    biases = (maybe(q_name + ".bias"), maybe(prefix + "kv_a_proj_with_mqa.bias"))
    split = len(heads) != config.num_heads
    if split and not lora:  # this rank's heads of q_proj (q_b_proj's below)
        q, biases = _rows(q, q_rows), (_rows(biases[0], q_rows), biases[1])
    q_b = take(prefix + "q_b_proj.weight") if lora else None
    if split and lora:
        q_b = _rows(q_b, q_rows)
    if all(b is None for b in biases):
        bias = None
    else:  # a part without a bias adds zeros
        bias = torch.cat([b if b is not None else torch.zeros(w.shape[0], dtype=dtype)
                          for b, w in zip(biases, (q, kv_a), strict=True)])  # fmt: skip
    return MLAWeights(
        x_proj=torch.cat([q, kv_a]).contiguous(),
        x_proj_bias=bias,
        q_rows=q.shape[0],
        q_a_norm=take(prefix + "q_a_layernorm.weight") if lora else None,
        q_b=q_b,
        kv_a_norm=take(prefix + "kv_a_layernorm.weight"),
        w_uk=kv_b[:, : mla.qk_nope_head_dim].contiguous(),
        w_uv=kv_b[:, mla.qk_nope_head_dim :].contiguous(),
    )


def _rows(t: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    """Rows of a tensor (a quantized one stays in its block format), or None."""
    return None if t is None else t[rows.start : rows.stop].contiguous()


def latent_attention(
    w: MLAWeights,
    x: torch.Tensor,  # [T, hidden], normed
    mm: Callable,
    config: ModelConfig,
    attention: AttentionBackend,
    layer: int,
    spec: LayerSpec,
    cos_sin: tuple[torch.Tensor, torch.Tensor],
    absorb: bool = True,
) -> torch.Tensor:
    """[T, H * v]: the attention block's output before o_proj. The new tokens' latents go into
    their slots before attention reads the pages. `absorb=False` decompresses the cache."""
    mla, eps, t = config.mla, config.rms_norm_eps, x.shape[0]
    rotate = apply_rotary_interleaved if mla.rope_interleave else apply_rotary
    both = mm(x, w.x_proj, w.x_proj_bias)
    q, kv = both[:, : w.q_rows], both[:, w.q_rows :]
    if w.q_b is not None:
        q = mm(rms_norm(q, w.q_a_norm, eps), w.q_b)
    if absorb and C_DECODE:
        out = decode_kernel(w, q, both, config, attention, layer, spec, cos_sin)
        if out is not None:
            return out
    q = q.reshape(t, w.w_uk.shape[0], mla.qk_head_dim)  # this rank's heads
    q_nope, q_rope = q[..., : mla.qk_nope_head_dim], q[..., mla.qk_nope_head_dim :]
    c = rms_norm(kv[:, : mla.kv_lora_rank], w.kv_a_norm, eps)
    k_rope = rotate(kv[:, None, mla.kv_lora_rank :], *cos_sin)
    attention.store_latent(layer, torch.cat((c, k_rope[:, 0]), dim=-1))
    global torch_steps
    torch_steps += 1
    attend = absorbed_attention if absorb else decompressed_attention
    out = attend(q_nope, rotate(q_rope, *cos_sin), w.w_uk, w.w_uv, attention, layer, spec)
    return out.reshape(t, -1)


def absorbed_attention(
    q_nope: torch.Tensor,  # [T, H, nope]
    q_rope: torch.Tensor,  # [T, H, Dr]
    w_uk: torch.Tensor,  # [H, nope, R]
    w_uv: torch.Tensor,  # [H, v, R]
    attention: AttentionBackend,
    layer: int,
    spec: LayerSpec,
) -> torch.Tensor:
    """[T, H, v]: decode tokens first, then extend chunks, as in the step's batch."""
    rank = w_uk.shape[-1]
    q = torch.cat((torch.einsum("thn,hnr->thr", q_nope, w_uk), q_rope), dim=-1)
    out_latent = attention.latent_attend(layer, q, spec, rank)
    return torch.einsum("thr,hvr->thv", out_latent, w_uv)


def _gather(latent: torch.Tensor, page_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens' latents [length, R + Dr] through one page-table row."""
    ps = latent.shape[1]
    j = torch.arange(length, device=latent.device)
    slots = page_row[j // ps].long() * ps + j % ps
    flat = latent.view(-1, latent.shape[-1]).index_select(0, slots.reshape(-1))
    return flat.view(*slots.shape, latent.shape[-1])  # index_select: faster than [] on CPU


def decompressed_attention(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    attention: AttentionBackend,
    layer: int,
    spec: LayerSpec,
) -> torch.Tensor:
    """The same result as `absorbed_attention`, expanding every cached latent to per-head K/V
    (full causal attention: a `spec` with a window or soft cap is refused)."""
    if not spec.plain:
        raise UnsupportedAttentionError("decompressed MLA attends causally over every token")
    rank = w_uk.shape[-1]
    batch, scale = attention.batch, spec.scale
    latent = attention.latent_cache(layer, q_nope.dtype)
    q = torch.cat((q_nope, q_rope), dim=-1)  # [T, H, nope + Dr]
    nd = batch.num_decode
    rows: list[tuple[int, int, torch.Tensor, int]] = []  # (first query, count, page row, prefix)
    for b in range(nd):
        rows.append((b, 1, batch.decode_page_table[b], int(batch.decode_seq_lens[b]) - 1))
    start = nd
    for e in range(batch.extend_lens.shape[0]):
        n = int(batch.extend_lens[e])
        rows.append((start, n, batch.extend_page_table[e], int(batch.extend_prefix_lens[e])))
        start += n
    out = q.new_zeros(q.shape[0], q.shape[1], w_uv.shape[1])
    for first, n, page_row, prefix in rows:
        lat = _gather(latent, page_row, prefix + n).to(q.dtype)
        c, k_rope = lat[:, :rank], lat[:, rank:]
        k_nope = torch.einsum("lr,hnr->hln", c, w_uk)  # [H, L, nope]
        k = torch.cat((k_nope, k_rope.expand(k_nope.shape[0], -1, -1)), dim=-1)
        v = torch.einsum("lr,hvr->hlv", c, w_uv)  # [H, L, v]
        qs = q[first : first + n].transpose(0, 1)  # [H, n, d]
        scores = (qs.float() @ k.float().transpose(1, 2)) * scale  # [H, n, L]
        pos = torch.arange(prefix, prefix + n, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(prefix + n, device=q.device) > pos, -torch.inf)
        out[first : first + n] = (scores.softmax(-1) @ v.float()).transpose(0, 1).to(out.dtype)
    return out


# ---- a decode-only step's latent attention in one C call a layer (csrc/mla.c) ----------------
C_DECODE = True  # False: the torch ops above (to compare them)
c_steps = torch_steps = 0  # layer calls each way (tests read them)


class _Step(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int64), ("pos", ctypes.c_void_p), ("slots", ctypes.c_void_p),
                ("table", ctypes.c_void_p), ("table_stride", ctypes.c_int64),
                ("lens", ctypes.c_void_p), ("page_size", ctypes.c_int64),
                ("num_pages", ctypes.c_int64), ("cos", ctypes.c_void_p),
                ("sin", ctypes.c_void_p)]  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("heads", "nope", "dr", "vdim", "rank", "interleave")
                ] + [("eps", ctypes.c_float), ("scale", ctypes.c_float)] + [
        (n, ctypes.c_void_p) for n in ("kv_norm", "w_uk", "w_uv", "latent")]  # fmt: skip


def decode_kernel(
    w: MLAWeights,
    q: torch.Tensor,  # [T, H * (nope + Dr)], a row-major view
    both: torch.Tensor,  # [T, q_rows + R + Dr]: x_proj's product (kv_a's part after q_rows)
    config: ModelConfig,
    attention: AttentionBackend,
    layer: int,
    spec: LayerSpec,
    cos_sin: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor | None:
    """[T, H * v]: the absorbed attention of a decode-only step in one C call (csrc/mla.c: the
    latent's norm, the rope parts' rotary, the latent store, the query absorbed through W_uk,
    softmax over the cached latents, W_uv), or None where the step is not one it takes (extend
    rows, another device or type, a quantized latent pool, a window or cap, no C kernels)."""
    batch, dtype = attention.batch, both.dtype
    t = both.shape[0]
    if batch is None or batch.num_decode != t or not spec.plain:
        return None
    if both.device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return None
    pool = attention.pool
    pages = pool.latent[layer] if pool is not None and not pool.quantized else None
    if pages is None or pages.dtype != dtype or not pages.is_contiguous():
        return None
    if not (both.is_contiguous() and q.stride(1) == 1 and w.w_uk.dtype == dtype
            and w.kv_a_norm.dtype == dtype):  # fmt: skip
        return None
    lib = cpu_quant.library()
    kernel = getattr(lib, "q_mla_decode", None) if lib is not None else None
    if kernel is None:
        return None
    mla = config.mla
    cos, sin = (c.reshape(t, -1).contiguous() for c in cos_sin)
    table = batch.decode_page_table
    if table.dtype != torch.int32 or not table.is_contiguous():
        table = table.to(torch.int32).contiguous()
    lens = batch.decode_seq_lens.to(torch.int32).contiguous()
    slots = batch.out_slots.contiguous()
    step = _Step(t, None, slots.data_ptr(), table.data_ptr(), table.shape[1], lens.data_ptr(),
                 pages.shape[1], pages.shape[0], cos.data_ptr(), sin.data_ptr())  # fmt: skip
    entry = _Layer(w.w_uk.shape[0], mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim,
                   mla.kv_lora_rank, int(mla.rope_interleave), config.rms_norm_eps, spec.scale,
                   w.kv_a_norm.data_ptr(), w.w_uk.data_ptr(), w.w_uv.data_ptr(),
                   pages.data_ptr())  # fmt: skip
    out = torch.empty(t, w.w_uk.shape[0] * mla.v_head_dim, dtype=dtype)
    size = both.element_size()
    rc = kernel(ctypes.byref(entry), ctypes.byref(step), q.data_ptr(), q.stride(0),
                          both.data_ptr() + w.q_rows * size, both.stride(0), out.data_ptr(),
                          int(dtype == torch.bfloat16))  # fmt: skip
    if rc:
        return None
    global c_steps
    c_steps += 1
    return out


# ---- the decode chain's attention half for an MLA layer (csrc/mla.c q_mla_attn_half) --------
_Proj = cpu_quant.QProj


class _Hook(ctypes.Structure):  # mla.c's struct mla_hook
    _fields_ = [("layer", _Layer), ("x_proj", _Proj * 3), ("q_b", _Proj), ("o", _Proj),
                ("q_a_norm", ctypes.c_void_p), ("x_row", ctypes.c_int64),
                ("q_rows", ctypes.c_int64)]  # fmt: skip


def chain_supported(w: MLAWeights, o: object, dtype: torch.dtype) -> bool:
    """Whether `chain_hook` takes this layer: its products (x_proj's up to three parts, q_b, o)
    in integer-kernel block formats, no x_proj bias, the dense tensors of the model's dtype,
    the C kernels built."""
    lib = cpu_quant.library()
    if lib is None or getattr(lib, "q_mla_attn_half", None) is None or w.x_proj_bias is not None:
        return False
    if dtype not in (torch.float32, torch.bfloat16) or not cpu_quant.is_quantized(w.x_proj):
        return False
    mats = [*cpu_quant.parts(w.x_proj), o] + ([w.q_b] if w.q_b is not None else [])
    dense = [w.kv_a_norm, w.w_uk, w.w_uv] + ([w.q_a_norm] if w.q_b is not None else [])
    return (len(cpu_quant.parts(w.x_proj)) <= 3 and all(cpu_quant.int_kernel(m) for m in mats)
            and all(t.dtype == dtype and t.is_contiguous() for t in dense))  # fmt: skip


def chain_hook(w: MLAWeights, o: object, config: ModelConfig, scale: float,
               dtype: torch.dtype) -> object:  # fmt: skip
    """The layer's attention half for the one-call decode chain (quant_chain.ChainHook): from
    the normed x, x_proj's product, q_a's norm and q_b's product, the latent attention of
    `decode_kernel` (its rotary tables and pages from the chain's step) and o's product. Only
    where `chain_supported`."""
    from runtime.kernels.cpu.quant_chain import ChainHook

    mla, lib = config.mla, cpu_quant.library()
    entry = _Layer(w.w_uk.shape[0], mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim,
                   mla.kv_lora_rank, int(mla.rope_interleave), config.rms_norm_eps, scale,
                   w.kv_a_norm.data_ptr(), w.w_uk.data_ptr(), w.w_uv.data_ptr(), None)  # fmt: skip
    hook = _Hook(layer=entry, o=cpu_quant.q_proj(o), x_row=w.x_proj.shape[0], q_rows=w.q_rows)
    for k, part in enumerate(cpu_quant.parts(w.x_proj)):
        hook.x_proj[k] = cpu_quant.q_proj(part)
    if w.q_b is not None:
        hook.q_b, hook.q_a_norm = cpu_quant.q_proj(w.q_b), w.q_a_norm.data_ptr()
    products = [*cpu_quant.parts(w.x_proj), o] + ([w.q_b] if w.q_b is not None else [])
    bf16 = dtype == torch.bfloat16

    def scratch(rows: int) -> int:
        return max(cpu_quant.scratch_bytes(p.qtype, rows, p.cols, bf16,
                                           p.shape[0] if bf16 else 0, False)
                   for p in products)  # fmt: skip

    fn = ctypes.cast(lib.q_mla_attn_half, ctypes.c_void_p).value
    return ChainHook(fn, ctypes.addressof(hook), keep=(hook, w, o), scratch=scratch)
