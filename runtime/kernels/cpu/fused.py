"""Fused CPU kernels for the dense model's small ops, compiled on first use with the system C
compiler and called through ctypes.

A decode step of a small model is mostly fixed costs: SmolLM2-135M runs ~55 torch ops per
layer, ~1,650 per step, each a few microseconds of dispatch, allocation and a pass over memory.
Three kernels replace most of them: the residual add with the following RMSNorm, rotary on q
and k with the K/V write into the pool, and decode attention over the paged pool (float32
softmax; per request a pass over its keys, then one over its values, no gathered copy).
SiLU(gate) * up was tried too and dropped: two torch ops on one row cost one ctypes call.

Decode attention splits its requests over OpenMP threads: built with `-fopenmp`, the library
binds to the `libgomp.so.1` torch's Linux wheels already loaded, so it follows torch's thread
count (a torch with another OpenMP would give it a second runtime; set SGL_FUSED_CPU=0 there).

`available()` is False (and callers keep the torch path) when SGL_FUSED_CPU=0, when no C
compiler is found or compiling fails. `grammar/native_build.py` builds it (shared with the
grammar's C walk): cached under $SGL_NATIVE_CACHE, keyed by the sources, the flags, the compiler
and the CPU, and built with `-march=native`: one machine's build is never loaded on another CPU.

The C is in `csrc/`, in units compiled with different floating-point rules:

- EXACT (`exact.c`, `exact_fp8.c`; no reassociation, no FMA contraction): RMSNorm with the
  residual add, rotary with the K/V write. Each step rounds where torch's op-by-op code rounds
  (bf16: after every op), so rotary and the residual add give torch's bits; RMSNorm differs only
  by the order of its sum of squares: an ulp of the scale at most (bf16 outputs measured
  bit-equal to torch's; float32 ones differ in the last bit).
- FAST (`attention.c`, `attention_fp8.c`; -ffast-math: vectorised `expf`, reassociated sums):
  decode attention, whose torch counterpart (SDPA) has its own summation order anyway; it
  differs by summation order and `expf`, at float32 rounding level.

Each kernel is written once, as a template header (`norm_rotary.h`, `rotary_fp8.h`,
`decode_attention.h`, `rope_decode.h`) over the names `instance.h` defines for a storage type
(float32, bfloat16) and KV pool type (the same, or fp8): a unit includes it once per instance,
or is compiled once per instance with `-DSTORAGE=... -DPOOL=...` flags.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from grammar.native_build import Signatures, Unit, load_library
from runtime import settings
from runtime.kernels.cpu import gemv as cpu_gemv

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
_COMMON = ("-O3", "-march=native", "-fPIC", "-std=c11")
_FLAGS = {
    "exact": (*_COMMON, "-ffp-contract=off"),
    "fast": (*_COMMON, "-ffast-math"),
    "gemv": (*_COMMON, "-ffp-contract=fast"),
}
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
MODEL_TYPES = tuple(_SUFFIX)  # the compute types the kernels take
# an fp8 KV pool under a float32 / bfloat16 model: decode attention reads it, rotary writes it
_FP8_SUFFIX = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
# the kernels of one function per model type (`<name>_f32`, `<name>_bf16`): argtypes
_PER_TYPE = {
    "add_rms_norm": [_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _F32],
    "offset_add_rms_norm": [_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _F32],
    "rotary_kv": [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR],
    "decode_attention": [_PTR, _PTR, _PTR, _PTR, _I64, _PTR] + [_I64] * 6 + [_F32, _PTR],
    "gemv": [_PTR, _PTR, _PTR, _I64, _I64, _I64],
    "rope_decode": [_PTR, _PTR, _I64, _PTR, _PTR, _F32, _PTR],
}
# ... and per (model type, fp8 pool type) (`<name>_f32_e4m3`, ...), in the fp8 library
_PER_FP8_TYPE = {
    "rotary_kv": _PER_TYPE["rotary_kv"] + [_PTR, _PTR, _F32, _F32],
    "decode_attention": _PER_TYPE["decode_attention"],
}
_ONE_TYPE = {  # name: (restype, argtypes), one C function each (gemv.c, attention.c)
    "gemv_bf16_wide": (None, [_PTR, _PTR, _PTR, _I64, _I64, _I64]),
    "argmax_f32": (_I64, [_PTR, _I64]),
    "release_openmp_team": (ctypes.c_int, []),
    "hold_openmp_team": (ctypes.c_int, []),
    "set_attention_runner": (None, [_PTR]),
    "set_gemv_runner": (None, [_PTR]),
    "gemv_pool_run": (None, [_PTR, _PTR, ctypes.c_int]),
}
# each library's functions: name -> (restype, argtypes)
SIGNATURES: Signatures = {
    **{f"{name}_{suffix}": (None, argtypes) for name, argtypes in _PER_TYPE.items()
       for suffix in _SUFFIX.values()},
    **_ONE_TYPE,
}  # fmt: skip
FP8_SIGNATURES: Signatures = {
    f"{name}_{suffix}_{kv}": (None, argtypes) for name, argtypes in _PER_FP8_TYPE.items()
    for suffix in _SUFFIX.values() for kv in _FP8_SUFFIX.values()
}  # fmt: skip

# (kernel, dtype) -> C; dtype None: the functions of one type; (kernel, dtype, fp8 dtype):
# the variant for an fp8 KV pool
_lib: dict[tuple, ctypes._CFuncPtr] | None = None
_failed = False
_fp8_failed = False


def units(openmp: bool) -> list[Unit]:
    """The library's three units. With `openmp`, decode attention splits its requests over
    OpenMP threads."""
    omp = ("-fopenmp",) if openmp else ()
    return [
        Unit("exact", CSRC / "exact.c", _FLAGS["exact"]),
        Unit("fast", CSRC / "attention.c", _FLAGS["fast"] + omp),
        Unit("gemv", cpu_gemv.SOURCE, _FLAGS["gemv"] + omp),
    ]


def fp8_units(openmp: bool) -> list[Unit]:
    """The fp8 KV pool's library: the quantizing rotary write, and decode attention once per
    (model type, fp8 type) in a unit each (one unit's compile stays short on a loaded
    machine)."""
    omp = ("-fopenmp",) if openmp else ()
    out = [Unit("exact8", CSRC / "exact_fp8.c", _FLAGS["exact"])]
    for fp8 in _FP8_SUFFIX.values():
        for t in _SUFFIX.values():
            instance = (f"-DSTORAGE=STORAGE_{t.upper()}", f"-DPOOL=POOL_{fp8.upper()}")
            flags = (*_FLAGS["fast"], *instance, *omp)
            out.append(Unit(f"fast_{t}_{fp8}", CSRC / "attention_fp8.c", flags))
    return out


def _open(openmp: bool) -> ctypes.CDLL:
    """The dense kernels' library (`grammar/native_build.py` builds and caches it)."""
    omp = ("-fopenmp",) if openmp else ()
    name = "fused-omp" if openmp else "fused"
    return load_library(name, units(openmp), (*omp, "-lm"), SIGNATURES)


