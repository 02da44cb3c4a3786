"""A GGUF file's tokenizer, converted from its metadata once and kept as `tokenizer.json`.

A GGUF carries its vocabulary as metadata; transformers' GGUF converters rebuild a `tokenizers`
backend from it (for Gemma 3's 262,144 tokens, merges recovered from the vocabulary: ~340 MB of
temporaries), and `PreTrainedTokenizerFast(tokenizer_object=)` deep-copies that backend. At an
engine's start this used to set the process's peak resident memory.

Here the converted backend is written to the cache, `$SGL_DSL_CACHE_DIR/tokenizers/<key>/`:
`tokenizer.json` plus `wrapper.json` (the keyword arguments the wrapper takes: special tokens,
`add_bos_token`, the chat template). `<key>` is a hash of the file's header (its metadata and
tensor table) and the converter's versions, so a copied or renamed file finds its entry and a
changed one gets a new entry. Every load reads the entry with `tokenizer_file=` (no conversion,
no copy): the same backend JSON and the same keyword arguments as the converted wrapper.

The first load of a vocabulary of `CHILD_TOKENS` tokens or more converts in a child process, so
that even the first start of a large vocabulary never holds the converter's temporaries; a
smaller one, or where the child fails, converts in this process. Where the cache cannot be
written the tokenizer is converted and wrapped as it always was.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CHILD_TOKENS = 100_000  # vocabularies this large convert in a child process on first use
FORMAT = 1  # bumped when what an entry holds changes
_CHILD_TIMEOUT_S = 900
# the child loads this file alone (not the runtime package: no torch, no engine imports)
_CHILD = (
    "import sys, importlib.util as u; from pathlib import Path; "
    "s = u.spec_from_file_location('gguf_tokenizer_child', sys.argv[1]); "
    "m = u.module_from_spec(s); s.loader.exec_module(m); "
    "m.write_entry(Path(sys.argv[2]), Path(sys.argv[3]))"
)


def _versions() -> str:
    found = []
    for package in ("transformers", "tokenizers"):
        try:
            found.append(f"{package}={version(package)}")
        except PackageNotFoundError:
            found.append(f"{package}=?")
    return ";".join(found)


def cache_key(path: Path, header_bytes: int) -> str:
    """A hash of the file's first `header_bytes` (metadata and tensor table), the converter's
    versions and this module's FORMAT."""
    digest = hashlib.sha256(f"{FORMAT};{_versions()};".encode())
    with open(path, "rb") as f:
        left = header_bytes
        while left > 0:
            chunk = f.read(min(left, 1 << 22))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()[:32]


def entry_dir(path: Path, header_bytes: int) -> Path:
    from runtime import settings  # here: the child process loads this file on its own

    return settings.CACHE_DIR.get() / "tokenizers" / cache_key(path, header_bytes)


def convert(path: Path) -> tuple[Any, dict[str, Any]]:
    """(the `tokenizers` backend, the wrapper's keyword arguments) transformers' GGUF converters
    build from the file's metadata."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        convert_gguf_tokenizer,
        get_gguf_tokenizer,
    )

    arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(path))
    backend, extra = convert_gguf_tokenizer(arch, tokenizer_dict)
    return backend, {**tokenizer_config, **extra}


def write_entry(path: Path, entry: Path) -> None:
    """Convert `path`'s tokenizer into the folder `entry` (written beside it and renamed into
    place, so a reader never sees half an entry; a second writer's entry is as good)."""
    backend, kwargs = convert(path)
    text = json.dumps(kwargs)  # a TypeError here: the arguments cannot be kept, nothing written
    entry.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        backend.save(str(work / "tokenizer.json"))
        del backend
        (work / "wrapper.json").write_text(text)
        try:
            os.replace(work, entry)
        except OSError:
            if not (entry / "wrapper.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_in_child(path: Path, entry: Path) -> bool:
    command = [sys.executable, "-c", _CHILD, str(Path(__file__).resolve()), str(path), str(entry)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_CHILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("converting %s's tokenizer in a child process failed (%s)", path, exc)
        return False
    if done.returncode != 0:
        logger.warning("converting %s's tokenizer in a child process failed (exit %d): %s",
                       path, done.returncode, done.stderr[-2000:])  # fmt: skip
        return False
    return (entry / "wrapper.json").is_file()


def read_entry(entry: Path) -> Any:
    """The wrapper of a cached entry: `PreTrainedTokenizerFast(tokenizer_file=, **kwargs)`."""
    from transformers import PreTrainedTokenizerFast

    kwargs = json.loads((entry / "wrapper.json").read_text())
    return PreTrainedTokenizerFast(tokenizer_file=str(entry / "tokenizer.json"), **kwargs)


def cached_tokenizer(path: Path, header_bytes: int, tokens: int) -> Any:
    """The tokenizer of the GGUF at `path` (`header_bytes`: where its tensor data starts;
    `tokens`: its vocabulary's size), from the cache, converted into it on first use; the heap
    its reading freed is given back (`give_back_freed_heap`)."""
    try:
        return _cached_tokenizer(path, header_bytes, tokens)
    finally:
        give_back_freed_heap()


def give_back_freed_heap() -> None:
    """Return the C heap's free pages to the system (glibc's `malloc_trim`; nothing where the C
    library has none). Reading a large tokenizer frees most of what it allocated but glibc keeps
    those pages: for Gemma 3's 262,144 tokens and 514,906 merges ~290 MB stay resident after
    `tokenizer.json` is read, ~65 MB are the tokenizer."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)


def _cached_tokenizer(path: Path, header_bytes: int, tokens: int) -> Any:
    entry = entry_dir(path, header_bytes)
    if not (entry / "wrapper.json").is_file():
        written = tokens >= CHILD_TOKENS and _write_in_child(path, entry)
        if not written:
            try:
                write_entry(path, entry)
            except (OSError, TypeError) as exc:
                logger.warning("cannot cache %s's tokenizer in %s (%s); converting it in memory",
                               path, entry, exc)  # fmt: skip
                return _wrapped(path)
    try:
        return read_entry(entry)
    except Exception as exc:  # a damaged entry (tokenizers raises plain Exception): again
        logger.warning("cached tokenizer %s is unreadable (%s); converting %s again",
                       entry, exc, path)  # fmt: skip
        shutil.rmtree(entry, ignore_errors=True)
        return _wrapped(path)


def _wrapped(path: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    backend, kwargs = convert(path)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
