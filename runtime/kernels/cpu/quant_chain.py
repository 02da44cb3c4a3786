"""A decode step's layers in one C call (csrc/quant.c's `q_decode_chain`).

A batch-1 decode step of a small quantized model is a few hundred short kernel calls (SmolLM2:
30 layers x 2 norms, 4 products and one rotary + attention call). Called from Python each costs
a few microseconds of interpreter and torch work on top of the kernel (a tenth of the step or
more at 2 threads); the chain makes the same calls from C, one Python call a step. The kernels
and their inputs are the Python forward's own (`add_rms_norm` and `RopeDecode` of cpu_fused,
cpu_quant's products), in the same order, so the results are the same bits.

What it covers: every layer of a decoder without biases whose four per-layer matrices are
quantized tensors of one integer-kernel format each (QuantTensor: the 32-element formats and the
K-quants), in bf16 or float32, for a decode-only step of fewer than cpu_quant.DENSE_ROWS requests
with the fused CPU attention (the model's forward checks the rest: one rank, one stage). A
family is data (`ChainFamily`): Llama's layer by default; Qwen3's q / k head norms; Gemma 3's
(1 + w) norms in float32, sandwich norms, q / k head norms and GELU-tanh gate. A layer may bring
its own rotary / window step (`run`'s `steps`: Gemma's local layers, their own rope base and a
sliding window in the decode attention). A layer may bring its own attention half or MLP
half (`ChainHook` in its `ChainExtras`: a C function of quant.c's `chain_half_fn` type, `HALF_FN`
here, with its context), run in place of the built-in one; that layer's matrices of that half
are then absent (None). A hook gets the chain's scratch (as large as its `scratch(rows)` asks)
and must not grow this thread's cpu_quant scratch buffer while the chain runs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import torch

from runtime.kernels.cpu import fused as cpu_fused
from runtime.kernels.cpu import quant as cpu_quant

_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_Proj = cpu_quant.QProj


class _Layer(ctypes.Structure):
    _fields_ = [(name, _Proj) for name in ("qkv", "o", "gate_up", "down")] + [
        (name, _PTR) for name in ("norm1", "norm2", "k_pool", "v_pool")
    ] + [("scale", _F32)] + [
        (name, _PTR) for name in ("q_norm", "k_norm", "post_attn", "post_mlp", "step")
    ] + [("qkv_rest", _Proj * 2), ("gate_up_rest", _Proj * 2), ("qkv_row", _I64),
         ("gate_up_row", _I64)] + [
        (name, _PTR) for name in ("attn_half", "mlp_half", "attn_ctx", "mlp_ctx", "qkv_bias",
                                  "gate_up_bias", "o_bias", "down_bias")
    ]  # fmt: skip


class HookStep(ctypes.Structure):
    """quant.c's struct q_chain_hook_step: what a hook gets of the step (`rope_step`: the
    layer's rope_decode arguments, fused.py's _RopeStepArgs, or NULL; the layer's pools as
    `run` was given them; the layer's index; the hidden size)."""

    _fields_ = [(name, _PTR) for name in ("rope_step", "k_pool", "v_pool")] + [
        (name, _I64) for name in ("layer", "hidden")
    ]  # fmt: skip


# quant.c's chain_half_fn: int fn(const void *ctx, const void *x, int64_t rows, void *out,
# int bf16, void *scratch, const struct q_chain_hook_step *step)
HALF_FN = ctypes.CFUNCTYPE(ctypes.c_int, _PTR, _PTR, _I64, _PTR, ctypes.c_int, _PTR,
                           ctypes.POINTER(HookStep))  # fmt: skip


class _Chain(ctypes.Structure):
    _fields_ = [(name, _I64) for name in ("layers", "rows", "hidden", "bf16")] + [
        ("eps", _F32)
    ] + [(name, _PTR) for name in ("norm", "attn", "attn_step", "layer", "h", "x", "qkv", "att",
                                     "o", "gu", "down", "scratch", "head_norm")] + [
        (name, _I64) for name in ("sandwich", "act", "hq", "hkv", "d")
    ] + [("wide", _PTR)]  # fmt: skip


ACTIVATIONS = {"silu": 1, "gelu_pytorch_tanh": 2}  # the gate's activation: q_matmul's `swiglu`