def _open_fp8(openmp: bool) -> ctypes.CDLL:
    """The fp8 KV pool's kernels, a library of their own (built on first use of an fp8 pool)."""
    omp = ("-fopenmp",) if openmp else ()
    name = "fused8-omp" if openmp else "fused8"
    return load_library(name, fp8_units(openmp), (*omp, "-lm"), FP8_SIGNATURES)


def _open_either(opener, what: str):
    """The OpenMP build of a kernel library, else its single-threaded build. OpenMP links
    against the libgomp torch already loaded (one runtime, torch's thread count); a compiler or
    runtime without it gets the single-threaded build."""
    try:
        return opener(openmp=True)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.info("%s without OpenMP: %s", what, exc)
        return opener(openmp=False)


def _load() -> dict[tuple[str, torch.dtype | None], ctypes._CFuncPtr] | None:
    global _lib, _failed
    if _lib is not None or _failed:
        return _lib
    try:
        lib = _open_either(_open, "fused CPU kernels")
        funcs = {
            (name, dtype): getattr(lib, f"{name}_{suffix}")
            for name in _PER_TYPE
            for dtype, suffix in _SUFFIX.items()
        }
        funcs.update({(name, None): getattr(lib, name) for name in _ONE_TYPE})
        # decode attention splits over the products' own pool (not an OpenMP team beside it)
        # until another library's pool takes both (run_attention_on)
        lib.set_attention_runner(ctypes.cast(lib.gemv_pool_run, ctypes.c_void_p).value)
        _lib = funcs
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
        _failed = True
        logger.info("fused CPU kernels unavailable, using torch ops: %s", exc)
    return _lib


