"""Compile every Triton kernel for a Hopper GPU (sm_90) without one.

The interpreter tests run the kernels' Python semantics with numpy; they cannot see errors that
only the compiler raises (types, layouts, shapes tl.dot refuses). Triton's wheel carries its own
ptxas, so the whole pipeline down to a cubin runs on a CPU-only machine. Each compile runs in a
fresh process. Skipped when triton or its compile API is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO

triton = pytest.importorskip("triton", reason="triton is not installed")
try:
    from triton.backends.compiler import GPUTarget  # noqa: F401
    from triton.compiler import ASTSource  # noqa: F401
except ImportError as exc:  # the compile API moves between triton releases
    pytest.skip(
        f"triton's ahead-of-time compile API is not available: {exc}", allow_module_level=True
    )

pytestmark = pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")


def compile_for_hopper(module: str, kernel: str, pointers: dict, constexprs: dict) -> int:
    """Compile ``runtime.kernels.<module>.<kernel>`` to a cubin in a fresh process (see
    tests/support/aot_compile.py: Triton's interpreter, run by other tests in this process, patches
    ``triton.language``); returns the cubin's size."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SGL_KERNELS")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    job = dict(module=module, kernel=kernel, pointers=pointers, constexprs=constexprs)
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.aot_compile", json.dumps(job)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, f"{kernel} failed to compile for sm_90:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])["cubin_bytes"]


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
        "triton.attention",
        "_decode_split_kernel",
        pointers,
        dict(GROUP=4, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_H=16, BLOCK_D=128, BLOCK_N=32,
             PRECISION=precision, UPCAST=False),
    )  # fmt: skip
    assert compiled > 0
    merge = compile_for_hopper(
        "triton.attention",
        "_decode_merge_kernel",
        {"PartOut": "fp32", "PartLse": "fp32", "Out": dtype},
        dict(HEAD_DIM=128, BLOCK_S=8, BLOCK_D=128),
    )
    assert merge > 0


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_extend_kernel_compiles_for_sm90(dtype):
    pointers = _attention_pointers(
        dtype, ["Q", "K", "V", "PageTable", "PrefixLens", "ExtendLens", "ExtendStarts", "Out"]
    )
    block = 32 if dtype == "fp32" else 64
    compiled = compile_for_hopper(
        "triton.attention",
        "_extend_kernel",
        pointers,
        dict(GROUP=4, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_M=block, BLOCK_D=128, BLOCK_N=block,
             PRECISION="ieee" if dtype == "fp32" else "tf32", UPCAST=False),
    )  # fmt: skip
    assert compiled > 0


@pytest.mark.parametrize("has_rows", [True, False], ids=["row-indices", "all-rows"])
def test_bitmask_kernel_compiles_for_sm90(has_rows):
    compiled = compile_for_hopper(
        "triton.bitmask",
        "_bitmask_kernel",
        {"Logits": "bf16", "Bitmask": "i32", "RowIndices": "i32"},
        dict(HAS_ROWS=has_rows, BLOCK=1024),
    )
    assert compiled > 0


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_latent_decode_kernels_compile_for_sm90(dtype):
    # DeepSeek V3's latent: R = 512 (c) + Dr = 64 (k_rope), 16 heads per program
    pointers = _attention_pointers(
        dtype, ["Q", "Latent", "PageTable", "SeqLens", "PartOut", "PartLse"], ("PartOut", "PartLse")
    )
    compiled = compile_for_hopper(
        "triton.mla",
        "_mla_decode_split_kernel",
        pointers,
        dict(HEADS=128, RANK=512, ROPE_DIM=64, PAGE_SIZE=16, BLOCK_H=16, BLOCK_R=512,
             BLOCK_DR=64, BLOCK_N=16, PRECISION="ieee" if dtype == "fp32" else "tf32",
             UPCAST=False),
    )  # fmt: skip
    assert compiled > 0
    merge = compile_for_hopper(
        "triton.attention",
        "_decode_merge_kernel",
        {"PartOut": "fp32", "PartLse": "fp32", "Out": dtype},
        dict(HEAD_DIM=512, BLOCK_S=8, BLOCK_D=512),
    )
    assert merge > 0
