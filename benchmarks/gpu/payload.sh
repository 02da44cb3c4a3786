#!/usr/bin/env bash
# What benchmarks/gpu_check.sh needs on a GPU machine that can reach no network, in .gpu/
# (ignored by .gitignore: it travels only where `carry` names it): run here, in the checkout the device tool sends, with
# the project's .venv and a package index in reach.
#
#   wheels/      the packages the GPU image lacks that the engine imports, for its Python 3.12
#                (versions from requirements.lock)
#   tokenizer/   SmolLM2's tokenizer (the tiny models of part 1 use it; no GGUF needed there)
#   gguf.a, gguf.b, gguf.sha256
#                the default model's GGUF (98 MB) in two halves: one call carries at most
#                64 MiB, so part 1 carries gguf.a and part 2 gguf.b (gpu_check.sh joins them)
#
#   bash benchmarks/gpu/payload.sh && du -sh .gpu/*
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p .gpu/wheels
# imported by runtime (grammar's automata and schemas) or by transformers' GGUF reader
packages=(interegular jsonschema jsonschema-specifications referencing rpds-py jsonpointer lark gguf)
pins=()
for p in "${packages[@]}"; do
    pin=$(grep -i "^${p}==" requirements.lock || true)
    pins+=("${pin:-$p}")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu/wheels "${pins[@]}"
"$PY" - <<'EOF'
import hashlib
from pathlib import Path

from runtime.default_model import default_gguf_path
from runtime.models.gguf import load_tokenizer

gguf = default_gguf_path()
load_tokenizer(gguf).save_pretrained(".gpu/tokenizer")
data = gguf.read_bytes()
half = len(data) // 2
Path(".gpu/gguf.a").write_bytes(data[:half])
Path(".gpu/gguf.b").write_bytes(data[half:])
digest = hashlib.sha256(data).hexdigest()
Path(".gpu/gguf.sha256").write_text(f"{digest}  {gguf.name}\n")
print(f"{gguf.name}: {len(data)} bytes, sha256 {digest[:16]}..., halves of {half} bytes")
EOF
du -sh .gpu/wheels .gpu/tokenizer .gpu/gguf.a .gpu/gguf.b
