"""Weights in GGUF's block formats (`QuantTensor`) and their CPU products, in C (csrc/quant.c).

A `QuantTensor` is a weight [out, in] kept as the file stores it: `data` is uint8
[out, row_bytes], each row `in / block` blocks of the type's bytes. It answers the few tensor
calls a model's loader makes on a weight (`.to(dtype)` and `.contiguous()` keep it as it is,
row slices and block-aligned column slices copy those bytes, `torch.cat` stacks rows), so a model
file loads quantized and plain checkpoints with the same code. The products run in
`linear` (any number of input rows; float32 out) and the embedding in `embedding`.

The library is compiled on first use with the system C compiler, -march=native (the CPU that
runs it picks AVX2, AVX-512 VNNI or neither), by grammar/native_build.py as cpu_fused's is.
`portable=True` builds the same source as plain C for a baseline x86-64 / any CPU: tests check
that both give the same bits. Its thread pool is csrc/pool.h's (a copy of its own in this
library: a quantized model's projections all run here, so the dense kernels' pool stays idle).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from grammar.native_build import Signatures, Unit, load_library
from runtime.errors import UnsupportedModelError
from runtime.kernels.cpu import fused as cpu_fused

logger = logging.getLogger(__name__)

# GGML type id -> (name, elements per block, bytes per block): the types this code runs
TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}
TYPE_IDS = {name: tid for tid, (name, _, _) in TYPES.items()}
# Inputs of at least this many rows (prefill chunks) dequantize the weight (in C, one matrix at
# a time) and multiply with torch's matmul: measured as CPU time on one thread, a 3072 x 576
# Q4_1 matrix against 256 rows took 14.8 ms this way and 22.0 ms on the integer path (64
# rows: 6.0 vs 6.3 ms; 16 rows: 2.1 vs 1.5 ms).
DENSE_ROWS = 128

SOURCE = Path(__file__).parent / "csrc" / "quant.c"
BF16_SOURCE = Path(__file__).parent / "csrc" / "dequant_bf16.c"
MOE_SOURCE = Path(__file__).parent / "csrc" / "moe.c"  # a layer's routed experts (models/moe.py)
MLA_SOURCE = Path(__file__).parent / "csrc" / "mla.c"  # MLA's decode attention (models/mla.py)
_NATIVE = ("-O3", "-march=native")
_PORTABLE = ("-O2", "-DQUANT_PORTABLE")  # the compiler's baseline target, no intrinsics
_COMMON = ("-fPIC", "-std=gnu11", "-ffp-contract=off", "-fopenmp")
_I64, _I32, _PTR = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
SIGNATURES: Signatures = {  # name: (restype, argtypes)
    "q_dequant": (_I32, [_I32, _I32, _PTR, _I64, _I64, _I64, _PTR]),
    "q_matmul": (
        _I32,
        [_I32, _I32, _PTR, _I64, _I64, _I64, _PTR, _I32, _I64, _PTR, _I64, _I32, _PTR, _I32, _I32],
    ),
    "q_embedding": (_I32, [_I32, _I32, _PTR, _I64, _I64, _I64, _PTR, _I64, _PTR]),
    "q_repack": (_I32, [_I32, _PTR, _I64, _I64, _I64, _I32, _PTR]),
    "q_uses_int": (_I32, [_I32]),
    "q_pool_run": (None, [_PTR, _PTR, _I32]),
    "q_decode_chain": (_I32, [_PTR]),
    "q_dequant_bf16": (_I32, [_I32, _PTR, _I64, _I64, _I64, _PTR]),
    "q_mla_decode": (_I32, [_PTR, _PTR, _PTR, _I64, _PTR, _I64, _PTR, _I64]),
    "q_moe": (_I32, [_PTR, _PTR, _I64, _PTR, _I32]),
    "q_moe_route": (_I32, [_PTR, _PTR, _I64, _I32, _PTR, _PTR]),
}

_libs: dict[bool, ctypes.CDLL | None] = {}
_lock = threading.Lock()
_pack_lock = threading.Lock()


def units(portable: bool = False) -> list[Unit]:
    """The library's units (the kernels, the bf16 dequantization of csrc/dequant_bf16.c,
    MLA's decode attention of csrc/mla.c and the routed experts of csrc/moe.c): for this CPU,
    or `portable` (plain C)."""
    flags = (*(_PORTABLE if portable else _NATIVE), *_COMMON)
    return [Unit("quant", SOURCE, flags), Unit("dequant_bf16", BF16_SOURCE, flags),
            Unit("mla", MLA_SOURCE, flags), Unit("moe", MOE_SOURCE, flags)]  # fmt: skip


def library(portable: bool = False) -> ctypes.CDLL | None:
    """The compiled kernels (None when no C compiler is found or the build fails)."""
    with _lock:
        if portable in _libs:
            return _libs[portable]
        lib = None
        try:
            name = "quant-portable" if portable else "quant"
            lib = load_library(name, units(portable), ("-fopenmp", "-lm"), SIGNATURES)
        except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
            logger.warning("quantized CPU kernels unavailable: %s", exc)
            lib = None
        _libs[portable] = lib
        if lib is not None and not portable and cpu_fused.available(torch.float32):
            # decode attention (several requests) splits over this library's pool: the
            # projections' spinning worker, not a second team of OpenMP threads beside it
            cpu_fused.run_attention_on(ctypes.cast(lib.q_pool_run, ctypes.c_void_p).value)
        return lib


def pool_runner() -> int | None:
    """The address of this library's `q_pool_run(fn, args, parts)` (the threads the quantized
    products run on) where it is loaded, for another library's kernels to split over the same
    threads instead of opening an OpenMP team beside them; None where it is not loaded."""
    lib = _libs.get(False)
    return None if lib is None else ctypes.cast(lib.q_pool_run, ctypes.c_void_p).value


def _lib(portable: bool = False) -> ctypes.CDLL:
    lib = library(portable)
    if lib is None:
        raise UnsupportedModelError(
            "quantized weights need the C kernels (runtime/kernels/cpu/quant.py), which could "
            "not be built: is a C compiler (cc / gcc, or $CC) installed?"
        )
    return lib


def type_name(qtype: int) -> str:
    """The GGML name of a type id (`Q4_K`), also for the types this code cannot run."""
    if qtype in TYPES:
        return TYPES[qtype][0]
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(qtype).name
    except (ImportError, ValueError):
        return f"type {qtype}"


def row_bytes(qtype: int, cols: int) -> int:
    _, block, size = TYPES[qtype]
    return cols // block * size


def huge_page_bytes(shape: torch.Size) -> torch.Tensor:
    """An uninitialised uint8 tensor; from 2 MB on, in a mapping of its own advised for
    transparent huge pages (a decode step streams every weight: fewer TLB misses, as
    cpu_gemv.pack_all does for the dense weights), unmapped when the tensor is freed (so a
    weight replaced by its packed copy gives its memory back to the system)."""
    nbytes = shape[0] * shape[1]
    if nbytes >= 1 << 21:
        try:
            arena = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            arena.madvise(mmap.MADV_HUGEPAGE)
            return torch.frombuffer(arena, dtype=torch.uint8).view(shape)  # keeps it mapped
        except (AttributeError, OSError, ValueError):  # no madvise / huge pages here
            pass
    return torch.empty(shape, dtype=torch.uint8)


_HUGE = 1 << 21  # a transparent huge page
_ARENA_BYTES = 32 << 20  # the packed weights' mappings are this large (or one weight's size)


class _Arena:
    """Packed weights side by side, in 2 MB-aligned mappings advised for transparent huge
    pages. A decode step streams every weight once: on huge pages it takes a TLB entry per
    2 MB instead of per 4 KB, also for the many weights under 2 MB (SmolLM2's are 0.2-1.1 MB)
    and for a weight's part past its last 2 MB boundary, which a mapping of its own leaves on
    4 KB pages (a mapping's start is only 2 MB-aligned when the kernel chooses to). The weights
    follow each other in the order they are first packed (a forward pass's order). A mapping
    is unmapped once every weight in it is freed; its unused end is never written, so it costs
    no memory."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free = torch.empty(0, dtype=torch.uint8)  # the current mapping's unused part

    def take(self, shape: torch.Size) -> torch.Tensor:
        nbytes = shape[0] * shape[1]
        with self.lock:
            if self.free.numel() < nbytes:
                size = max(_ARENA_BYTES, -(-nbytes // _HUGE) * _HUGE)
                area = mmap.mmap(-1, size + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                area.madvise(mmap.MADV_HUGEPAGE)
                whole = torch.frombuffer(area, dtype=torch.uint8)  # keeps the mapping
                start = -whole.data_ptr() % _HUGE
                self.free = whole[start : start + size]
            out = self.free[:nbytes]
            self.free = self.free[-(-nbytes // 64) * 64 :]  # the next weight on a cache line
        return out.view(shape)


_arena = _Arena()


# From this size a weight whose bytes nothing else holds is packed where it lies, a chunk of
# groups at a time through a small buffer, instead of into a copy in the arena: packing a copy
# holds the weight twice for a moment (Gemma 3's tied 262,144 x 640 Q8_0 embedding / head: 178
# MB more at the first decode step). Such a weight is in a mapping of its own already (the
# GGUF loader reads it into `huge_page_bytes`), so it keeps its huge pages.
IN_PLACE_BYTES = _ARENA_BYTES
_PACK_CHUNK_BYTES = 1 << 22


def _sole_owner(data: torch.Tensor) -> bool:
    """Whether `data` (a QuantTensor's bytes) is the only tensor over its memory: not a slice of
    a stacked buffer, not shared with another weight (a tensor object referenced elsewhere, or a
    second view of the same bytes); a view of a base that only it references counts as alone."""
    base = data._base
    if data.untyped_storage().nbytes() != data.numel() or data.storage_offset():
        return False
    # references: the QuantTensor's slot, this argument, getrefcount's own (and for the base,
    # the view's _base in place of the slot)
    if sys.getrefcount(data) > 3 or (base is not None and sys.getrefcount(base) > 3):
        return False
    holders = 1 + (base is not None)  # tensors over the storage: data (and its base)
    return torch._C._storage_Use_Count(data.untyped_storage()._cdata) <= holders + 1


def _pack_in_place(lib: ctypes.CDLL, w: QuantTensor) -> None:
    """w.data rearranged as q_repack packs it, where it lies: the packing of a group of 8 rows
    stays within the group's bytes, so whole groups are packed a chunk at a time into a buffer
    and copied back (the rows past the last whole group are stored as they are)."""
    d = w.data
    rows, width = d.shape
    step = max(8, _PACK_CHUNK_BYTES // width // 8 * 8)
    buf = torch.empty(min(step, rows), width, dtype=torch.uint8)
    for r0 in range(0, rows // 8 * 8, step):
        n = min(step, rows // 8 * 8 - r0)
        part = d[r0 : r0 + n]
        lib.q_repack(w.qtype, part.data_ptr(), width, n, w.cols, 1, buf.data_ptr())
        part.copy_(buf[:n])


def packed_bytes(shape: torch.Size) -> torch.Tensor:
    """An uninitialised uint8 tensor for a packed weight: in the weights' arena (huge pages),
    else (no anonymous mappings or madvise here) a plain tensor."""
    try:
        return _arena.take(shape)
    except (AttributeError, OSError, ValueError):
        return torch.empty(shape, dtype=torch.uint8)


@dataclass(slots=True, eq=False)
class QuantTensor:
    """A weight [rows, cols] in a GGUF block format; `data` uint8 [rows, row_bytes], as the
    file stores it, or (`packed`) rearranged in groups of 8 rows for the products
    (quant.c's q_repack; the same bytes, so the same size).

    Invariant: `data` is contiguous and never modified in place; `pack()` replaces it once,
    under a lock (the first product packs a weight of a packable format)."""

    data: torch.Tensor
    qtype: int
    cols: int
    packed: bool = False
    # q_matmul's leading arguments (type, packed, pointer, row bytes, rows, cols), set by the
    # first fast product once `data` is final (packed, or a format that stays as stored)
    head: tuple = ()

    def __post_init__(self) -> None:
        _, block, _ = TYPES[self.qtype]
        if self.cols % block or self.data.shape[1] != row_bytes(self.qtype, self.cols):
            raise UnsupportedModelError(
                f"{type_name(self.qtype)} weight of {self.cols} columns: not whole blocks"
            )
        self.data = self.data.contiguous()

    # the tensor calls a model's loader makes on a weight
    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.data.shape[0], self.cols))

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dim(self) -> int:
        return 2

    def to(self, *args, **kwargs) -> QuantTensor:
        """Itself: a quantized weight keeps its format whatever the compute dtype."""
        return self

    def contiguous(self) -> QuantTensor:
        return self

    def stored(self) -> torch.Tensor:
        """The bytes as the file stores them ([rows, row_bytes]; a copy when packed)."""
        if not self.packed:
            return self.data
        out = torch.empty_like(self.data)
        _lib().q_repack(self.qtype, self.data.data_ptr(), self.data.shape[1],
                        self.data.shape[0], self.cols, 0, out.data_ptr())  # fmt: skip
        return out

    def pack(self) -> None:
        """Rearrange `data` for the packed kernels (Q4_0, Q4_1, Q8_0 with at least 8 rows; a
        no-op otherwise or when already packed)."""
        if self.packed or self.qtype not in PACKED_TYPES or self.data.shape[0] < 8:
            return
        lib = _lib()
        with _pack_lock:
            if self.packed:
                return
            if self.data.numel() >= IN_PLACE_BYTES and _sole_owner(self.data):
                _pack_in_place(lib, self)
                self.packed = True
                return
            out = packed_bytes(self.data.shape)
            lib.q_repack(self.qtype, self.data.data_ptr(), self.data.shape[1],
                            self.data.shape[0], self.cols, 1, out.data_ptr())  # fmt: skip
            self.data, self.packed = out, True

    def __getitem__(self, index) -> QuantTensor:
        """Rows `w[a:b]`, or whole blocks of columns `w[:, a:b]` (a copy, as stored; the whole
        weight: itself)."""
        if isinstance(index, slice):
            if index.indices(self.shape[0]) == (0, self.shape[0], 1):
                return self
            return QuantTensor(self.stored()[index].clone(), self.qtype, self.cols)
        rows, cols = index
        start, stop, step = cols.indices(self.cols)
        if (start, stop, step) == (0, self.cols, 1) and rows == slice(None):
            return self
        _, block, size = TYPES[self.qtype]
        if step != 1 or start % block or stop % block:
            raise UnsupportedModelError(
                f"cannot split a {type_name(self.qtype)} weight at columns {start}:{stop} "
                f"(blocks of {block})"
            )
        data = self.stored()[rows, start // block * size : stop // block * size].clone()
        return QuantTensor(data, self.qtype, stop - start)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.cat:
            dim = (kwargs or {}).get("dim", args[1] if len(args) > 1 else 0)
            if dim == 0:
                return stack_rows(list(args[0]))
        return NotImplemented

    def dequantize(self, portable: bool = False) -> torch.Tensor:
        """The weight in float32 [rows, cols], each value as gguf's reference computes it."""
        out = torch.empty(self.shape, dtype=torch.float32)
        rows = self.data.shape[0]
        lib = _lib(portable)
        rc = lib.q_dequant(self.qtype, int(self.packed), self.data.data_ptr(),
                           self.data.shape[1], rows, self.cols, out.data_ptr())  # fmt: skip
        if rc:
            raise UnsupportedModelError(f"cannot dequantize {type_name(self.qtype)}")
        return out


@dataclass(slots=True, eq=False)
class QuantStack:
    """Weights of different formats stacked by rows (q / k / v of a Q4_K_M file, where v is
    Q6_K): one product per part, each into its columns of one output."""

    parts: list[QuantTensor]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((sum(p.shape[0] for p in self.parts), self.parts[0].cols))

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def dim(self) -> int:
        return 2

    def to(self, *args, **kwargs) -> QuantStack:
        return self

    def contiguous(self) -> QuantStack:
        return self

    def dequantize(self, portable: bool = False) -> torch.Tensor:
        return torch.cat([p.dequantize(portable) for p in self.parts])


Quantized = QuantTensor | QuantStack


def is_quantized(w: object) -> bool:
    return isinstance(w, QuantTensor | QuantStack)


def parts(w: Quantized) -> list[QuantTensor]:
    """A weight's parts by rows: a QuantStack's, or the tensor alone."""
    return w.parts if isinstance(w, QuantStack) else [w]


def int_kernel(w: object) -> bool:
    """Whether `w` is one tensor in a format of the integer kernels (the 32-element formats and
    the K-quants): what C callers of `q_matmul` (the decode chain, MoE experts, MLA) take."""
    return type(w) is QuantTensor and w.qtype in INT_TYPES | K_TYPES


class QProj(ctypes.Structure):
    """csrc/quant.c's struct q_proj (moe.h's moe_proj has its layout): `q_matmul`'s leading
    arguments for one weight."""

    _fields_ = [("t", _I64), ("packed", _I64), ("w", _PTR), ("row_bytes", _I64), ("out", _I64),
                ("cols", _I64)]  # fmt: skip


def q_proj(w: QuantTensor) -> QProj:
    """`w` packed (once), as q_matmul's arguments; its bytes are addressed from then on."""
    w.pack()
    d = w.data
    return QProj(w.qtype, int(w.packed), d.data_ptr(), d.shape[1], d.shape[0], w.cols)


def stack_rows(parts: list) -> QuantTensor | QuantStack:
    """`torch.cat(parts)` by rows: one QuantTensor when all share a format, else a
    QuantStack; a plain tensor among them is kept as F32 rows."""
    flat: list[QuantTensor] = []
    for p in parts:
        if isinstance(p, QuantStack):
            flat += p.parts
        elif isinstance(p, QuantTensor):
            flat.append(p)
        else:
            rows = p.detach().to(torch.float32).contiguous()
            flat.append(QuantTensor(rows.view(torch.uint8).reshape(rows.shape[0], -1), 0,
                                    rows.shape[1]))  # fmt: skip
    if len({p.qtype for p in flat}) == 1:
        return _one_view(flat) or QuantTensor(
            torch.cat([p.stored() for p in flat]), flat[0].qtype, flat[0].cols
        )
    merged: list[QuantTensor] = []  # neighbours of one format joined
    for p in flat:
        if merged and merged[-1].qtype == p.qtype:
            last = merged.pop()
            p = QuantTensor(torch.cat([last.stored(), p.stored()]), p.qtype, p.cols)
        merged.append(p)
    return QuantStack(merged)


def _one_view(parts: list[QuantTensor]) -> QuantTensor | None:
    """Parts of one format that are consecutive rows of one buffer (gguf.py reads a layer's
    q | k | v and gate | up so): all their rows as one view, no copy. None otherwise."""
    first = parts[0].data
    end = first.data_ptr()
    for p in parts:
        d = p.data
        if p.packed or p.cols != parts[0].cols or d.data_ptr() != end:
            return None
        if d.untyped_storage().data_ptr() != first.untyped_storage().data_ptr():
            return None
        end += d.numel()
    rows = sum(p.data.shape[0] for p in parts)
    view = first.as_strided((rows, first.shape[1]), (first.shape[1], 1))
    return QuantTensor(view, parts[0].qtype, parts[0].cols)


INT_TYPES = frozenset({2, 3, 6, 7, 8})  # the 32-element formats: the integer path
K_TYPES = frozenset({12, 13, 14})  # Q4_K, Q5_K, Q6_K: the integer path too (q_uses_int)
PACKED_TYPES = frozenset({2, 3, 8})  # Q4_0, Q4_1, Q8_0: products on packed groups of 8 rows


class _Scratch(threading.local):
    """A grow-only buffer per thread for the quantized inputs of one product."""

    def __init__(self) -> None:
        self.buf = torch.empty(0, dtype=torch.uint8)

    def get(self, nbytes: int) -> int:
        if self.buf.numel() < nbytes:
            self.buf = torch.empty(max(nbytes, 2 * self.buf.numel()), dtype=torch.uint8)
        return self.buf.data_ptr()


_scratch = _Scratch()


def scratch(nbytes: int) -> int:
    """The address of this thread's scratch buffer for products' inputs, `nbytes` or more."""
    return _scratch.get(nbytes)


# the gate activations the product's input stage computes (`swiglu` of linear / q_matmul)
GATES = {"silu": 1, "gelu_pytorch_tanh": 2}


def _gate(gate: torch.Tensor, code: int) -> torch.Tensor:
    """torch's activation for a GATES code (the paths that do not run it in the C)."""
    if code == GATES["gelu_pytorch_tanh"]:
        return torch.nn.functional.gelu(gate, approximate="tanh")
    return torch.nn.functional.silu(gate)


def scratch_bytes(
    qtype: int, rows: int, cols: int, x_bf16: bool, out: int = 0, swiglu: bool | int = False
) -> int:
    """quant.c's q_scratch_bytes, plus `out` floats a row for a bf16 output and `cols`
    floats a row for the SwiGLU input."""
    n = rows * cols
    extra = 4 * rows * out + (4 * n if swiglu else 0)
    if qtype in INT_TYPES or qtype in K_TYPES:  # int16 q, h, l bytes; d, s, integer sums a block
        return 4 * n + 12 * (n // 32) + extra
    return (4 * n if x_bf16 else 0) + extra


_FLOATS = (torch.float32, torch.bfloat16)


def _linear_fast(
    x: torch.Tensor, w: QuantTensor, float_out: bool, swiglu: bool | int = False
) -> torch.Tensor | None:
    """The common call (a 2-D contiguous input of fewer than DENSE_ROWS rows, one weight, no
    bias) with the least Python: a bf16 result comes rounded from the C. None: not that call."""
    rows, cols = x.shape
    if swiglu:
        cols //= 2
    if not rows or rows >= DENSE_ROWS or cols != w.cols or not x.is_contiguous():
        return None
    if rows >= BF16_DENSE_ROWS and w.qtype in BF16_DENSE_TYPES and x.dtype == torch.bfloat16:
        if not float_out and not swiglu and _bf16_dense(w):
            return None  # multiplied as a bf16 copy (linear)
    lib = _libs.get(False) or _lib()
    head = w.head
    if not head or head[2] != w.data.data_ptr():  # a copy of the weight (pickled, ...) checks anew
        w.pack()  # no local holds w.data here: a large lone weight packs in place (_sole_owner)
        d = w.data
        head = w.head = (w.qtype, int(w.packed), d.data_ptr(), d.shape[1], d.shape[0], cols)
    out = head[4]
    bf16 = x.dtype == torch.bfloat16
    y_bf16 = bf16 and not float_out
    y = torch.empty((rows, out), dtype=torch.bfloat16 if y_bf16 else torch.float32)
    scratch = _scratch.get(scratch_bytes(head[0], rows, cols, bf16, out if y_bf16 else 0, swiglu))
    rc = lib.q_matmul(*head, x.data_ptr(), bf16, rows, y.data_ptr(), out, y_bf16, scratch, 0,
                      int(swiglu))  # fmt: skip
    if rc:
        raise UnsupportedModelError(f"no product for {type_name(w.qtype)} weights, {cols} columns")
    return y


# formats whose prefill-sized products of bf16 inputs multiply a bf16 copy of the weight (the
# ones quant.c's products do not pack: their many-row integer products run ~2-4x slower than
# torch's bf16 matmul on a CPU with native bf16 dot products; the packed ones have kernels of
# their own for several rows)
BF16_DENSE_TYPES = frozenset({6, 7, 12, 13, 14})  # Q5_0, Q5_1, Q4_K, Q5_K, Q6_K
BF16_DENSE_ROWS = 64  # from this many input rows (the crossover measured on Gemma 3's weights)
_native_bf16: bool | None = None


def _bf16_dense(w: Quantized) -> bool:
    """Whether a prefill-sized product of bf16 inputs with `w` multiplies its bf16 copy: a CPU
    with native bf16 dot products (AVX-512 BF16 or AMX; else torch's bf16 matmul is several
    times slower than its float32 one) and most of w's rows in BF16_DENSE_TYPES."""
    global _native_bf16
    if _native_bf16 is None:
        _native_bf16 = bool(
            torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        )
    parts = w.parts if isinstance(w, QuantStack) else [w]
    ours = sum(p.shape[0] for p in parts if p.qtype in BF16_DENSE_TYPES and not p.packed)
    return _native_bf16 and 2 * ours > w.shape[0]


class _Bf16Weight(threading.local):
    """A grow-only bf16 buffer per thread for the dequantized weight of one product (reused:
    no fresh pages to fault in on every prefill chunk)."""

    def __init__(self) -> None:
        self.buf = torch.empty(0, dtype=torch.bfloat16)

    def get(self, rows: int, cols: int) -> torch.Tensor:
        if self.buf.numel() < rows * cols:
            self.buf = torch.empty(rows * cols, dtype=torch.bfloat16)
        return self.buf[: rows * cols].view(rows, cols)


_bf16_weight = _Bf16Weight()


def dequantize_bf16(w: Quantized) -> torch.Tensor:
    """`w` in bfloat16 [rows, cols], equal to `w.dequantize().to(torch.bfloat16)`, in this
    thread's reused buffer: valid until the thread's next call. BF16_DENSE_TYPES rows in one C
    pass (csrc/dequant_bf16.c), others through float32."""
    out = _bf16_weight.get(*w.shape)
    lib = _lib()
    at = 0
    for p in w.parts if isinstance(w, QuantStack) else [w]:
        rows = p.shape[0]
        part = out[at : at + rows]
        if p.qtype in BF16_DENSE_TYPES and not p.packed:
            d = p.data
            assert d.stride(1) == 1
            rc = lib.q_dequant_bf16(p.qtype, d.data_ptr(), d.stride(0), rows, p.cols,
                                    part.data_ptr())  # fmt: skip
            if rc:
                raise UnsupportedModelError(f"cannot dequantize {type_name(p.qtype)} to bf16")
        else:
            part.copy_(p.dequantize())
        at += rows
    return out


def linear(
    x: torch.Tensor,
    w: Quantized,
    bias: torch.Tensor | None = None,
    float_out: bool = False,
    threads: int = 0,
    portable: bool = False,
    swiglu: bool | int = False,
) -> torch.Tensor:
    """x [M, in] @ w.T (+ bias) for a quantized w, float32 inside; the result in x's dtype
    (float32 with `float_out`). `threads` 0: torch's thread count (the pool's). From
    DENSE_ROWS rows on, the weight is dequantized and torch multiplies (prefill chunks) in
    float32; bf16 inputs from BF16_DENSE_ROWS rows on with a BF16_DENSE_TYPES weight (a CPU with
    native bf16 dot products): its bf16 copy (`dequantize_bf16`) in torch's bf16 matmul.
    With `swiglu`, x is [M, 2 in] (gate | up) and the product's input `F.silu(gate) * up`,
    computed in the C on the way in (its exp within ~1 ulp of torch's); `swiglu` a GATES code:
    that gate's activation (2: `F.gelu(gate, approximate="tanh") * up`, Gemma's GeGLU)."""
    if bias is None and not threads and not portable and type(w) is QuantTensor:
        if x.dim() == 2 and x.dtype in _FLOATS:
            y = _linear_fast(x, w, float_out, swiglu)
            if y is not None:
                return y
    if x.dtype not in _FLOATS:
        x = x.float()
    if swiglu and (x.shape[-1] != 2 * w.shape[1] or type(w) is not QuantTensor
                   or x.numel() >= DENSE_ROWS * x.shape[-1]):  # fmt: skip
        gate, up = x.chunk(2, dim=-1)
        x, swiglu = _gate(gate, int(swiglu)) * up, False
    x = x.contiguous()
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    rows, cols = x2.shape
    if swiglu:
        cols //= 2
    out = w.shape[0]
    if cols != w.shape[1]:
        raise ValueError(f"input of {cols} features for a weight of {w.shape[1]}")
    bf16_dense = x2.dtype == torch.bfloat16 and not float_out and not swiglu and not portable
    if bf16_dense and rows >= BF16_DENSE_ROWS and threads == 0 and _bf16_dense(w):
        # bf16 inputs, a weight of BF16_DENSE_TYPES: its bf16 copy, torch's bf16 matmul (float32
        # accumulation; the inputs are bf16 already, the weight rounded once to bf16)
        y = torch.nn.functional.linear(x2, dequantize_bf16(w))
        if bias is not None:
            y = (y.float() + bias.float()).to(torch.bfloat16)
        return y.reshape(*lead, out)
    if rows >= DENSE_ROWS and not portable and threads == 0:
        # (else) in float32 whatever x's dtype: the weight dequantizes to float32 anyway, and a CPU
        # without native bf16 dot products (AVX2 only) runs torch's bf16 matmul several times
        # slower than its float32 one
        y = torch.nn.functional.linear(x2.float(), w.dequantize(),
                                       None if bias is None else bias.float())  # fmt: skip
        y = y.reshape(*lead, out)
        return y if float_out or x.dtype == torch.float32 else y.to(x.dtype)
    y = torch.empty(rows, out, dtype=torch.float32)
    if rows:
        lib = _lib(portable)
        bf16 = x2.dtype == torch.bfloat16
        parts = w.parts if isinstance(w, QuantStack) else [w]
        at = 0
        for p in parts:
            p.pack()
            scratch = _scratch.get(max(1, scratch_bytes(p.qtype, rows, cols, bf16, 0, swiglu)))
            rc = lib.q_matmul(
                p.qtype, int(p.packed), p.data.data_ptr(), p.data.shape[1], p.shape[0], cols,
                x2.data_ptr(), int(bf16), rows, y.data_ptr() + 4 * at, out, 0, scratch,
                threads, int(swiglu),
            )  # fmt: skip
            if rc:
                raise UnsupportedModelError(
                    f"no product for {type_name(p.qtype)} weights of {cols} columns"
                )
            at += p.shape[0]
    if bias is not None:
        y += bias.float()
    y = y.reshape(*lead, out)
    return y if float_out or x.dtype == torch.float32 else y.to(x.dtype)


def embedding(ids: torch.Tensor, w: QuantTensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` of a quantized table, dequantized, in `dtype`."""
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= w.shape[0]):
        raise IndexError(f"token id out of range for an embedding of {w.shape[0]} rows")
    out = torch.empty(flat.numel(), w.cols, dtype=torch.float32)
    _lib().q_embedding(w.qtype, int(w.packed), w.data.data_ptr(), w.data.shape[1],
                       w.data.shape[0], w.cols, flat.data_ptr(), flat.numel(),
                       out.data_ptr())  # fmt: skip
    return out.reshape(*ids.shape, w.cols).to(dtype)


# `--quantization` choices: weight-only quantization of a float checkpoint at load
QUANTIZATIONS = {"q8_0": "Q8_0", "q4_0": "Q4_0"}


def quantize(w: torch.Tensor, name: str) -> QuantTensor:
    """`w` [rows, cols] (float) in the GGUF block format `name` ("Q8_0", "Q4_0"), with gguf's
    reference quantizer (the bytes llama.cpp's quantizer writes)."""
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[name]
    stored = quants.quantize(w.detach().to(torch.float32).contiguous().numpy(), qtype)
    data = torch.from_numpy(stored.view("uint8").reshape(w.shape[0], -1).copy())
    return QuantTensor(data, int(qtype), w.shape[1])