def _load_fp8() -> bool:
    """Add the fp8 pool's kernels to the table (built on first use); False where they cannot
    be built or loaded (callers keep the torch paths)."""
    global _fp8_failed
    if _load() is None or _fp8_failed:
        return False
    if ("decode_attention", torch.float32, torch.float8_e4m3fn) in _lib:
        return True
    try:
        lib = _open_either(_open_fp8, "fp8 KV kernels")
        _lib.update({
            (name, dtype, kv): getattr(lib, f"{name}_{suffix}_{kv_suffix}")
            for name in _PER_FP8_TYPE
            for dtype, suffix in _SUFFIX.items()
            for kv, kv_suffix in _FP8_SUFFIX.items()
        })  # fmt: skip
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
        _fp8_failed = True
        logger.info("fp8 KV kernels unavailable, using torch ops: %s", exc)
    return not _fp8_failed


def available(dtype: torch.dtype) -> bool:
    """Whether the fused kernels run for CPU tensors of `dtype` (float32 or bfloat16; for a KV
    pool also fp8_e4m3 / fp8_e5m2, under a float32 or bfloat16 model)."""
    if not settings.FUSED_CPU.get():
        return False
    if dtype in _FP8_SUFFIX:
        return _load_fp8()
    return dtype in _SUFFIX and _load() is not None


def _fn(name: str, dtype: torch.dtype | None, kv: torch.dtype | None = None) -> ctypes._CFuncPtr:
    assert _lib is not None, "call available() first"
    return _lib[name, dtype] if kv is None or kv == dtype else _lib[name, dtype, kv]


def norm_address(name: str, dtype: torch.dtype) -> int:
    """The address of the C function `name` (`add_rms_norm` or `offset_add_rms_norm`) for
    `dtype`, for a caller in C (quant.c's decode chain)."""
    return ctypes.cast(_fn(name, dtype), ctypes.c_void_p).value


