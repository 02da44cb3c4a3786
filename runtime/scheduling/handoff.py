"""Prefill-decode disaggregation, decode side: admitting a request whose KV arrived by transfer.

Such a request waits in the queue like any other (its constraint compiling meanwhile). The
scheduler admits it through its one admission path (the radix cache's longest match of its
prompt, pages for the rest); then `install_imported` writes the received pages into them, so
its prefill is never computed here. A Mooncake transfer reads the pages straight into the
pool instead: the scheduler admits such a request first (`Scheduler._admit_imported`, its
pages "landing") and installs it once the read has ended.
Then the tokens the prefill server sampled (the first one) are booked as if sampled in this
engine: the matcher advances (and may jump forward), stop conditions apply, the stream gets
them, and the next step decodes.
"""

from __future__ import annotations

import time

import torch

from runtime.memory.kv_pages import write_pages
from runtime.scheduling.request import Request
from runtime.scheduling.step_results import OutputContext, StepResult, after_new_token


def install_imported(ctx: OutputContext, req: Request, matched: int) -> StepResult:
    """A request just admitted with `matched` tokens from the radix cache and pages up to its
    imported KV: write the received pages into those past the match (unless the transfer read
    them into the pool already), book them as computed, then take the prefill server's sampled
    token(s) as if sampled here. The scheduler applies the result."""
    result = StepResult()
    kv = req.imported
    ps = ctx.pool.page_size
    tokens = kv.kv_tokens
    first, last = matched // ps, -(-tokens // ps)
    if last > first and kv.data is not None:
        start = time.perf_counter()
        write_pages(ctx.pool, req.pages[first:last], kv.data[first:last])
        if kv.note_copy is not None:
            kv.note_copy(time.perf_counter() - start)
    req.imported = None  # the received copy is not needed any more
    req.computed = tokens
    req.prefill_done = req.computed == req.seq_len - 1
    ctx.book.cache_computed(req)
    if kv.logprobs is not None and req.logprobs is not None:
        req.logprobs.extend(kv.logprobs)
    if kv.top_logprobs is not None and req.top_logprobs is not None:
        req.top_logprobs.extend(kv.top_logprobs)
    if req.output_ids:
        replay_draws(req, ctx.vocab_size, len(req.output_ids))
        result.counts["generated_tokens"] += len(req.output_ids)
        after_new_token(ctx, req, result)
    elif len(req.output_ids) >= req.params.max_new_tokens:
        result.finish(req, "length")
    return result


def replay_draws(req: Request, vocab_size: int, count: int) -> None:
    """Advance a seeded request's generator past `count` tokens sampled elsewhere (the prefill
    server's first token), so its next draws are the ones one engine would have made: a
    multinomial draw consumes the same random state whatever the probabilities."""
    if req.generator is None or req.params.is_greedy or count <= 0:
        return
    row = torch.full((vocab_size,), 1.0 / vocab_size)
    for _ in range(count):
        torch.multinomial(row, 1, generator=req.generator)
