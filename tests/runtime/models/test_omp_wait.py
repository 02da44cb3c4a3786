"""libgomp's wait chosen per step for a dense CPU model (runtime/models/threads.py `WaitChoice`):
the throttled wait (a helper thread's OpenMP team held) on steps whose products run on the
kernels' pool (at most GEMV_ROWS tokens), the long spin (the team freed) on larger steps, each
change carried out once and in order."""

from __future__ import annotations

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.kernels.cpu import fused as cpu_fused
from runtime.models import threads
from runtime.models.layers import GEMV_ROWS


def _batch(decode: int, prompt: int) -> ForwardBatch:
    n = decode + prompt
    table = torch.zeros(decode, 1, dtype=torch.int32)
    extend = [prompt] if prompt else []
    return ForwardBatch(
        torch.zeros(n, dtype=torch.int64), torch.arange(n), torch.arange(n), decode, table,
        torch.ones(decode, dtype=torch.int32), torch.zeros(len(extend), 1, dtype=torch.int32),
        torch.zeros(len(extend), dtype=torch.int32), torch.tensor(extend, dtype=torch.int32),
        torch.arange(decode + len(extend)),
    )  # fmt: skip


def test_decode_steps_hold_a_team_and_prompt_steps_free_it(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_fused, "hold_openmp_team", lambda: calls.append("hold") or 2)
    monkeypatch.setattr(cpu_fused, "release_openmp_team", lambda: calls.append("free") or True)
    waits = threads.WaitChoice()
    steps = [
        (16, 0, True),  # a decode step: throttled
        (16, 0, True),  # no change, no order
        (3, GEMV_ROWS - 3, True),  # a few prompt tokens beside decodes: still on the pool
        (0, GEMV_ROWS + 1, False),  # a prompt step past the pool's rows: the long spin
        (GEMV_ROWS + 1, 0, False),  # a decode of more requests (oneDNN's products)
        (0, 500, False),
        (1, 0, True),
    ]
    for decode, prompt, throttled in steps:
        waits.step(_batch(decode, prompt))
        assert waits.throttled is throttled
    assert waits.switches == 3
    waits.close()
    waits.close()  # idempotent
    assert not waits._thread.is_alive()
    assert calls == ["hold", "free", "hold", "free"]  # the last: close frees the team
