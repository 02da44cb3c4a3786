"""C source built once per machine into a shared library, and loaded: the compiler lookup, the
cache folder, and the key that ties a build to its source, flags, compiler and CPU.

Two users: the grammar's first-visit trie walk (`tokens/native.py`) and the runtime's fused CPU
kernels (`runtime/kernels/cpu_fused.py`). It sits in grammar, the bottom package, because
runtime may import grammar and never the reverse; it knows nothing of grammars.

Libraries are built with `-march=native`, so the key includes the CPU's flags: one machine's
build is never loaded on another CPU sharing the cache folder. A build writes to a temporary
name in the cache folder and renames it into place, so processes building at once never load a
half-written file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grammar import settings

BUILD_TIMEOUT_S = 120


class NativeBuildError(RuntimeError):
    """No C compiler was found (a failing compiler raises `subprocess.SubprocessError`)."""


@dataclass(frozen=True, slots=True)
class Unit:
    """One C translation unit and the flags it compiles with (`-c` and `-o` are added)."""

    name: str
    source: str
    flags: tuple[str, ...]


def compiler() -> str | None:
    """The C compiler: $CC, else `cc`, else `gcc` on the PATH (None: none found)."""
    return settings.CC.get() or shutil.which("cc") or shutil.which("gcc")


def cache_dir() -> Path:
    """Where compiled libraries are kept: $SGL_NATIVE_CACHE, default ~/.cache/sgl-native
    (created)."""
    cache = settings.NATIVE_CACHE.get()
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def cpu_id() -> str:
    """What a library's cache key needs of this CPU: its flags line."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        return next((ln for ln in text.splitlines() if ln.startswith("flags")), text[:4000])
    except OSError:
        return platform.processor()


def library_path(prefix: str, units: Sequence[Unit], link_flags: Sequence[str], cc: str) -> Path:
    """The cache file for these units linked with `link_flags` by `cc` on this CPU."""
    parts = [u.name + "\n" + u.source + "\n" + repr(u.flags) for u in units]
    key = hashlib.sha256("\n".join([*parts, repr(list(link_flags)), cpu_id(), cc]).encode())
    return cache_dir() / f"{prefix}-{key.hexdigest()[:16]}.so"


def _build(target: Path, units: Sequence[Unit], link_flags: Sequence[str], cc: str) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as d:
        objects = []
        for unit in units:
            src, obj = Path(d, f"{unit.name}.c"), Path(d, f"{unit.name}.o")
            src.write_text(unit.source)
            subprocess.run([cc, *unit.flags, "-c", str(src), "-o", str(obj)],
                           check=True, capture_output=True, timeout=BUILD_TIMEOUT_S)  # fmt: skip
            objects.append(str(obj))
        tmp = Path(d, "lib.so")
        subprocess.run([cc, "-shared", *objects, *link_flags, "-o", str(tmp)],
                       check=True, capture_output=True, timeout=BUILD_TIMEOUT_S)  # fmt: skip
        os.replace(tmp, target)


def load_library(prefix: str, units: Sequence[Unit], link_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """The shared library of `units` (each compiled with its flags, then linked `-shared` with
    `link_flags`), built into the cache on first use and loaded.

    Raises `NativeBuildError` when no compiler is found, `subprocess.SubprocessError` when one
    fails, `OSError` when the library cannot be written or loaded: callers fall back to their
    Python paths."""
    cc = compiler()
    if cc is None:
        raise NativeBuildError("no C compiler found (set CC, or install cc / gcc)")
    target = library_path(prefix, units, link_flags, cc)
    if not target.exists():
        _build(target, units, link_flags, cc)
    return ctypes.CDLL(str(target))
