"""C source built once per machine into a shared library, and loaded: the compiler lookup, the
cache folder, and the key that ties a build to its source, flags, compiler and CPU.

The sources are `.c` files beside the Python that loads them (a `csrc/` folder), each unit one
`.c` file whose `#include "..."` headers sit in the same folder; a type or variant is chosen with
`-D` flags or an instantiation header, never by editing text. Users: the grammar's first-visit
trie walk (`tokens/native.py`) and the runtime's CPU kernels (`runtime/kernels/cpu/`). It sits
in grammar, the bottom package, because runtime may import grammar and never the reverse; it
knows nothing of grammars.

A library's ctypes signatures are one table beside its loader (`Signatures`), applied here when
it loads. `compile_warnings` compiles units with `-Wall -Wextra -Werror` for CI; a user's
first-use build keeps the units' own flags.

Libraries are built with `-march=native`, so the key includes the CPU's flags: one machine's
build is never loaded on another CPU sharing the cache folder. A build writes to a temporary
name in the cache folder and renames it into place, so processes building at once never load a
half-written file.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grammar import settings

logger = logging.getLogger(__name__)

BUILD_TIMEOUT_S = 120
WARNING_FLAGS = ("-Wall", "-Wextra", "-Werror")
# a library's C functions: name -> (restype, argtypes), as ctypes takes them
Signatures = Mapping[str, tuple[Any, Sequence[Any]]]


class NativeBuildError(RuntimeError):
    """No C compiler was found (a failing compiler raises `subprocess.SubprocessError`)."""


@dataclass(frozen=True, slots=True)
class Unit:
    """One C translation unit: the `.c` file `source`, compiled with `flags` (`-c` and `-o` are
    added). Its `#include "..."` headers are the `.h` files beside it."""

    name: str
    source: Path
    flags: tuple[str, ...]

    def files(self) -> dict[str, str]:
        """What the unit compiles, by file name: its source and every header of its folder."""
        paths = [self.source, *sorted(self.source.parent.glob("*.h"))]
        return {path.name: path.read_text() for path in paths}


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


def _key_parts(unit: Unit, files: Mapping[str, str]) -> list[str]:
    texts = [f"{name}\n{text}" for name, text in sorted(files.items())]
    return [unit.name, unit.source.name, *texts, repr(unit.flags)]


def library_path(
    prefix: str,
    units: Sequence[Unit],
    link_flags: Sequence[str],
    cc: str,
    files: Sequence[Mapping[str, str]] | None = None,
) -> Path:
    """The cache file for these units (`files`: each one's texts, `Unit.files`, read when not
    given) linked with `link_flags` by `cc` on this CPU."""
    files = [unit.files() for unit in units] if files is None else files
    parts = [part for unit, f in zip(units, files, strict=True) for part in _key_parts(unit, f)]
    key = hashlib.sha256("\n".join([*parts, repr(list(link_flags)), cpu_id(), cc]).encode())
    return cache_dir() / f"{prefix}-{key.hexdigest()[:16]}.so"


def _compile(cc: str, unit: Unit, files: Mapping[str, str], folder: Path, extra: Sequence[str] = ()
             ) -> Path:  # fmt: skip
    """`unit` compiled from copies of `files` (the texts its key was made of) written under
    `folder`; its object file."""
    src_dir = folder / unit.name
    src_dir.mkdir()
    for name, text in files.items():
        (src_dir / name).write_text(text)
    obj = folder / f"{unit.name}.o"
    subprocess.run([cc, *unit.flags, *extra, "-c", str(src_dir / unit.source.name), "-o", str(obj)],
                   check=True, capture_output=True, timeout=BUILD_TIMEOUT_S)  # fmt: skip
    return obj


def _build(target: Path, units: Sequence[Unit], link_flags: Sequence[str], cc: str,
           files: Sequence[Mapping[str, str]]) -> None:  # fmt: skip
    with tempfile.TemporaryDirectory(dir=target.parent) as d:
        objects = [str(_compile(cc, u, f, Path(d))) for u, f in zip(units, files, strict=True)]
        tmp = Path(d, "lib.so")
        subprocess.run([cc, "-shared", *objects, *link_flags, "-o", str(tmp)],
                       check=True, capture_output=True, timeout=BUILD_TIMEOUT_S)  # fmt: skip
        os.replace(tmp, target)


def load_library(
    prefix: str,
    units: Sequence[Unit],
    link_flags: Sequence[str] = (),
    signatures: Signatures | None = None,
) -> ctypes.CDLL:
    """The shared library of `units` (each compiled with its flags, then linked `-shared` with
    `link_flags`), built into the cache on first use and loaded, each function named in
    `signatures` given its restype and argtypes.

    Raises `NativeBuildError` when no compiler is found, `subprocess.SubprocessError` when one
    fails, `OSError` when the library cannot be written or loaded, `AttributeError` when a
    function of `signatures` is missing: callers fall back to their Python paths."""
    cc = compiler()
    if cc is None:
        raise NativeBuildError("no C compiler found (set CC, or install cc / gcc)")
    files = [unit.files() for unit in units]
    target = library_path(prefix, units, link_flags, cc, files)
    if not target.exists():
        _build(target, units, link_flags, cc, files)
    lib = ctypes.CDLL(str(target))
    for name, (restype, argtypes) in (signatures or {}).items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, list(argtypes)
    return lib


class OptionalLibrary:
    """A library a Python path can do without: built and loaded on the first `get()`, once; a
    build or load that fails is logged (`fallback` says what runs instead) and not tried again
    until `reset()`. Thread-safe."""

    def __init__(
        self, prefix: str, units: Sequence[Unit], signatures: Signatures, fallback: str
    ) -> None:
        self.prefix, self.units, self.signatures = prefix, units, signatures
        self.fallback = fallback
        self._lib: ctypes.CDLL | None = None
        self._failed = False
        self._lock = threading.Lock()

    def get(self) -> ctypes.CDLL | None:
        with self._lock:
            if self._lib is None and not self._failed:
                try:
                    self._lib = load_library(self.prefix, self.units, signatures=self.signatures)
                except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
                    self._failed = True
                    logger.info("%s unavailable, %s: %s", self.prefix, self.fallback, exc)
            return self._lib

    def reset(self) -> None:
        """Forget the loaded library or the failure (tests that change the compiler)."""
        with self._lock:
            self._lib, self._failed = None, False


def compile_warnings(units: Sequence[Unit], extra: Sequence[str] = WARNING_FLAGS) -> dict[str, str]:
    """Compile each unit with its flags plus `extra` (warnings as errors), the objects thrown
    away: the compiler's messages of each unit that failed, by unit name ({} when all are
    clean). Raises `NativeBuildError` when no compiler is found."""
    cc = compiler()
    if cc is None:
        raise NativeBuildError("no C compiler found (set CC, or install cc / gcc)")

    def one(unit: Unit) -> tuple[str, str]:
        with tempfile.TemporaryDirectory() as d:
            try:
                _compile(cc, unit, unit.files(), Path(d), extra)
            except subprocess.CalledProcessError as exc:
                return unit.name, exc.stderr.decode(errors="replace")
        return unit.name, ""

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return {name: err for name, err in pool.map(one, units) if err}
