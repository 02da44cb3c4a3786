"""Cutting one step's batch into micro-batches for pipeline parallelism.

Stage s works on micro-batch i + 1 while stage s + 1 works on micro-batch i, so with M stages
and M micro-batches the stages overlap instead of waiting for each other. A micro-batch is a
contiguous run of the batch's requests (decode requests first, then extend chunks, as in
`ForwardBatch`); requests are independent (each reads its own pages), so the logits of the
micro-batches, concatenated in order, are the whole batch's.
"""

from __future__ import annotations

import torch

from runtime.attention.forward_batch import ForwardBatch


def split(batch: ForwardBatch, parts: int) -> list[ForwardBatch]:
    """At most `parts` micro-batches of about equal token counts ([batch] if it cannot be cut:
    one request, or logit rows out of token order)."""
    rows = batch.logit_rows.tolist()
    nd, ne = batch.num_decode, int(batch.extend_lens.shape[0])
    if parts < 2 or nd + ne < 2 or rows != sorted(rows):
        return [batch]
    # token ranges of the requests, in batch order
    lens = [1] * nd + batch.extend_lens.tolist()
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    total = starts[-1]
    cuts, target = [0], total / parts
    for i in range(1, nd + ne):
        if starts[i] >= target * len(cuts) and len(cuts) < parts:
            cuts.append(i)
    cuts.append(nd + ne)
    out = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        if a == b:
            continue
        t0, t1 = starts[a], starts[b]
        da, db = min(a, nd), min(b, nd)  # decode requests in [a, b)
        ea, eb = max(a - nd, 0), max(b - nd, 0)  # extend requests in [a, b)
        mine = [r - t0 for r in rows if t0 <= r < t1]
        out.append(
            ForwardBatch(
                input_ids=batch.input_ids[t0:t1],
                positions=batch.positions[t0:t1],
                out_slots=batch.out_slots[t0:t1],
                num_decode=db - da,
                decode_page_table=batch.decode_page_table[da:db],
                decode_seq_lens=batch.decode_seq_lens[da:db],
                extend_page_table=batch.extend_page_table[ea:eb],
                extend_prefix_lens=batch.extend_prefix_lens[ea:eb],
                extend_lens=batch.extend_lens[ea:eb],
                logit_rows=torch.tensor(mine, dtype=batch.logit_rows.dtype),
            )
        )
    return out