@dataclass(frozen=True, slots=True)
class ChainFamily:
    """What a family's layer does beyond Llama's (the defaults). With `offset_norms` every norm
    weight is float32 `1 + w` (Gemma: normed in float32, then rounded; fused.py's
    offset_add_rms_norm), else of the model's dtype (`add_rms_norm`)."""

    offset_norms: bool = False
    sandwich: bool = False  # the attention's and the MLP's outputs normed before they are added
    head_norms: bool = False  # an RMSNorm over each query and key head before the rotary
    activation: str = "silu"  # the gate's: a key of ACTIVATIONS
    heads: tuple[int, int, int] = (0, 0, 0)  # query heads, kv heads, head size (head norms)


@dataclass(frozen=True, slots=True)
class ChainHook:
    """A layer's own attention or MLP half, run by the chain in place of the built-in one:
    `fn` the address of a C function of quant.c's `chain_half_fn` type (HALF_FN), `ctx` the
    address it gets first (0: NULL); `keep` what must live as long as the chain (the object
    `ctx` points into, a ctypes callback); `scratch(rows)` the bytes of the chain's scratch
    it needs for a step of `rows` requests (0: none)."""

    fn: int
    ctx: int = 0
    keep: object = None
    scratch: Callable[[int], int] | None = None


@dataclass(slots=True)
class ChainExtras:
    """A layer's weights beyond the six of Llama's (None where the family has none), and its
    hooks: `attn_half` in place of qkv -> head norms -> rotary / K/V write / attention -> o
    (from the normed x to what is added into h; the layer's qkv and o are then None),
    `mlp_half` in place of gate_up -> activation -> down (gate_up and down then None). A hook's
    output is before the o / down bias (the chain adds those with the residual); the qkv /
    gate | up bias of a hooked half is the hook's own."""

    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    post_attn: torch.Tensor | None = None
    post_mlp: torch.Tensor | None = None
    attn_half: ChainHook | None = None
    mlp_half: ChainHook | None = None
    # biases [out] of the model's dtype (not with sandwich norms): qkv's and gate | up's added
    # to the float32 products before rounding (as cpu_quant.linear), o's and down's with the
    # residual (the fused add-norm's bias; the caller adds the last layer's down bias)
    qkv_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    def biases(self) -> list[torch.Tensor | None]:
        return [self.qkv_bias, self.o_bias, self.gate_up_bias, self.down_bias]


def _first_ptr(pools: list[torch.Tensor | None] | None) -> int:
    return 0 if not pools or pools[0] is None else pools[0].data_ptr()


