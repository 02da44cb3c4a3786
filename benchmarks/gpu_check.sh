#!/usr/bin/env bash
# GPU check for runtime/kernels: the kernel tests compiled on CUDA (no interpreter),
# then benchmarks/kernels.py's table. Runs the repo from source on the machine's own Python,
# torch and triton; it never installs the repo. Budget: well under 5 minutes on a fresh GPU.
#
#   bash benchmarks/gpu_check.sh            # from anywhere; PYTHON=... picks the interpreter
#
# Wheels for anything the image lacks (e.g. pytest) may be carried in .whl/ at the repo root;
# they are installed into /tmp/site, never into the image.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET SGL_KERNELS
export SGL_KERNEL_TEST_DEVICE=cuda
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], '| torch',
torch.__version__, '| triton', triton.__version__, '| cuda', torch.cuda.is_available())" || exit 1
"$PY" -c "import pytest" || { echo "pytest missing: carry its wheel in .whl/"; exit 1; }

# runtime/__init__.py belongs to the engine and may import packages this image lacks
# (grammar's interegular, lark, ...). The kernels need none of them: if the package import
# fails, register an empty `runtime` package whose path is the real runtime/ folder (so its
# __init__ is skipped and runtime.kernels loads from source), and say so.
pytest_cmd=("$PY" -m pytest)
bench_cmd=("$PY" benchmarks/kernels.py)
if ! err=$("$PY" -c "import runtime.kernels" 2>&1); then
    echo "note: 'import runtime.kernels' failed here (${err##*$'\n'});"
    echo "      loading runtime/kernels without runtime/__init__.py"
    prelude="import sys, types; m = types.ModuleType('runtime'); m.__path__ = ['$PWD/runtime']"
    prelude="$prelude; sys.modules['runtime'] = m"
    pytest_cmd=("$PY" -c "$prelude; import pytest; sys.exit(pytest.main(sys.argv[1:]))")
    bench_cmd=("$PY" -c "$prelude; import runpy; sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')" benchmarks/kernels.py)
fi

status=0
echo "== kernel tests on CUDA (compiled Triton)"
timeout 240 "${pytest_cmd[@]}" -q -p no:cacheprovider -o addopts="" -rs \
    tests/test_kernels_attention.py tests/test_kernels_bitmask.py tests/test_kernels_mla.py \
    || status=1

echo "== benchmark"
timeout 150 "${bench_cmd[@]}" || status=1
exit $status
