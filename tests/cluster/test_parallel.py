"""Tensor, pipeline and expert parallelism (worker processes joined by torch.distributed with
gloo) give the single-process engine's greedy tokens, token for token, with the radix cache,
chunked prefill and preemption in play; each rank holds its share of the KV; a dead rank is
restarted and the requests in flight finish (requeued, their KV recomputed); shutdown stops
every rank."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from runtime import Engine
from runtime.errors import ParallelConfigError
from tests.support.tiny_models import PROMPTS, make_tiny_model

pytestmark = pytest.mark.timeout(300)
GREEDY = dict(max_new_tokens=10, min_new_tokens=10, temperature=0.0)
# a small pool (preemption and eviction) and small prefill chunks
ENGINE = dict(page_size=4, chunked_prefill_tokens=16, max_total_tokens=96)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("par") / "llama", "llama")
    with Engine(str(folder), **ENGINE) as e:
        expected = [r.token_ids for r in e.generate(PROMPTS * 2, **GREEDY)]
        whole = e.stats()["kv_bytes_per_token"]
    return folder, expected, whole


@pytest.mark.parametrize(
    "sizes, ranks, kv_share",
    [
        pytest.param(dict(tp_size=2), 2, 2, id="tp2"),
        pytest.param(dict(pp_size=2), 2, 2, id="pp2"),
        pytest.param(dict(tp_size=2, pp_size=2), 4, 4, id="tp2-pp2"),
    ],
)
def test_greedy_tokens_equal_the_single_process_engine(llama, sizes, ranks, kv_share):
    folder, expected, whole = llama
    with Engine(str(folder), **ENGINE, **sizes) as e:
        results = e.generate(PROMPTS * 2, **GREEDY)
        stats = e.stats()
        pids = stats["worker_pids"]
        assert len(pids) == ranks and all(_alive(p) for p in pids)
        assert [r.token_ids for r in results] == expected
        assert stats["preemptions"] > 0 and stats["cache_hit_tokens"] > 0
        assert stats["kv_bytes_per_token"] == whole
        assert stats["kv_bytes_per_token_per_rank"] == whole // kv_share
        assert {k: stats[k] for k in sizes} == sizes
        e.check_integrity()
    assert _wait_gone(pids)  # shutdown stops every rank


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("par") / "ds", "deepseek_v3")
    with Engine(str(folder), page_size=4, chunked_prefill_tokens=8) as e:
        expected = [r.token_ids for r in e.generate(PROMPTS, **GREEDY)]
    return folder, expected


@pytest.mark.parametrize(
    "sizes, ranks",
    [
        pytest.param(dict(ep_size=2, pp_size=2), 4, id="ep2-pp2"),
        # MLA by heads: q_b / kv_b / o split, the latent and the rope key on every rank
        pytest.param(dict(tp_size=2), 2, id="tp2"),
    ],
)
def test_parallel_deepseek_equals_the_single_process_engine(deepseek, sizes, ranks):
    folder, expected = deepseek
    with Engine(str(folder), page_size=4, chunked_prefill_tokens=8, **sizes) as e:
        assert [r.token_ids for r in e.generate(PROMPTS, **GREEDY)] == expected
        stats = e.stats()
    assert {k: stats[k] for k in sizes} == sizes and len(stats["worker_pids"]) == ranks


def test_a_dead_rank_is_restarted_and_the_requests_in_flight_finish(llama):
    folder, expected, _ = llama
    with Engine(str(folder), **ENGINE, tp_size=2) as e:
        pids = e.stats()["worker_pids"]
        out: dict = {}

        def generate() -> None:
            out["results"] = e.generate(PROMPTS * 2, **GREEDY)

        t = threading.Thread(target=generate)
        t.start()
        deadline = time.monotonic() + 60
        while e.stats()["forward_steps"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pids[1], signal.SIGKILL)  # a rank killed while the requests decode
        t.join(240)
        assert not t.is_alive()
        # requeued, their KV recomputed on fresh ranks: the same greedy tokens, no error
        assert [r.error for r in out["results"]] == [None] * len(expected)
        assert [r.token_ids for r in out["results"]] == expected
        stats = e.stats()
        assert stats["rank_restarts"] == 1
        assert _wait_gone(pids)  # the old ranks are gone, new ones serve
        assert len(stats["worker_pids"]) == 2 and not set(pids) & set(stats["worker_pids"])
        e.check_integrity()
        # killed while idle: the next request waits for the restart, then runs
        os.kill(stats["worker_pids"][0], signal.SIGKILL)
        (again,) = e.generate(PROMPTS[:1], **GREEDY)
        assert again.error is None and again.token_ids == expected[0]
        assert e.stats()["rank_restarts"] == 2
        e.check_integrity()


class _Exited:
    """Stands in for a worker's Popen: exited with `code` (None: still running)."""

    def __init__(self, pid: int, code: int | None, log: bytes) -> None:
        import tempfile

        self.pid, self.code = pid, code
        self.log = tempfile.TemporaryFile()
        self.log.write(log)

    def poll(self) -> int | None:
        return self.code