class DecodeChain:
    """The layers' weights `(norm1, qkv, o, norm2, gate_up, down)` and softmax scales of one
    model; `run` does one decode-only step's layers.

    Invariant: the weights are never replaced after the first run (their packed bytes are
    addressed from C)."""

    def __init__(
        self,
        layers: list[tuple],
        scales: list[float],
        eps: float,
        dtype: torch.dtype,
        family: ChainFamily = ChainFamily(),
        extras: list[ChainExtras] | None = None,
    ) -> None:
        self._weights = layers
        self._scales = scales
        self.eps, self.dtype, self.family = eps, dtype, family
        self._extras = extras or [ChainExtras() for _ in layers]
        self._table: ctypes.Array | None = None  # the per-layer arguments, at the first run
        self._sizes = (0, 0, 0)  # the widest qkv, attention output and intermediate size
        self._wide = 0  # the widest biased qkv or gate | up (a float32 buffer's row)
        self._wide_biases: list[torch.Tensor] = []  # float32 copies the table points at
        self._pools: tuple = ()  # the KV pool tensors the table points at
        self._need: dict[int, int] = {}  # scratch bytes by row count
        self.runs = 0  # steps run
        self._stepped = False  # whether the table points at a layer's own step arguments

    @staticmethod
    def supported(
        layers: list[tuple],
        dtype: torch.dtype,
        family: ChainFamily = ChainFamily(),
        extras: list[ChainExtras] | None = None,
    ) -> bool:
        """Whether the chain runs these weights: each layer's four matrices quantized with the
        integer kernels, the norms plain tensors (of the model's dtype, or float32 with
        `offset_norms`), the family's extras all there, the fused C norms built."""
        if dtype not in (torch.float32, torch.bfloat16) or not layers:
            return False
        if cpu_quant.library() is None or not cpu_fused.available(dtype):
            return False
        if family.activation not in ACTIVATIONS:
            return False
        norm_type = torch.float32 if family.offset_norms else dtype
        extras = extras or [ChainExtras() for _ in layers]
        for (norm1, qkv, o, norm2, gate_up, down), extra in zip(layers, extras, strict=True):
            attn, mlp = extra.attn_half is None, extra.mlp_half is None  # built-in halves
            fused = ([qkv] if attn else []) + ([gate_up] if mlp else [])
            if not all(cpu_quant.is_quantized(w) and len(cpu_quant.parts(w)) <= 3 for w in fused):
                return False
            mats = [m for w in fused for m in cpu_quant.parts(w)] + [w for w, own in ((o, attn),
                                                                (down, mlp)) if own]  # fmt: skip
            if not all(cpu_quant.int_kernel(w) for w in mats):  # stacks: up to three formats
                return False
            norms = [norm1, norm2]
            if family.head_norms and attn:
                norms += [extra.q_norm, extra.k_norm]
            if family.sandwich:
                norms += [extra.post_attn, extra.post_mlp]
            if any(not isinstance(n, torch.Tensor) or n.dtype != norm_type or
                   not n.is_contiguous() for n in norms):  # fmt: skip
                return False
            hidden = norm1.shape[0]
            biases = extra.biases()  # a hooked half's own bias is the hook's
            biases[0], biases[2] = (biases[0] if attn else None), (biases[2] if mlp else None)
            if any(b is not None for b in biases) and family.sandwich:
                return False
            widths = (qkv.shape[0] if attn else 0, hidden, 2 * down.cols if mlp else 0, hidden)
            if any(b is not None and (not isinstance(b, torch.Tensor) or b.dtype != dtype or
                                      b.shape != (width,) or not b.is_contiguous())
                   for b, width in zip(biases, widths, strict=True)):  # fmt: skip
                return False
            if attn and (qkv.shape[1] != hidden or o.shape[0] != hidden):
                return False
            if mlp and (gate_up.shape[0] != 2 * down.cols or gate_up.shape[1] != hidden or
                        down.shape[0] != hidden):  # fmt: skip
                return False
        return True

    def _build(self, k_pools: list[torch.Tensor], v_pools: list[torch.Tensor]) -> None:
        if self._table is None:
            table = (_Layer * len(self._weights))()
            for entry, (norm1, qkv, o, norm2, gate_up, down), scale, extra in zip(
                table, self._weights, self._scales, self._extras, strict=True
            ):
                halves = (("qkv", qkv, "o", o, "attn_half"),
                          ("gate_up", gate_up, "down", down, "mlp_half"))  # fmt: skip
                for name, w, second, w2, hook_name in halves:
                    hook = getattr(extra, hook_name)
                    if hook is not None:  # the layer's own half: its matrices stay unset
                        setattr(entry, hook_name, hook.fn)
                        setattr(entry, hook_name[:-4] + "ctx", hook.ctx or None)
                        continue
                    first, *rest = cpu_quant.parts(w)
                    setattr(entry, name, cpu_quant.q_proj(first))
                    setattr(entry, name + "_row", w.shape[0])
                    for k, part in enumerate(rest):
                        getattr(entry, name + "_rest")[k] = cpu_quant.q_proj(part)
                    setattr(entry, second, cpu_quant.q_proj(w2))
                entry.norm1, entry.norm2 = norm1.data_ptr(), norm2.data_ptr()
                entry.scale = scale
                for name, b in (("o_bias", extra.o_bias), ("down_bias", extra.down_bias)):
                    setattr(entry, name, None if b is None else b.data_ptr())
                for name, b, hook in (("qkv_bias", extra.qkv_bias, extra.attn_half),
                                      ("gate_up_bias", extra.gate_up_bias, extra.mlp_half)):
                    if b is not None and hook is None:  # float32, as cpu_quant.linear adds it
                        wide = b.float().contiguous()
                        self._wide_biases.append(wide)
                        setattr(entry, name, wide.data_ptr())
                if self.family.head_norms and extra.attn_half is None:
                    entry.q_norm, entry.k_norm = extra.q_norm.data_ptr(), extra.k_norm.data_ptr()
                if self.family.sandwich:
                    entry.post_attn = extra.post_attn.data_ptr()
                    entry.post_mlp = extra.post_mlp.data_ptr()
            self._table = table
            self._sizes = (max(e.qkv_row for e in table), max(e.o.cols for e in table),
                           max(e.down.cols for e in table))  # fmt: skip
            self._wide = max([e.qkv_row for e in table if e.qkv_bias] +
                             [e.gate_up_row for e in table if e.gate_up_bias] + [0])  # fmt: skip
        for entry, k, v in zip(self._table, k_pools, v_pools or [None] * len(k_pools),
                               strict=True):  # fmt: skip
            entry.k_pool = None if k is None else k.data_ptr()
            entry.v_pool = None if v is None else v.data_ptr()
        self._pools = (k_pools, v_pools, _first_ptr(k_pools), _first_ptr(v_pools))

    def run(
        self,
        hidden: torch.Tensor,
        rope: cpu_fused.RopeDecode | None,
        k_pools: list[torch.Tensor | None],
        v_pools: list[torch.Tensor | None] | None,
        steps: list[cpu_fused.RopeDecode | None] | None = None,
    ) -> torch.Tensor:
        """Every layer of the step for `hidden` [rows, H] (the embedded tokens; updated in
        place as the residual stream, without the last layer's MLP output), whose rotary,
        K/V write and attention `rope` does (or the layer's own in `steps`, where not None:
        the same C function's arguments for other tables or a window; a hooked attention
        half gets its layer's step arguments, whatever made them, and may need no `rope`);
        returns the last layer's MLP output [rows, H] (the caller adds it into `hidden`,
        normed by the last layer's post-MLP norm where the family has sandwich norms).
        `k_pools` / `v_pools`: each layer's pools (None where a hooked layer has none)."""
        pools = self._pools
        if not pools or pools[0] is not k_pools or pools[1] is not v_pools or (
            pools[2] != _first_ptr(k_pools) or pools[3] != _first_ptr(v_pools)
        ):  # fmt: skip
            self._build(k_pools, v_pools)
        assert hidden.dtype == self.dtype and hidden.is_contiguous()
        rows, size = hidden.shape
        qkv_out, q_size, inter = self._sizes
        dt = self.dtype
        x = torch.empty_like(hidden)
        qkv = torch.empty(rows, qkv_out, dtype=dt)
        att = torch.empty(rows, q_size, dtype=dt)
        o = torch.empty_like(hidden)
        gu = torch.empty(rows, 2 * inter, dtype=dt)
        down = torch.empty_like(hidden)
        bf16 = dt == torch.bfloat16
        wide = torch.empty(rows, self._wide, dtype=torch.float32) if bf16 and self._wide else None
        need = self._need.get(rows)
        if need is None:
            need = self._need[rows] = self._scratch_need(rows, bf16)
        fn, step = rope.c_call() if rope is not None else (None, None)
        if steps is not None or self._stepped:  # the layers' own steps
            for entry, own in zip(self._table, steps or [None] * len(self._table), strict=True):
                entry.step = None if own is None else own.c_call()[1]
                assert own is None or entry.attn_half or own.c_call()[0] == fn
            self._stepped = steps is not None
        fam = self.family
        norm = cpu_fused.norm_address("offset_add_rms_norm" if fam.offset_norms
                                      else "add_rms_norm", dt)  # fmt: skip
        chain = _Chain(len(self._table), rows, size, int(bf16), self.eps, norm, fn, step,
                       ctypes.addressof(self._table), hidden.data_ptr(), x.data_ptr(),
                       qkv.data_ptr(), att.data_ptr(), o.data_ptr(), gu.data_ptr(),
                       down.data_ptr(), cpu_quant.scratch(need), norm if fam.head_norms else None,
                       int(fam.sandwich), ACTIVATIONS[fam.activation], *fam.heads,
                       None if wide is None else wide.data_ptr())  # fmt: skip
        rc = cpu_quant.library().q_decode_chain(ctypes.byref(chain))
        if rc:
            raise RuntimeError(f"q_decode_chain failed ({rc})")
        self.runs += 1
        return down

    def _scratch_need(self, rows: int, bf16: bool) -> int:
        """q_matmul's scratch for the largest of the step's products, or a hook's need."""
        hooks = [h for e in self._extras for h in (e.attn_half, e.mlp_half)
                 if h is not None and h.scratch is not None]  # fmt: skip
        return max(
            [cpu_quant.scratch_bytes(p.t, rows, p.cols, bf16, p.out if bf16 else 0, swiglu)
             for layer in self._table
             for p, swiglu in ((layer.qkv, False), (layer.o, False), (layer.gate_up, False),
                               (layer.down, True), *((r, False) for r in layer.qkv_rest),
                               *((r, False) for r in layer.gate_up_rest)) if p.out]
            + [h.scratch(rows) for h in hooks] + [0]
        )  # fmt: skip
