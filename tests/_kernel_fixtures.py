"""Triton kernels for the kernel tests.

Triton decides once per process whether ``@triton.jit`` functions are interpreted: when it is
imported (its own standard library is decorated then) and again while a kernel runs (it reads
``TRITON_INTERPRET``). So on CPU the whole test process runs with ``TRITON_INTERPRET=1``, set by
conftest.py before anything imports triton, and every test sees the same Triton whatever ran
before it. The ahead-of-time compile for sm_90 needs the opposite, plus a ``triton.language``
the interpreter has never patched, so it runs in a fresh process (``tests/_aot_compile.py``).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

DEVICE = os.environ.get("SGL_KERNEL_TEST_DEVICE", "cpu")


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
