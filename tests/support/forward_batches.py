"""Forward batches built by hand for the kernel and KV tests: a mixed decode + extend batch,
and a greedy decode loop over a model's forward with a paged KV pool."""

from __future__ import annotations

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.memory.kv_pool import KVPool


def mixed_batch() -> ForwardBatch:
    """One decode row (5 tokens cached, on pages 3 and 5) and one extend row (3 new tokens after
    a 6-token prefix, on pages 1, 6 and 7): the shapes an attention backend plans for."""
    return ForwardBatch(
        input_ids=torch.zeros(4, dtype=torch.long), positions=torch.tensor([4, 6, 7, 8]),
        out_slots=torch.tensor([20, 26, 27, 28]), num_decode=1,
        decode_page_table=torch.tensor([[3, 5]], dtype=torch.int32),
        decode_seq_lens=torch.tensor([5], dtype=torch.int32),
        extend_page_table=torch.tensor([[1, 6, 7]], dtype=torch.int32),
        extend_prefix_lens=torch.tensor([6], dtype=torch.int32),
        extend_lens=torch.tensor([3], dtype=torch.int32), logit_rows=torch.tensor([0, 3]),
    )  # fmt: skip


def decode_run(model, dtype: torch.dtype, prompts: list[list[int]], steps: int):
    """Prefill each prompt, then `steps` greedy decode steps of the whole batch; returns
    (tokens [B, steps], logits of every decode step [steps, B, V])."""
    page_size, per = 4, 32
    b = len(prompts)
    pool = KVPool(model.config, b * per + 1, page_size, dtype)
    table = torch.arange(1, b * per + 1, dtype=torch.int32).view(b, per)
    none = torch.zeros(0, dtype=torch.int32)

    def slot(row: int, pos: int) -> int:
        return int(table[row, pos // page_size]) * page_size + pos % page_size

    last = []
    for row, ids in enumerate(prompts):
        n = len(ids)
        batch = ForwardBatch(
            torch.tensor(ids), torch.arange(n), torch.tensor([slot(row, p) for p in range(n)]),
            0, table[:0], none, table[row : row + 1], torch.tensor([0], dtype=torch.int32),
            torch.tensor([n], dtype=torch.int32), torch.tensor([n - 1]),
        )  # fmt: skip
        last.append(int(model.forward(batch, pool).argmax(-1)))
    lens = [len(p) for p in prompts]
    tokens, logits = [], []
    for _ in range(steps):
        batch = ForwardBatch(
            torch.tensor(last), torch.tensor(lens), torch.tensor([slot(r, p) for r, p in
            enumerate(lens)]), b, table, torch.tensor(lens, dtype=torch.int32) + 1, table[:0],
            none, none, torch.arange(b),
        )  # fmt: skip
        out = model.forward(batch, pool)
        logits.append(out)
        last = out.argmax(-1).tolist()
        tokens.append(last)
        lens = [n + 1 for n in lens]
    return torch.tensor(tokens).T, torch.stack(logits)
