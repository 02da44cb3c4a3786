"""A decode step's layers in one C call (csrc/quant.c's `q_decode_chain`).

A batch-1 decode step of a small quantized model is a few hundred short kernel calls (SmolLM2:
30 layers x 2 norms, 4 products and one rotary + attention call). Called from Python each costs
a few microseconds of interpreter and torch work on top of the kernel (a tenth of the step or
more at 2 threads); the chain makes the same calls from C, one Python call a step. The kernels
and their inputs are the Python forward's own (`add_rms_norm` and `RopeDecode` of cpu_fused,
cpu_quant's products), in the same order, so the results are the same bits.

What it covers: every layer of a Llama-family model without biases whose six per-layer weights
are all quantized tensors of one format each (QuantTensor), in bf16 or float32, for a decode-only
step of fewer than cpu_quant.DENSE_ROWS requests with the fused CPU attention (the model's
forward checks the rest: one rank, one stage, full causal attention in every layer).
"""

from __future__ import annotations

import ctypes

import torch

from runtime.kernels.cpu import fused as cpu_fused
from runtime.kernels.cpu import quant as cpu_quant

_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class _Proj(ctypes.Structure):
    _fields_ = [("t", _I64), ("packed", _I64), ("w", _PTR), ("row_bytes", _I64), ("out", _I64),
                ("cols", _I64)]  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [(name, _Proj) for name in ("qkv", "o", "gate_up", "down")] + [
        (name, _PTR) for name in ("norm1", "norm2", "k_pool", "v_pool")
    ] + [("scale", _F32)]  # fmt: skip


class _Chain(ctypes.Structure):
    _fields_ = [(name, _I64) for name in ("layers", "rows", "hidden", "bf16")] + [
        ("eps", _F32)
    ] + [(name, _PTR) for name in ("norm", "attn", "attn_step", "layer", "h", "x", "qkv", "att",
                                     "o", "gu", "down", "scratch")]  # fmt: skip


def _proj(w: cpu_quant.QuantTensor) -> _Proj:
    w.pack()
    d = w.data
    return _Proj(w.qtype, int(w.packed), d.data_ptr(), d.shape[1], d.shape[0], w.cols)


class DecodeChain:
    """The layers' weights `(norm1, qkv, o, norm2, gate_up, down)` and softmax scales of one
    model; `run` does one decode-only step's layers.

    Invariant: the weights are never replaced after the first run (their packed bytes are
    addressed from C)."""

    def __init__(
        self, layers: list[tuple], scales: list[float], eps: float, dtype: torch.dtype
    ) -> None:
        self._weights = layers
        self._scales = scales
        self.eps, self.dtype = eps, dtype
        self._table: ctypes.Array | None = None  # the per-layer arguments, at the first run
        self._pools: tuple = ()  # the KV pool tensors the table points at
        self._need: dict[int, int] = {}  # scratch bytes by row count
        self.runs = 0  # steps run

    @staticmethod
    def supported(layers: list[tuple], dtype: torch.dtype) -> bool:
        """Whether the chain runs these weights: each layer's four matrices quantized with the
        integer kernels, the norms plain tensors of the model's dtype, the fused C norm built."""
        if dtype not in (torch.float32, torch.bfloat16) or not layers:
            return False
        if cpu_quant.library() is None or not cpu_fused.available(dtype):
            return False
        for norm1, qkv, o, norm2, gate_up, down in layers:
            mats = (qkv, o, gate_up, down)
            if any(type(w) is not cpu_quant.QuantTensor or w.qtype not in cpu_quant.INT_TYPES
                   for w in mats):  # fmt: skip
                return False
            if any(not isinstance(n, torch.Tensor) or n.dtype != dtype for n in (norm1, norm2)):
                return False
            if gate_up.shape[0] != 2 * down.cols or qkv.cols != o.shape[0]:
                return False
        return True

    def _build(self, k_pools: list[torch.Tensor], v_pools: list[torch.Tensor]) -> None:
        if self._table is None:
            table = (_Layer * len(self._weights))()
            for entry, (norm1, qkv, o, norm2, gate_up, down), scale in zip(
                table, self._weights, self._scales, strict=True
            ):
                entry.qkv, entry.o = _proj(qkv), _proj(o)
                entry.gate_up, entry.down = _proj(gate_up), _proj(down)
                entry.norm1, entry.norm2 = norm1.data_ptr(), norm2.data_ptr()
                entry.scale = scale
            self._table = table
        for entry, k, v in zip(self._table, k_pools, v_pools, strict=True):
            entry.k_pool, entry.v_pool = k.data_ptr(), v.data_ptr()
        self._pools = (k_pools, v_pools, k_pools[0].data_ptr(), v_pools[0].data_ptr())

    def run(
        self,
        hidden: torch.Tensor,
        rope: cpu_fused.RopeDecode,
        k_pools: list[torch.Tensor],
        v_pools: list[torch.Tensor],
    ) -> torch.Tensor:
        """Every layer of the step for `hidden` [rows, H] (the embedded tokens; updated in
        place as the residual stream, without the last layer's MLP output), whose rotary,
        K/V write and attention `rope` does; returns the last layer's MLP output [rows, H]
        (to be added into `hidden`)."""
        pools = self._pools
        if not pools or pools[0] is not k_pools or pools[1] is not v_pools or (
            pools[2] != k_pools[0].data_ptr() or pools[3] != v_pools[0].data_ptr()
        ):  # fmt: skip
            self._build(k_pools, v_pools)
        assert hidden.dtype == self.dtype and hidden.is_contiguous()
        rows, size = hidden.shape
        first = self._table[0]
        qkv_out, q_size = first.qkv.out, first.o.cols
        inter, dt = first.down.cols, self.dtype
        x = torch.empty_like(hidden)
        qkv = torch.empty(rows, qkv_out, dtype=dt)
        att = torch.empty(rows, q_size, dtype=dt)
        o = torch.empty_like(hidden)
        gu = torch.empty(rows, 2 * inter, dtype=dt)
        down = torch.empty_like(hidden)
        bf16 = dt == torch.bfloat16
        need = self._need.get(rows)
        if need is None:  # q_matmul's scratch for the largest of the step's products
            need = self._need[rows] = max(
                cpu_quant.scratch_bytes(p.t, rows, p.cols, bf16, p.out if bf16 else 0, swiglu)
                for layer in self._table
                for p, swiglu in ((layer.qkv, False), (layer.o, False), (layer.gate_up, False),
                                  (layer.down, True))
            )  # fmt: skip
        fn, step = rope.c_call()
        chain = _Chain(len(self._table), rows, size, int(bf16), self.eps,
                       cpu_fused.add_rms_norm_address(dt), fn, step,
                       ctypes.addressof(self._table), hidden.data_ptr(), x.data_ptr(),
                       qkv.data_ptr(), att.data_ptr(), o.data_ptr(), gu.data_ptr(),
                       down.data_ptr(), cpu_quant.scratch(need))  # fmt: skip
        rc = cpu_quant.library().q_decode_chain(ctypes.byref(chain))
        if rc:
            raise RuntimeError(f"q_decode_chain failed ({rc})")
        self.runs += 1
        return down
