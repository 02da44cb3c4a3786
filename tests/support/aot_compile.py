"""Compile one of runtime.kernels' Triton kernels for a Hopper GPU (sm_90), in this process.

Run by tests/runtime/kernels/test_hopper_compile.py in a fresh interpreter without
``TRITON_INTERPRET``, so the compile never meets what Triton's interpreter patches into
``triton.language`` while it runs:

    python -m tests.support.aot_compile '{"module": "triton.bitmask", "kernel": "_bitmask_kernel",
        "pointers": {...}, "constexprs": {...}}'

Prints one JSON line: ``{"cubin_bytes": N}``.
"""

from __future__ import annotations

import importlib
import json
import sys

HOPPER = ("cuda", 90, 32)


def compile_for_hopper(module: str, kernel: str, pointers: dict, constexprs: dict) -> bytes:
    """The cubin of ``runtime.kernels.<module>.<kernel>``; ``pointers`` maps pointer args to
    element types, the other non-constexpr args are i32 (``scale_log2`` fp32)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(f"runtime.kernels.{module}"), kernel)
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
    return triton.compile(source, target=GPUTarget(*HOPPER)).asm["cubin"]


def main(argv: list[str]) -> int:
    job = json.loads(argv[1])
    cubin = compile_for_hopper(job["module"], job["kernel"], job["pointers"], job["constexprs"])
    print(json.dumps({"cubin_bytes": len(cubin)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