def test_the_rank_that_died_is_named_not_the_ranks_it_took_down():
    """A rank whose gloo peer vanished exits with PEER_LOST; the driver names the one that died
    (here rank 3, killed), whichever rank number is lower, and a PEER_LOST rank only alone."""
    from runtime.workers.driver import ParallelModel
    from runtime.workers.worker import PEER_LOST

    def failure(*ranks: _Exited) -> str | None:
        model = object.__new__(ParallelModel)
        model.procs, model.logs = list(ranks), [r.log for r in ranks]
        return model._dead_worker()

    lost = _Exited(11, PEER_LOST, b"rank 1: a peer's connection closed")
    running = _Exited(12, None, b"")
    killed = _Exited(13, -9, b"")
    assert failure(lost, running, killed).startswith("rank 3 (pid 13) exited with -9")
    assert failure(lost, running).startswith(f"rank 1 (pid 11) exited with {PEER_LOST}")
    assert failure(running, running) is None
    crashed = _Exited(14, 1, b"Traceback: ValueError")
    assert "rank 2 (pid 14) exited with 1: Traceback: ValueError" in failure(lost, crashed)


@pytest.mark.parametrize(
    "kind, sizes, message",
    [
        ("llama", dict(tp_size=3), "num_attention_heads 4 is not a multiple of tp_size 3"),
        ("llama", dict(ep_size=2), "ep_size 2 needs a mixture-of-experts model"),
        ("llama", dict(pp_size=5), "pp_size 5 is more than the model's 2 layers"),
        ("deepseek_v3", dict(tp_size=3), "num_attention_heads 4 is not a multiple of tp_size 3"),
        ("deepseek_v3", dict(ep_size=3), "n_routed_experts 8 is not a multiple of ep_size 3"),
    ],
)
def test_sizes_the_model_cannot_be_split_by_are_named(tmp_path, kind, sizes, message):
    folder = make_tiny_model(tmp_path / kind, kind)
    with pytest.raises(ParallelConfigError, match=message):
        Engine(str(folder), **sizes)


def test_micro_batches_give_the_whole_batch_logits(llama):
    """Pipeline stages work on micro-batches: cut at request boundaries, their logits in order
    are the batch's (checked on the single-process model, same pool layout)."""
    from runtime.memory.kv_pool import KVPool
    from runtime.models.loader import load_model_files
    from runtime.models.registry import model_class
    from runtime.workers.microbatch import split

    folder, _, _ = llama
    loaded = load_model_files(folder)
    model = model_class(loaded.config)(loaded.config, loaded.state_dict, torch.float32)
    batch = _extend_then_decode_batch(model.config.vocab_size)
    parts = split(batch, 3)
    assert len(parts) >= 2 and sum(p.num_tokens for p in parts) == batch.num_tokens
    pool = KVPool(model.config, 64, 4, torch.float32)
    whole = model.forward(batch, pool)
    pool = KVPool(model.config, 64, 4, torch.float32)
    pieces = torch.cat([model.forward(p, pool) for p in parts])
    torch.testing.assert_close(pieces, whole, atol=1e-5, rtol=1e-5)


