"""Compile every Triton kernel for a Hopper GPU (sm_90) without one.

The interpreter tests run the kernels' Python semantics with numpy; they cannot see errors that
only the compiler raises (types, layouts, shapes tl.dot refuses). Triton's wheel carries its own
ptxas, so the whole pipeline down to a cubin runs on a CPU-only machine. Skipped when triton or
its compile API is missing.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed")
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction
except ImportError as exc:  # the compile API moves between triton releases
    pytest.skip(
        f"triton's ahead-of-time compile API is not available: {exc}", allow_module_level=True
    )

from runtime.kernels import triton_attention, triton_bitmask  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
pytestmark = pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")


def compile_for_hopper(kernel, pointers: dict[str, str], constexprs: dict[str, object]):
    """Compile ``kernel`` to a cubin; ``pointers`` maps pointer args to element types."""
    # a fresh JITFunction: the module's kernels may have been decorated for the interpreter
    fn = JITFunction(kernel.fn)
    signature = {}
    for param in fn.params:
        if param.is_constexpr:
            signature[param.name] = "constexpr"
        elif param.name in pointers:
            signature[param.name] = "*" + pointers[param.name]
        elif param.name == "scale_log2":
            signature[param.name] = "fp32"
        else:
            signature[param.name] = "i32"
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=HOPPER)


def _attention_pointers(dtype: str, names: list[str], fp32: tuple[str, ...] = ()) -> dict:
    ints = ("PageTable", "SeqLens", "PrefixLens", "ExtendLens", "ExtendStarts")
    return {n: "i32" if n in ints else "fp32" if n in fp32 else dtype for n in names}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_decode_kernels_compile_for_sm90(dtype):
    pointers = _attention_pointers(
        dtype, ["Q", "K", "V", "PageTable", "SeqLens", "PartOut", "PartLse"], ("PartOut", "PartLse")
    )
    precision = "ieee" if dtype == "fp32" else "tf32"
    compiled = compile_for_hopper(
        triton_attention._decode_split_kernel,
        pointers,
        dict(GROUP=4, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_H=16, BLOCK_D=128, BLOCK_N=32,
             PRECISION=precision, UPCAST=False),
    )  # fmt: skip
    assert compiled.asm["cubin"]
    merge = compile_for_hopper(
        triton_attention._decode_merge_kernel,
        {"PartOut": "fp32", "PartLse": "fp32", "Out": dtype},
        dict(HEAD_DIM=128, BLOCK_S=8, BLOCK_D=128),
    )
    assert merge.asm["cubin"]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_extend_kernel_compiles_for_sm90(dtype):
    pointers = _attention_pointers(
        dtype, ["Q", "K", "V", "PageTable", "PrefixLens", "ExtendLens", "ExtendStarts", "Out"]
    )
    block = 32 if dtype == "fp32" else 64
    compiled = compile_for_hopper(
        triton_attention._extend_kernel,
        pointers,
        dict(GROUP=4, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_M=block, BLOCK_D=128, BLOCK_N=block,
             PRECISION="ieee" if dtype == "fp32" else "tf32", UPCAST=False),
    )  # fmt: skip
    assert compiled.asm["cubin"]


@pytest.mark.parametrize("has_rows", [True, False], ids=["row-indices", "all-rows"])
def test_bitmask_kernel_compiles_for_sm90(has_rows):
    compiled = compile_for_hopper(
        triton_bitmask._bitmask_kernel,
        {"Logits": "bf16", "Bitmask": "i32", "RowIndices": "i32"},
        dict(HAS_ROWS=has_rows, BLOCK=1024),
    )
    assert compiled.asm["cubin"]
