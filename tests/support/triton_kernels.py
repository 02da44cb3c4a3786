"""Triton kernels for the kernel tests.

Triton decides once per process whether ``@triton.jit`` functions are interpreted: when it is
imported (its own standard library is decorated then) and again while a kernel runs (it reads
``TRITON_INTERPRET``). So on CPU the whole test process runs with ``TRITON_INTERPRET=1``, set by
conftest.py before anything imports triton, and every test sees the same Triton whatever ran
before it. The ahead-of-time compile for sm_90 needs the opposite, plus a ``triton.language``
the interpreter has never patched, so it runs in a fresh process (``tests/support/aot_compile.py``).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import torch

DEVICE = os.environ.get("SGL_KERNEL_TEST_DEVICE", "cpu")
# kernel vs reference tolerances (elementwise atol / rtol), outputs of magnitude ~1; the reasons
# are in tests/runtime/kernels/test_attention.py's docstring
TOL = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.float16: {"atol": 5e-3, "rtol": 5e-3},
    torch.bfloat16: {"atol": 4e-2, "rtol": 2e-2},
}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def interpreter_env(environ: os._Environ | dict) -> None:
    """The test session's Triton setting (called by conftest.py before any import of triton)."""
    if DEVICE == "cpu":
        environ["TRITON_INTERPRET"] = "1"
    else:
        environ.pop("TRITON_INTERPRET", None)


def triton_kernels(name: str) -> tuple[ModuleType | None, str]:
    """(``runtime.kernels.<name>``, "") or (None, why its Triton kernels cannot run here)."""
    try:
        import triton

        module = importlib.import_module(f"runtime.kernels.{name}")
    except Exception as exc:  # no triton, or triton without a usable backend
        return None, f"triton unusable here: {exc!r}"
    if DEVICE == "cpu" and not triton.knobs.runtime.interpret:
        return None, "triton was imported before TRITON_INTERPRET=1 was set (see conftest.py)"
    return module, ""
