"""The JSONSchemaBench sample (shared data): its folder, its cases, and fixed slices of it."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import shared_dir


def _bench_dir() -> Path:
    """The JSONSchemaBench sample: $SGL_JSONSCHEMABENCH, else shared_dir()/data/jsonschemabench."""
    if os.environ.get("SGL_JSONSCHEMABENCH"):
        return Path(os.environ["SGL_JSONSCHEMABENCH"])
    return shared_dir() / "data" / "jsonschemabench"


BENCH_DIR = _bench_dir()
NO_BENCH = f"JSONSchemaBench sample not found at {BENCH_DIR} (set SGL_SHARED_DIR)"


@dataclass(slots=True)
class BenchCase:
    name: str
    schema: Any
    tests: list[tuple[Any, bool]]  # (instance, valid)


def bench_files() -> list[str]:
    return sorted(glob.glob(str(BENCH_DIR / "*.json")))


def load_case(path: str) -> BenchCase:
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    return BenchCase(Path(path).stem, d["schema"], [(t["data"], t["valid"]) for t in d["tests"]])


def fixed_slice(n: int, files: list[str] | None = None) -> list[str]:
    """n files spread evenly over the sorted suite (every category is represented)."""
    files = files or bench_files()
    step = max(1, len(files) // n)
    return files[::step][:n]
