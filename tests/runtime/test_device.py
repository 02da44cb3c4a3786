"""The engine's device (runtime/device/) as far as a machine without a GPU can check it: which
device a name resolves to, the typed error for a GPU that is not there, `device="cpu"` giving
the default engine's outputs, and decode steps through the CUDA-graph runner's padded static
buffers (run eagerly here) giving the unpadded step's greedy tokens across batch-size buckets,
on every attention backend (Triton interpreted)."""

from __future__ import annotations

import threading

import httpx
import pytest
import torch

from runtime import Engine
from runtime.attention.forward_batch import ForwardBatch
from runtime.device import default_batch_sizes, resolve_device
from runtime.device.graph_runner import LENGTH, PAGES, graph_blocker
from runtime.errors import DeviceUnavailableError
from runtime.workers.layout import Layout
from tests.support.server_process import ServerProcess
from tests.support.tiny_models import PROMPTS

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param("cpu", "cpu", id="cpu"),
        pytest.param(torch.device("cpu"), "cpu", id="torch-device"),
        pytest.param("auto", "cpu", id="auto-is-cpu-here", marks=no_cuda),
    ],
)
def test_device_names_resolve(spec, expected):
    assert resolve_device(spec) == torch.device(expected)


@no_cuda
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_a_gpu_that_is_not_there_is_a_typed_error(spec):
    with pytest.raises(DeviceUnavailableError, match="CUDA is not available"):
        resolve_device(spec)


@pytest.mark.parametrize("spec", ["tpu", "gpu", "cuda:x", "mps"])
def test_other_device_names_are_refused(spec):
    with pytest.raises(ValueError, match="device must be one of"):
        resolve_device(spec)


@no_cuda
def test_engine_on_cuda_without_cuda_fails_before_loading(tmp_path):
    # the device is checked first: a missing model folder would be a different error
    with pytest.raises(DeviceUnavailableError):
        Engine(tmp_path / "no-such-model", device="cuda")


def _run(engine: Engine) -> list:
    greedy = engine.generate(PROMPTS[:4], max_new_tokens=8, temperature=0.0, ignore_eos=True)
    sampled = engine.generate(PROMPTS[0], max_new_tokens=8, temperature=0.8, top_p=0.9, seed=7)
    lps = engine.generate(PROMPTS[1], max_new_tokens=4, temperature=0.0, logprobs=True)
    scores = engine.score(PROMPTS[2], [" yes", " no"])
    return [[r.token_ids for r in greedy], sampled.token_ids, lps.token_ids, lps.logprobs, scores]


def _same(got: list, expected: list) -> None:
    assert got[:3] == expected[:3]  # tokens: exactly
    # log-probs and scores: to rounding (two default engines differ in the last bit now and
    # then: the forward's thread count is measured, and oneDNN's sums follow it)
    assert got[3] == pytest.approx(expected[3], rel=1e-5)
    assert got[4] == pytest.approx(expected[4], rel=1e-5)


def test_cpu_device_equals_the_default(model_dir):
    with Engine(model_dir, page_size=4, max_total_tokens=2048) as default:
        expected = _run(default)
        assert default.stats()["device"] == "cpu"
    with Engine(model_dir, page_size=4, max_total_tokens=2048, device="cpu") as cpu:
        _same(_run(cpu), expected)
        # the CPU path calls the model itself: no graph buckets
        assert cpu.runner.graphs is None and cpu.runner.stats().graph_batch_sizes == ()
        assert cpu.stats()["cuda_graph_batch_sizes"] == []


def test_default_batch_sizes():
    assert default_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert default_batch_sizes(12) == [1, 2, 4, 8, 12]
    assert default_batch_sizes(3) == [1, 2, 3]
    assert default_batch_sizes(1) == [1]


# five concurrent requests of 2 .. 6 new tokens: the decode batch shrinks 5 -> 1 step by step,
# crossing the bucket edges 4 | 2 | 1 (5 is past the largest bucket and runs eagerly)
LENGTHS = [2, 3, 4, 5, 6]


def _greedy_into(engine: Engine, results: list, i: int) -> None:
    r = engine.generate(PROMPTS[i], max_new_tokens=LENGTHS[i], temperature=0.0,
                        ignore_eos=True)  # fmt: skip
    results[i] = r.token_ids


