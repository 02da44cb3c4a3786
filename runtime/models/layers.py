"""Pieces every model family uses."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime import settings
from runtime.kernels.cpu import fused as cpu_fused
from runtime.kernels.cpu import gemv as cpu_gemv
from runtime.kernels.cpu import quant as cpu_quant


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As transformers' RMSNorm: normalise in float32, cast back, then scale."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # in fp32 torch's fused kernel is the same arithmetic in one op (bit-identical here)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


# oneDNN matmuls on weights reordered once at load time into its blocked layout, called on
# plain (dense) activations: no per-call conversions. Measured on this 2-core AVX-512 CPU, one
# thread, against F.linear: a 16 x 576 -> 3072 projection 0.25 vs 0.65 ms in fp32 and 0.14 vs
# 0.20 ms in bf16; SmolLM2's 49152-row LM head for one token 3.2 vs 8.0 ms (fp32), 1.7 vs 3.6 ms
# (bf16); a 512-token prefill chunk 2.2x faster in fp32. The reorder's batch-size hint only picks
# the blocking; any number of rows runs.
_REORDER_HINT_ROWS = 16


def packing_enabled(dtype: torch.dtype, device: torch.device) -> bool:
    """Reorder fp32 / bf16 CPU weights for oneDNN unless SGL_PACKED_LINEAR=0 (read at model
    load). bf16 needs a CPU with native bf16 dot products (AVX-512 BF16 or AMX)."""
    if not settings.PACKED_LINEAR.get() or device.type != "cpu":
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


# Inputs of at most this many rows take the matrix-vector kernel (cpu_gemv.MAX_ROWS): a decode
# step of up to 16 requests. Its products cost less CPU than oneDNN's (a
# SmolLM2 step's projections, 16 rows, one thread, loaded machine: fp32 61 vs 69 ms, bf16 38 vs
# 46), each row gets the bits it gets alone, and they split over the same spinning pool as the
# step's decode attention (fused.run_attention_on), while the engine's OpenMP workers spin only
# briefly on such steps (threads.WaitChoice): an earlier trial, with attention on OpenMP and
# its workers' long spin beside the pool, had made the 16-request decode slower.
GEMV_ROWS = 16


def gemv_enabled(dtype: torch.dtype, device: torch.device) -> bool:
    """One-row projections through the packed CPU matrix-vector kernel (cpu_gemv.py) unless
    SGL_CPU_GEMV=0 or the fused CPU kernels are unavailable (read at model load)."""
    if not settings.CPU_GEMV.get() or device.type != "cpu":
        return False
    return cpu_fused.available(dtype)


class Packed:
    """Weights [out, in] with a oneDNN-reordered copy each and, for inputs of at most
    GEMV_ROWS rows, a copy in the CPU matrix-vector kernel's layout (both found by
    tensor identity), and `linear`, which multiplies through one of them when there is one,
    else `F.linear`.

    Invariant: a weight is never modified after construction (the copies would go stale)."""

    def __init__(self, weights: list[torch.Tensor], enabled: bool, gemv: bool = False) -> None:
        self._packed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # for few-row inputs
        weights = [w for w in weights if not cpu_quant.is_quantized(w)]  # they run as stored
        if gemv:
            rows = list({id(w): w for w in weights if cpu_gemv.packable(w)}.values())
            for w, p in zip(rows, cpu_gemv.pack_all(rows), strict=True):
                self._rows[id(w)] = (w, p)
        for w in weights:
            if enabled and w.dim() == 2 and w.numel() and id(w) not in self._packed:
                reordered = torch.ops.mkldnn._reorder_linear_weight(w, _REORDER_HINT_ROWS)
                self._packed[id(w)] = (w, reordered)

    def linear(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        bias: torch.Tensor | None = None,
        float_out: bool = False,
    ) -> torch.Tensor:
        """x @ w.T (+ bias); with `float_out`, `.float()` of it (up to GEMV_ROWS rows: in the same
        kernel)."""
        if cpu_quant.is_quantized(w):
            return cpu_quant.linear(x, w, bias, float_out)
        if bias is None and x.dim() == 2 and 1 <= x.shape[0] <= GEMV_ROWS:
            rows = self._rows.get(id(w))
            if rows is not None:
                return cpu_fused.gemv(rows[1], x, w.shape[0], wide=float_out)
        out = self._dense(x, w, bias)
        return out.float() if float_out else out

    def swiglu(self, gate_up: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """`linear(F.silu(gate) * up, w)` for gate_up = [gate | up] (a quantized w: the SiLU and
        the product in the C product's input stage, no torch ops)."""
        if cpu_quant.is_quantized(w):
            return cpu_quant.linear(gate_up, w, swiglu=True)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.linear(F.silu(gate) * up, w)

    def geglu(self, gate_up: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """`linear(F.gelu(gate, approximate="tanh") * up, w)` (Gemma's MLP), as `swiglu` does it:
        for a quantized w in the C product's input stage."""
        if cpu_quant.is_quantized(w):
            return cpu_quant.linear(gate_up, w, swiglu=cpu_quant.GATES["gelu_pytorch_tanh"])
        gate, up = gate_up.chunk(2, dim=-1)
        return self.linear(F.gelu(gate, approximate="tanh") * up, w)

    def _dense(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        entry = self._packed.get(id(w))
        if entry is None or x.dim() != 2 or x.shape[0] == 0:
            return torch.nn.functional.linear(x, w, bias)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), entry[1], bias, "none", [], "")


class AddNorm:
    """`(hidden + residual, RMSNorm of it)`: `hidden + (out + bias)` then the norm, as torch
    rounds them; on CPU, where the fused C kernel is built for the dtype, in one pass that
    adds in place into `hidden` (a tensor the forward pass allocated; fp32: within an ulp of
    torch's ops, bf16: bit-equal)."""

    def __init__(self, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        self.eps = eps
        self.fused = device.type == "cpu" and cpu_fused.available(dtype)

    def __call__(
        self,
        hidden: torch.Tensor,
        residual: tuple[torch.Tensor, torch.Tensor | None] | None,
        weight: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused:
            out, bias = residual if residual is not None else (None, None)
            return hidden, cpu_fused.add_rms_norm(hidden, out, bias, weight, self.eps)
        if residual is not None:
            out, bias = residual
            hidden = hidden + (out if bias is None else out + bias)
        return hidden, rms_norm(hidden, weight, self.eps)


def embedding(ids: torch.Tensor, table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` of an embedding table (a quantized one dequantized row by row)."""
    if cpu_quant.is_quantized(table):
        return cpu_quant.embedding(ids, table, dtype)
    return F.embedding(ids, table)


def dense_weight(t, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A weight as a plain tensor in `dtype` (a quantized one dequantized: for the few weights a
    model multiplies densely, such as a router or MLA's up-projections)."""
    if cpu_quant.is_quantized(t):
        return t.dequantize().to(dtype)
    return t.to(dtype)


def nbytes(t: torch.Tensor) -> int:
    """Bytes a weight takes as held (a quantized one: as stored)."""
    if cpu_quant.is_quantized(t):
        return t.nbytes
    return t.numel() * t.element_size()