def add_rms_norm(
    hidden: torch.Tensor,
    delta: torch.Tensor | None,
    bias: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """`hidden += delta (+ bias)` in place, then RMSNorm(hidden) * weight as a new tensor.

    hidden, delta [N, H] contiguous, bias and weight [H], all of one dtype."""
    assert hidden.is_contiguous() and (delta is None or delta.is_contiguous())
    out = torch.empty_like(hidden)
    n, h = hidden.shape
    _fn("add_rms_norm", hidden.dtype)(
        hidden.data_ptr(), None if delta is None else delta.data_ptr(),
        None if bias is None else bias.data_ptr(), weight.data_ptr(), out.data_ptr(), n, h, eps,
    )  # fmt: skip
    return out


def offset_add_rms_norm(
    hidden: torch.Tensor,
    delta: torch.Tensor | None,
    delta_weight: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Gemma's sandwich step: `hidden += norm(delta, delta_weight)` in place (with a delta),
    then `norm(hidden, weight)` as a new tensor, where norm(x, w) = `F.rms_norm(x.float(),
    (H,), w, eps).to(x.dtype)` (float32 weights, multiplied before the rounding).

    hidden, delta [N, H] contiguous of one model type; the weights [H] float32 contiguous."""
    assert hidden.is_contiguous() and (delta is None or delta.is_contiguous())
    assert weight.dtype == torch.float32 and weight.is_contiguous()
    if delta is not None:
        assert delta_weight.dtype == torch.float32 and delta_weight.is_contiguous()
    out = torch.empty_like(hidden)
    n, h = hidden.shape
    _fn("offset_add_rms_norm", hidden.dtype)(
        hidden.data_ptr(), None if delta is None else delta.data_ptr(),
        None if delta is None else delta_weight.data_ptr(), weight.data_ptr(), out.data_ptr(),
        n, h, eps,
    )  # fmt: skip
    return out


def rotary_kv(
    qkv: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    num_heads: int,
    quant: tuple[torch.Tensor | None, torch.Tensor | None, float, float] | None = None,
) -> torch.Tensor:
    """Rotated q [N, Hq, D] from qkv [N, (Hq + 2 Hkv) D]; the rotated k and v are written into
    the pools' `slots` (flat `page * page_size + offset`, int64 [N]).

    cos_table / sin_table [P, D] must cover every position (int64 [N]); the pools are
    [pages, page_size, Hkv, D], contiguous, of qkv's dtype, or fp8: then `quant` = (k offset,
    v offset, k reciprocal scale, v reciprocal scale), offsets [Hkv, D] float32 or None, and
    k / v are stored as KVPool.write stores them (the same bits)."""
    n = qkv.shape[0]
    hkv, d = k_pool.shape[2], k_pool.shape[3]
    assert qkv.stride(1) == 1 and k_pool.is_contiguous() and v_pool.is_contiguous()
    assert positions.dtype == slots.dtype == torch.int64
    q = torch.empty(n, num_heads, d, dtype=qkv.dtype)
    args = [
        qkv.data_ptr(), qkv.stride(0), cos_table.data_ptr(), sin_table.data_ptr(),
        positions.data_ptr(), slots.data_ptr(), n, num_heads, hkv, d, q.data_ptr(),
        k_pool.data_ptr(), v_pool.data_ptr(),
    ]  # fmt: skip
    if k_pool.dtype != qkv.dtype:
        assert quant is not None and d <= 512
        k_off, v_off, k_inv, v_inv = quant
        for off in (k_off, v_off):
            assert off is None or (off.dtype == torch.float32 and off.is_contiguous())
        args += [None if k_off is None else k_off.data_ptr(),
                 None if v_off is None else v_off.data_ptr(), k_inv, v_inv]  # fmt: skip
    _fn("rotary_kv", qkv.dtype, k_pool.dtype)(*args)
    return q


@dataclass(slots=True)
class DecodeRows:
    """What decode attention reads per step, prepared once for all layers: the page table
    [B, max_pages] and sequence lengths [B] as contiguous int32."""

    table: torch.Tensor
    lens: torch.Tensor

    @classmethod
    def of(cls, page_table: torch.Tensor, seq_lens: torch.Tensor) -> DecodeRows:
        return cls(page_table.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous())


def decode_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, rows: DecodeRows, scale: float
) -> torch.Tensor:
    """As reference.paged_decode_attention: q [B, Hq, D] against each request's cached K/V
    (pools [pages, page_size, Hkv, D], contiguous, of q's dtype or fp8: converted to float as
    they are read, in registers). Entries of the page table past a request's last page are
    never read."""
    b, hq, d = q.shape
    if hq % k_pool.shape[2]:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({k_pool.shape[2]})")
    out = torch.empty_like(q)
    if b == 0:
        return out
    q = q.contiguous()
    assert k_pool.is_contiguous() and v_pool.is_contiguous() and rows.lens.shape[0] == b
    _fn("decode_attention", q.dtype, k_pool.dtype)(
        q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), rows.table.data_ptr(),
        rows.table.stride(0), rows.lens.data_ptr(), b, hq, k_pool.shape[2], d, k_pool.shape[1],
        k_pool.shape[0], scale, out.data_ptr(),
    )  # fmt: skip
    return out


class _RopeStepArgs(ctypes.Structure):
    _fields_ = [(name, _PTR) for name in ("cos", "sin", "pos", "slots", "table", "lens")] + [
        (name, _I64) for name in ("table_stride", "n", "hq", "hkv", "d", "ps", "num_pages")
    ] + [("q", _PTR), ("window", _I64), ("rot", _I64), ("cap", _F32)]  # fmt: skip


class RopeDecode:
    """`rotary_kv` then `decode_attention` for each layer of one decode-only step, in one C call
    a layer (the same kernels, so the same bits); what every layer shares is set up once.

    rows: the step's DecodeRows (one query per request: positions / slots int64 [B]); the
    pools [pages, page_size, Hkv, D] of the model's dtype (not fp8), contiguous. With a
    `window` (> 0) each request attends to its last `window` keys only (a sliding window).
    Tables [positions, R] with R < D: partial rotary (the first R values of each head rotated,
    the rest as they are). A `cap` (> 0) soft-caps the scores: cap * tanh(s / cap)."""

    def __init__(
        self,
        cos_table: torch.Tensor,
        sin_table: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        rows: DecodeRows,
        num_heads: int,
        k_pool: torch.Tensor,
        dtype: torch.dtype,
        window: int = 0,
        cap: float = 0.0,
    ) -> None:
        pages, ps, hkv, d = k_pool.shape
        b = rows.lens.shape[0]
        if num_heads % hkv:
            raise ValueError(f"query heads ({num_heads}) must be a multiple of kv heads ({hkv})")
        assert k_pool.dtype == dtype and positions.dtype == slots.dtype == torch.int64
        assert positions.shape[0] == slots.shape[0] == b
        self._keep = (cos_table, sin_table, positions, slots, rows)  # the struct points at them
        self.q = torch.empty(b, num_heads, d, dtype=dtype)
        self.args = _RopeStepArgs(
            cos_table.data_ptr(), sin_table.data_ptr(), positions.data_ptr(), slots.data_ptr(),
            rows.table.data_ptr(), rows.lens.data_ptr(), rows.table.stride(0), b, num_heads, hkv,
            d, ps, pages, self.q.data_ptr(), window, cos_table.shape[-1], cap,
        )  # fmt: skip
        assert cos_table.shape[-1] <= d and cos_table.shape[-1] % 2 == 0
        self._ref = ctypes.byref(self.args)
        self._fn = _fn("rope_decode", dtype)
        self.dtype, self.shape = dtype, (b, num_heads, d)

    def c_call(self) -> tuple[int, int]:
        """(the C function's address, its per-step arguments' address), for a caller in C
        (quant.c's decode chain): `fn(args, qkv, qkv_row_stride, k_pool, v_pool, scale,
        out)` does what `__call__` does."""
        return ctypes.cast(self._fn, ctypes.c_void_p).value, ctypes.addressof(self.args)

    def __call__(
        self, qkv: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Attention output [B, Hq, D] of one layer, whose fused projection is qkv [B, (Hq + 2
        Hkv) D] (q, k, v heads; the new k / v go into the pools)."""
        assert qkv.dtype == self.dtype and qkv.stride(1) == 1 and k_pool.dtype == self.dtype
        out = torch.empty(self.shape, dtype=self.dtype)
        self._fn(self._ref, qkv.data_ptr(), qkv.stride(0), k_pool.data_ptr(), v_pool.data_ptr(),
                 scale, out.data_ptr())  # fmt: skip
        return out


class StepRows:
    """A decode-only step's rows as rope_decode's argument struct (the rotary tables [positions,
    R] it reads at each row's position, positions, slots, page table, lengths, page size and
    count; no query buffer, no heads), for a decode chain hook that reads its own cache (MLA's
    latent pages): `c_call()` gives (0, the struct's address)."""

    def __init__(
        self,
        tables: tuple[torch.Tensor, torch.Tensor],
        positions: torch.Tensor,
        slots: torch.Tensor,
        rows: DecodeRows,
        pool: torch.Tensor,
    ) -> None:
        b = rows.lens.shape[0]
        assert positions.dtype == slots.dtype == torch.int64 and positions.shape[0] == b
        cos, sin = tables
        assert cos.is_contiguous() and sin.is_contiguous()
        self._keep = (cos, sin, positions, slots, rows)
        self.args = _RopeStepArgs(
            cos.data_ptr(), sin.data_ptr(), positions.data_ptr(), slots.data_ptr(),
            rows.table.data_ptr(), rows.lens.data_ptr(), rows.table.stride(0), b, 0, 0, 0,
            pool.shape[1], pool.shape[0], None, 0, cos.shape[-1],
        )  # fmt: skip

    def c_call(self) -> tuple[int, int]:
        return 0, ctypes.addressof(self.args)


def gemv(
    packed: torch.Tensor, x: torch.Tensor, out_features: int, wide: bool = False
) -> torch.Tensor:
    """y [M, out] = x [M, in] @ w.T (M <= cpu_gemv.MAX_ROWS) for `packed` = cpu_gemv.pack(w),
    all of one dtype; with `wide`, y in float32 (bf16 results widened: `(x @ w.T).float()`).
    Each row's result is the same whatever M; the output rows split over torch's threads."""
    assert x.dim() == 2 and 1 <= x.shape[0] <= cpu_gemv.MAX_ROWS and packed.dtype == x.dtype
    x = x.contiguous()
    m = x.shape[0]
    if wide and x.dtype == torch.bfloat16:
        y = torch.empty(m, out_features, dtype=torch.float32)
        fn = _fn("gemv_bf16_wide", None)
    else:
        y = torch.empty(m, out_features, dtype=x.dtype)
        fn = _fn("gemv", x.dtype)
    fn(packed.data_ptr(), x.data_ptr(), y.data_ptr(), out_features, x.shape[1], m)
    return y


def argmax_row(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(-1)` of one contiguous float32 row [1, V], in C: torch's reduction over
    a long row opens an OpenMP region, whose spinning worker would hold the other core while
    the next step's projections want it (csrc/pool.h)."""
    assert logits.dim() == 2 and logits.shape[0] == 1 and logits.dtype == torch.float32
    if logits.shape[1] == 0:
        raise ValueError("argmax of an empty row")
    logits = logits.contiguous()
    return torch.tensor([_fn("argmax_f32", None)(logits.data_ptr(), logits.shape[1])])


def run_attention_on(runner: int | None) -> bool:
    """Split decode attention's requests, and the matrix-vector products (`gemv`), over
    `runner` (the address of a C function `runner(fn, args, parts)`, another library's thread
    pool): a decode step's work then has one set of spinning workers; None: attention on
    OpenMP and the products on this library's own pool (at load, attention runs on that pool
    too). False where the kernels are not built. Each request's result is the same either
    way."""
    if _load() is None:
        return False
    _fn("set_attention_runner", None)(runner)
    _fn("set_gemv_runner", None)(runner)
    return True


def release_openmp_team() -> bool:
    """Free the calling thread's OpenMP team (True if freed or there was none; False where
    the OpenMP runtime cannot). An engine calls it on the thread
    that built it: libgomp stops spinning once two threads own teams, and every region the
    scheduler thread opens (oneDNN's matmuls, attention) would then pay a wake-up (~35 us
    against ~7 here)."""
    if _load() is None:
        return False
    return bool(_fn("release_openmp_team", None)())


def hold_openmp_team() -> int:
    """Give the calling thread an OpenMP team of torch's thread count and keep it (its size;
    0 where the kernels are not built or OpenMP is absent). Beside the scheduler thread's team
    libgomp then manages more threads than CPUs, and its workers spin only briefly after each
    region (libgomp's throttled spin count: 100 pauses against 300,000 when OMP_WAIT_POLICY
    is unset) instead of holding a core for milliseconds: what a quantized model wants, whose
    projections and decode attention run on the quantized kernels' own spinning pool
    (csrc/pool.h) while torch's regions (prefill attention, the dense prompt products) are
    few. Measured on 2 cores, default Q4_1 model: json workload 3.7 -> 2.0 s, 16x128 decode
    7.8 -> 5.7 s, batch-1 0.74 -> 0.60 s. A dense model keeps the long spin (see
    docs/quantization.md)."""
    if _load() is None:
        return 0
    return int(_fn("hold_openmp_team", None)())