def _staggered(engine: Engine) -> list[list[int]]:
    results: list = [None] * len(LENGTHS)
    threads = [
        threading.Thread(target=_greedy_into, args=(engine, results, i))
        for i in range(len(LENGTHS))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("backend", ["cpu", "torch", "triton"])
def test_padded_runner_gives_the_unpadded_tokens(model_dir, backend):
    kw = dict(page_size=4, max_total_tokens=2048, attention_backend=backend)
    with Engine(model_dir, **kw) as plain:
        expected = _staggered(plain)
    with Engine(model_dir, **kw, cuda_graph_bs=[1, 2, 4]) as padded:
        assert padded.runner.graphs is not None
        assert _staggered(padded) == expected
        stats = padded.stats()
        assert stats["cuda_graph_batch_sizes"] == [1, 2, 4]
        assert stats["graph_replays"] > 0
        padded.check_integrity()


def test_disable_cuda_graph_keeps_the_plain_model(model_dir):
    with Engine(
        model_dir, max_total_tokens=512, cuda_graph_bs=[1, 2], disable_cuda_graph=True
    ) as e:
        assert e.runner.graphs is None


def test_padding_rows_point_at_the_reserved_page(model_dir):
    with Engine(model_dir, page_size=4, max_total_tokens=512, cuda_graph_bs=[1, 4]) as e:
        runner = e.runner.graphs
        assert runner.bucket(1) == 1 and runner.bucket(2) == 4 and runner.bucket(5) is None
        batch = ForwardBatch(
            input_ids=torch.tensor([11, 12]), positions=torch.tensor([5, 9]),
            out_slots=torch.tensor([4 * 7 + 1, 4 * 9 + 1]), num_decode=2,
            decode_page_table=torch.tensor([[3, 7], [8, 9]], dtype=torch.int32),
            decode_seq_lens=torch.tensor([6, 10], dtype=torch.int32),
            extend_page_table=torch.zeros(0, 2, dtype=torch.int32),
            extend_prefix_lens=torch.zeros(0, dtype=torch.int32),
            extend_lens=torch.zeros(0, dtype=torch.int32), logit_rows=torch.arange(2),
        )  # fmt: skip
        e.scheduler.call(lambda: runner.load(batch, 4))
        state = runner.state
        assert state[:2, :PAGES].tolist() == [[11, 5, 29, 6], [12, 9, 37, 10]]
        assert state[:2, PAGES : PAGES + 2].tolist() == [[3, 7], [8, 9]]
        # padding: token 0 at position 0 into slot 0 of page 0 (never handed out), length 1
        assert state[2:4, :LENGTH].abs().sum() == 0 and state[2:4, LENGTH].tolist() == [1, 1]
        assert state[2:4, PAGES:].abs().sum() == 0
        assert 0 not in e.pool.free_page_set()


def test_graphs_need_the_triton_backend(model_dir):
    with Engine(model_dir, max_total_tokens=512, attention_backend="cpu") as e:
        assert "triton" in graph_blocker(e.model)


def test_batch_to_device_keeps_every_field():
    batch = ForwardBatch(
        input_ids=torch.tensor([1, 2]), positions=torch.tensor([0, 1]),
        out_slots=torch.tensor([4, 5]), num_decode=2,
        decode_page_table=torch.tensor([[1], [1]], dtype=torch.int32),
        decode_seq_lens=torch.tensor([1, 2], dtype=torch.int32),
        extend_page_table=torch.zeros(0, 1, dtype=torch.int32),
        extend_prefix_lens=torch.zeros(0, dtype=torch.int32),
        extend_lens=torch.zeros(0, dtype=torch.int32), logit_rows=torch.arange(2),
    )  # fmt: skip
    moved = batch.to(torch.device("cpu"))
    for name in ForwardBatch.__slots__:
        a, b = getattr(batch, name), getattr(moved, name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_ranks_take_their_local_gpu():
    layout = Layout(tp_size=2, pp_size=2, ep_size=1, num_layers=4, nnodes=2)
    assert [layout.local_rank(r) for r in range(1, 5)] == [0, 1, 0, 1]
    assert [layout.local_rank(r) for r in range(1, 5)] == [
        r - layout.node_ranks((r - 1) // 2).start for r in range(1, 5)
    ]


def test_cluster_passes_the_device_on():
    from runtime.cluster.__main__ import config_from_args, parse_args

    assert "--device=cpu" in config_from_args(parse_args(["--device", "cpu"])).server_args
    assert not any(a.startswith("--device") for a in config_from_args(parse_args([])).server_args)


def test_server_runs_with_device_cpu(model_dir):
    server = ServerProcess(model_dir, "--device", "cpu", "--max-total-tokens", "512")
    try:
        body = {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert httpx.get(f"{server.url}/stats", timeout=30).json()["device"] == "cpu"
    finally:
        assert server.stop() == 0


@no_cuda
def test_server_on_cuda_without_cuda_exits_with_the_reason(model_dir, caplog):
    from runtime.server.__main__ import main

    assert main(["--device", "cuda", "--model", str(model_dir)]) == 2
    assert "CUDA is not available" in caplog.text


def test_block_quantized_weights_are_dequantized_for_another_device():
    from runtime.device import place_state
    from runtime.kernels.cpu import quant as cpu_quant
    from runtime.models.loader import quantize_state

    w = torch.randn(64, 64)
    state = quantize_state(
        {"model.layers.0.mlp.down_proj.weight": w, "norm": torch.ones(4)}, "q8_0"
    )
    assert cpu_quant.is_quantized(state["model.layers.0.mlp.down_proj.weight"])
    assert place_state(state, torch.device("cpu")) == state  # the CPU keeps the blocks
    # "meta" stands in for a GPU: every weight arrives as a plain tensor of its shape
    moved = place_state(state, torch.device("meta"))
    assert moved["model.layers.0.mlp.down_proj.weight"].device.type == "meta"
    assert moved["model.layers.0.mlp.down_proj.weight"].shape == (64, 64)
    assert moved["norm"].device.type == "meta"
