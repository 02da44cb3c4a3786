"""The few-row CPU projection kernel (runtime/kernels/cpu/gemv.py): its products against float64
and torch's, the same bits on one thread or two and from its portable build, where `Packed`
uses it, and a model's batch-1 decode with it against the same model without it."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch

from runtime.kernels.cpu import fused as cpu_fused
from runtime.kernels.cpu import gemv as cpu_gemv
from runtime.models.layers import GEMV_ROWS, Packed, gemv_enabled
from runtime.models.loader import load_model_files
from runtime.models.registry import model_class
from runtime.scheduling.sampling import greedy_tokens
from tests.support.forward_batches import decode_run
from tests.support.tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(
    not cpu_fused.available(torch.float32), reason="no C compiler: the torch ops run instead"
)

# SmolLM2's projections (qkv, o, gate_up, down, the LM head) and small odd ones
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576), (16, 2), (48, 70)]


def _rand(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize(("out", "n"), SHAPES)
def test_float32_products_are_within_rounding_of_float64(out, n):
    w, x = _rand(out, n, dtype=torch.float32, seed=1), _rand(1, n, dtype=torch.float32, seed=2)
    got = cpu_fused.gemv(cpu_gemv.pack(w), x, out)
    want = x.double() @ w.double().T
    scale = (x.double().abs() @ w.double().abs().T).max().item()
    assert got.shape == (1, out) and got.dtype == torch.float32
    assert (got.double() - want).abs().max().item() <= 1e-6 * scale


@pytest.mark.parametrize(("out", "n"), SHAPES)
def test_bfloat16_products_round_like_torch(out, n):
    w, x = _rand(out, n, dtype=torch.bfloat16, seed=3), _rand(1, n, dtype=torch.bfloat16, seed=4)
    got = cpu_fused.gemv(cpu_gemv.pack(w), x, out)
    exact = (x.double() @ w.double().T).float()
    assert got.dtype == torch.bfloat16
    # the float32 sum (n roundings of at most 2^-24 of the running magnitude) is rounded once
    # to bfloat16 (2^-8 relative, round to nearest)
    sums = (x.double().abs() @ w.double().abs().T).float()
    bound = (exact.abs() + n * 2**-24 * sums) * 2**-8 + n * 2**-24 * sums
    assert ((got.float() - exact).abs() <= bound).all()
    same = (got == torch.nn.functional.linear(x, w)).float().mean().item()
    assert same >= 0.99  # torch sums in another order: a rare last-bit difference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_thread_or_two_give_the_same_bits(dtype):
    before = torch.get_num_threads()
    w, x = _rand(3072, 576, dtype=dtype, seed=5), _rand(1, 576, dtype=dtype, seed=6)
    packed = cpu_gemv.pack(w)
    try:
        torch.set_num_threads(1)
        one = cpu_fused.gemv(packed, x, 3072)
        torch.set_num_threads(2)
        two = cpu_fused.gemv(packed, x, 3072)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def _avx512_bf16() -> bool:
    try:
        return "avx512_bf16" in open("/proc/cpuinfo").read()
    except OSError:
        return False


@pytest.mark.skipif(not _avx512_bf16(), reason="the CPU has no AVX-512 BF16 to compare with")
def test_the_portable_bfloat16_build_gives_the_vector_build_bits(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src, lib = cpu_gemv.SOURCE, tmp_path / "gemv.so"
    subprocess.run([cc, "-O2", "-march=native", "-mno-avx512bf16", "-fPIC", "-shared",
                    str(src), "-o", str(lib)], check=True, capture_output=True)  # fmt: skip
    portable = ctypes.CDLL(str(lib)).gemv_bf16
    portable.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3
    # 70 / 2 = 35 pairs: a tail past k mod 4; 6 rows: one block of 4 rows, then 2 alone
    for out, n, m in [(960, 576, 1), (48, 70, 1), (16, 6, 1), (48, 70, 6), (960, 576, 4)]:
        w, x = (
            _rand(out, n, dtype=torch.bfloat16, seed=7),
            _rand(m, n, dtype=torch.bfloat16, seed=8),
        )
        packed = cpu_gemv.pack(w)
        y = torch.empty(m, out, dtype=torch.bfloat16)
        portable(packed.data_ptr(), x.data_ptr(), y.data_ptr(), out, n, m)
        assert torch.equal(y, cpu_fused.gemv(packed, x, out))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_uses_the_kernel_for_a_few_rows_only(dtype, monkeypatch):
    w = _rand(64, 32, dtype=dtype, seed=9)
    odd = _rand(20, 32, dtype=dtype, seed=10)  # 20 rows: not a multiple of 16
    bias = _rand(64, dtype=dtype, seed=11)
    mm = Packed([w, odd], enabled=False, gemv=True).linear
    calls = []
    real = cpu_fused.gemv
    monkeypatch.setattr(
        cpu_fused, "gemv", lambda *a, **k: calls.append(a[1].shape[0]) or real(*a, **k)
    )
    one, few = _rand(1, 32, dtype=dtype, seed=12), _rand(GEMV_ROWS, 32, dtype=dtype, seed=13)
    more = _rand(GEMV_ROWS + 1, 32, dtype=dtype, seed=14)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(mm(one, w), torch.nn.functional.linear(one, w), **tol)
    torch.testing.assert_close(mm(few, w), torch.nn.functional.linear(few, w), **tol)
    assert calls == [1, GEMV_ROWS]
    for got, want in [
        (mm(more, w), torch.nn.functional.linear(more, w)),  # more rows: torch
        (mm(one, w, bias), torch.nn.functional.linear(one, w, bias)),  # a bias: torch
        (mm(one, odd), torch.nn.functional.linear(one, odd)),  # not packable: torch
    ]:
        assert torch.equal(got, want)
    assert calls == [1, GEMV_ROWS]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("wide", [False, True])
def test_each_row_gets_the_bits_it_gets_alone(dtype, wide):
    w = _rand(960, 576, dtype=dtype, seed=15)
    packed = cpu_gemv.pack(w)
    for m in range(2, cpu_gemv.MAX_ROWS + 1):  # blocks of 4 rows, and the rows past them
        x = _rand(m, 576 if m % 2 else 70, dtype=dtype, seed=16 + m)
        if x.shape[1] != w.shape[1]:
            w = _rand(960, x.shape[1], dtype=dtype, seed=15)
            packed = cpu_gemv.pack(w)
        together = cpu_fused.gemv(packed, x, 960, wide=wide)
        alone = torch.cat([cpu_fused.gemv(packed, x[i : i + 1], 960, wide=wide) for i in range(m)])
        assert together.shape == (m, 960) and torch.equal(together, alone)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("SGL_CPU_GEMV", "0")
    assert not gemv_enabled(torch.float32, torch.device("cpu"))
    monkeypatch.setenv("SGL_CPU_GEMV", "1")
    assert gemv_enabled(torch.bfloat16, torch.device("cpu"))
    assert not gemv_enabled(torch.float32, torch.device("meta"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("requests", [1, 3])
def test_decode_with_the_kernel_matches_without(tmp_path, monkeypatch, dtype, requests):
    loaded = load_model_files(make_tiny_model(tmp_path, "llama"))
    models = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("SGL_CPU_GEMV", flag)
        models[flag] = model_class(loaded.config)(loaded.config, loaded.state_dict, dtype)
    calls = []
    real = cpu_fused.gemv
    monkeypatch.setattr(cpu_fused, "gemv", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    prompt = [[5, 17, 300, 42, 9, 11], [7, 2, 99], [400, 3, 3, 8, 1]][:requests]
    with_tokens, with_logits = decode_run(models["1"], dtype, prompt, steps=12)
    assert calls, "the batch-1 decode never reached the kernel"
    n = len(calls)
    without_tokens, without_logits = decode_run(models["0"], dtype, prompt, steps=12)
    assert len(calls) == n  # the model loaded with SGL_CPU_GEMV=0 never calls it
    assert torch.equal(with_tokens, without_tokens)
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    assert (with_logits - without_logits).abs().max().item() < tolerance


def test_pack_all_gives_each_weight_its_packed_copy_aligned():
    ws = [_rand(o, n, dtype=torch.bfloat16, seed=20 + i) for i, (o, n) in enumerate(SHAPES[:4])]
    ws.append(_rand(16, 6, dtype=torch.bfloat16, seed=30))  # 96 elements: the next one realigns
    ws.append(_rand(32, 8, dtype=torch.bfloat16, seed=31))
    for w, p in zip(ws, cpu_gemv.pack_all(ws), strict=True):
        assert torch.equal(p, cpu_gemv.pack(w)) and p.data_ptr() % 64 == 0
    mixed = [ws[0], ws[1].float()]  # two dtypes: packed one by one
    assert all(
        torch.equal(p, cpu_gemv.pack(w))
        for w, p in zip(mixed, cpu_gemv.pack_all(mixed), strict=True)
    )


def _gemv_two_threads(packed: torch.Tensor, x: torch.Tensor, out: int) -> torch.Tensor:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return cpu_fused.gemv(packed, x, out)
    finally:
        torch.set_num_threads(before)


def test_callers_on_several_threads_each_get_their_own_product():
    import threading

    cases = [(_rand(3072, 576, dtype=torch.bfloat16, seed=40 + i),
              _rand(1, 576, dtype=torch.bfloat16, seed=50 + i)) for i in range(4)]  # fmt: skip
    packed = [cpu_gemv.pack(w) for w, _ in cases]
    want = [cpu_fused.gemv(p, x, 3072) for p, (_, x) in zip(packed, cases, strict=True)]
    got: dict[int, list[torch.Tensor]] = {i: [] for i in range(4)}

    def work(i: int) -> None:  # the pool takes one caller at a time; the others run alone
        for _ in range(50):
            got[i].append(_gemv_two_threads(packed[i], cases[i][1], 3072))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    for i in range(4):
        assert len(got[i]) == 50 and all(torch.equal(g, want[i]) for g in got[i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_products_on_the_quantized_kernels_pool_give_the_same_bits(dtype):
    """run_attention_on moves the products onto another library's pool with decode attention
    (one set of spinning workers per step); every block and row is still computed once."""
    from runtime.kernels.cpu import quant as cpu_quant

    if cpu_quant.library() is None:
        pytest.skip("the quantized kernels are not built")
    w, x = _rand(3072, 576, dtype=dtype, seed=62), _rand(16, 576, dtype=dtype, seed=63)
    packed = cpu_gemv.pack(w)
    q_pool = cpu_quant.pool_runner()
    try:
        cpu_fused.run_attention_on(None)
        own = _gemv_two_threads(packed, x, 3072)
        cpu_fused.run_attention_on(q_pool)
        other = _gemv_two_threads(packed, x, 3072)
    finally:
        cpu_fused.run_attention_on(q_pool)  # as the quantized library's load leaves it
    alone = torch.cat([cpu_fused.gemv(packed, x[i : i + 1], 3072) for i in range(16)])
    assert torch.equal(own, alone) and torch.equal(other, alone)
    torch.testing.assert_close(
        other.float(), torch.nn.functional.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2
    )


def _child(packed, x, conn) -> None:
    conn.send(_gemv_two_threads(packed, x, 3072).tolist())  # a list: no shared memory


def test_a_forked_child_starts_its_own_workers():
    import multiprocessing as mp

    w, x = (
        _rand(3072, 576, dtype=torch.float32, seed=60),
        _rand(1, 576, dtype=torch.float32, seed=61),
    )
    packed = cpu_gemv.pack(w)
    want = _gemv_two_threads(packed, x, 3072)  # the parent's workers exist now
    parent, child = mp.get_context("fork").Pipe(duplex=False)
    p = mp.get_context("fork").Process(target=_child, args=(packed, x, child))
    p.start()
    assert parent.poll(60), "the forked child's product never came (waiting on missing workers?)"
    got = parent.recv()
    p.join(10)
    assert got == want.tolist()


def test_the_wide_bfloat16_product_is_the_product_widened():
    w, x = (
        _rand(49152, 576, dtype=torch.bfloat16, seed=70),
        _rand(1, 576, dtype=torch.bfloat16, seed=71),
    )
    packed = cpu_gemv.pack(w)
    wide = cpu_fused.gemv(packed, x, 49152, wide=True)
    assert wide.dtype == torch.float32
    assert torch.equal(wide, cpu_fused.gemv(packed, x, 49152).float())
    mm = Packed([w], enabled=False, gemv=True).linear
    assert torch.equal(mm(x, w, float_out=True), wide)
    more = _rand(GEMV_ROWS + 1, 576, dtype=torch.bfloat16, seed=72)  # torch, then .float()
    assert torch.equal(mm(more, w, float_out=True), torch.nn.functional.linear(more, w).float())


@pytest.mark.parametrize(
    "row",
    [
        pytest.param([0.5, 3.0, -1.0, 3.0], id="tie-first-index"),
        pytest.param([float("-inf")] * 5, id="all-minus-inf"),
        pytest.param([1.0, float("nan"), 7.0, float("nan")], id="nan-first"),
        pytest.param([2.0], id="one"),
        pytest.param(
            torch.randn(49152, generator=torch.Generator().manual_seed(3)).tolist(), id="vocab"
        ),  # fmt: skip
    ],
)
def test_argmax_of_one_row_is_torchs(row):
    logits = torch.tensor([row], dtype=torch.float32)
    assert torch.equal(cpu_fused.argmax_row(logits), logits.argmax(dim=-1))
    assert torch.equal(greedy_tokens(logits), logits.argmax(dim=-1))  # the sampler's one row


# a child process on torch's 2 threads with the fused kernels built; `n()` counts its threads
_OPENMP_CHILD = (
    "import os, time, torch\n"
    "from runtime.kernels.cpu import fused as cpu_fused\n"
    "torch.set_num_threads(2)\n"
    "assert cpu_fused.available(torch.float32)\n"
    "n = lambda: len(os.listdir('/proc/self/task'))\n"
)


def _openmp_child(code: str) -> list[str]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _OPENMP_CHILD + code], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_thread_that_loaded_a_model_gives_back_its_openmp_team():
    freed, gone, again, change = _openmp_child(
        "torch.ones(1 << 22).add_(1)\n"  # a parallel op: this thread's team starts
        "before = n()\n"
        "freed = cpu_fused.release_openmp_team()\n"
        # a worker's exit shows in /proc a moment later on a busy machine
        "deadline = time.monotonic() + 2\n"
        "while n() >= before and time.monotonic() < deadline: time.sleep(0.01)\n"
        "after = n()\n"
        "print(freed, before - after, cpu_fused.release_openmp_team(), n() - after)\n"
    )
    assert freed == "True" and int(gone) >= 1  # the team's worker thread exited
    assert again == "True" and change == "0"  # no team left: a second call changes nothing


def test_a_held_openmp_team_keeps_its_workers_across_regions():
    size, grown, again, total = _openmp_child(
        "cpu_fused.release_openmp_team()\n"
        "before = n()\n"
        "size = cpu_fused.hold_openmp_team()\n"
        "grown = n() - before\n"
        "again = cpu_fused.hold_openmp_team()\n"
        "print(size, grown, again, n() - before)\n"
    )
    assert size == "2" and grown == "1"  # a team of torch's size: one worker thread started
    assert again == "2" and total == "1"  # the same team serves the next region