def _extend_then_decode_batch(vocab: int):
    """2 decode requests then 2 extend chunks (one behind a 4-token prefix), page size 4."""
    from runtime.attention.forward_batch import ForwardBatch

    ps = 4

    def slots(pages: list[int], lo: int, hi: int) -> list[int]:
        return [pages[p // ps] * ps + p % ps for p in range(lo, hi)]

    reqs = [([1, 2], 4, 1), ([3], 2, 1), ([4, 5, 6], 4, 6), ([7, 8], 0, 5)]  # pages, start, n
    positions, out_slots = [], []
    for pages, start, n in reqs:
        positions += list(range(start, start + n))
        out_slots += slots(pages, start, start + n)
    table = torch.zeros(4, 3, dtype=torch.int32)
    for i, (pages, _, _) in enumerate(reqs):
        table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    ids = torch.randint(0, vocab, (len(positions),), generator=torch.Generator().manual_seed(3))
    i32 = torch.int32
    return ForwardBatch(
        input_ids=ids, positions=torch.tensor(positions), out_slots=torch.tensor(out_slots),
        num_decode=2, decode_page_table=table[:2],
        decode_seq_lens=torch.tensor([5, 3], dtype=i32), extend_page_table=table[2:],
        extend_prefix_lens=torch.tensor([4, 0], dtype=i32),
        extend_lens=torch.tensor([6, 5], dtype=i32), logit_rows=torch.tensor([0, 1, 7, 12]),
    )  # fmt: skip


@pytest.mark.heavy
def test_smollm2_tensor_parallel_over_three_ranks():
    """SmolLM2-135M: 9 query heads, 3 KV heads, one of each set per rank."""
    with Engine(page_size=16) as e:
        expected = [r.token_ids for r in e.generate(PROMPTS[:3], **GREEDY)]
        whole = e.stats()["kv_bytes_per_token"]
    with Engine(page_size=16, tp_size=3) as e:
        assert [r.token_ids for r in e.generate(PROMPTS[:3], **GREEDY)] == expected
        assert e.stats()["kv_bytes_per_token_per_rank"] == whole // 3


def test_server_with_tp_serves_and_sigterm_stops_every_rank(llama):
    import httpx
    import psutil

    from tests.support.server_process import SMALL_ENGINE, ServerProcess

    folder, _, _ = llama
    server = ServerProcess(folder, *SMALL_ENGINE, "--tp", "2")
    try:
        children = psutil.Process(server.proc.pid).children(recursive=True)
        # the server also starts its grammar compile workers at launch: count the ranks apart
        ranks = [c.pid for c in children if "runtime.workers.worker" in c.cmdline()]
        assert len(ranks) == 2
        everyone = [c.pid for c in children]
        body = {"prompt": "Hello there", "max_tokens": 4, "temperature": 0}
        reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0, server.logs()
    assert _wait_gone(everyone)  # the ranks and the compile workers


def test_two_machines_on_loopback(llama):
    """Node 0 runs the engine and its block of ranks; `python -m runtime.workers.launch`
    (another machine, here another process) runs the rest; outputs as with one process."""
    import subprocess
    import sys

    from tests.support.server_process import free_port

    folder, expected, _ = llama
    addr = f"127.0.0.1:{free_port()}"
    node1 = subprocess.Popen(
        [sys.executable, "-m", "runtime.workers.launch", "--model", str(folder), "--tp", "2",
         "--pp", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", addr],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        with Engine(str(folder), **ENGINE, tp_size=2, pp_size=2, nnodes=2,
                    dist_init_addr=addr) as e:  # fmt: skip
            assert [r.token_ids for r in e.generate(PROMPTS * 2, **GREEDY)] == expected
            stats = e.stats()
            assert len(stats["worker_pids"]) == 4 and len(e.model.procs) == 2  # 2 here, 2 there
        assert node1.wait(timeout=30) == 0, node1.stderr.read().decode()[-2000:]
    finally:
        if node1.poll() is None:
            node1.kill()
