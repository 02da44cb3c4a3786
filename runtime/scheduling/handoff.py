"""Prefill-decode disaggregation, decode side: admitting a request whose KV arrived by transfer.

Such a request waits in the queue like any other (its constraint compiling meanwhile). When
admitted it takes the radix cache's longest match of its prompt as usual, gets pages for the
rest, and the received pages are written into them, so its prefill is never computed here.
Then the tokens the prefill server sampled (the first one) are booked as if sampled in this
engine: the matcher advances (and may jump forward), stop conditions apply, the stream gets
them, and the next step decodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from runtime.memory.kv_pages import write_pages
from runtime.scheduling.request import Request, Status
from runtime.scheduling.step_output import after_new_token

if TYPE_CHECKING:
    from runtime.scheduling.scheduler import Scheduler


def admit_imported(sched: Scheduler) -> None:
    """Admit the waiting requests that carry transferred KV, oldest first, while room lasts."""
    for req in [r for r in sched.waiting if r.imported is not None]:
        if len(sched.running) >= sched.max_running:
            return
        if not sched.constraint_ready(req):
            continue
        if not _admit_one(sched, req):
            return  # the pool is full: try again after a step has freed pages


def _admit_one(sched: Scheduler, req: Request) -> bool:
    kv = req.imported
    ps = sched.pool.page_size
    tokens = kv.kv_tokens
    match = sched.book.match(req.seq, tokens)
    if not sched.book.admit(req, match, tokens + 1):
        return False
    first, last = match.length // ps, -(-tokens // ps)
    if last > first:
        write_pages(sched.pool, req.pages[first:last], kv.data[first:last])
    req.imported = None  # the received copy is not needed any more
    req.computed = tokens
    sched.waiting.remove(req)
    req.status = Status.RUNNING
    sched._admit_clock += 1
    req.admit_order = sched._admit_clock
    req.cached_tokens_at_admission = match.length
    sched.counters["prefill_cached"] += match.length
    sched.running.append(req)
    req.prefill_done = req.computed == req.seq_len - 1
    sched.book.cache_computed(req)
    if kv.logprobs is not None and req.logprobs is not None:
        req.logprobs.extend(kv.logprobs)
    if kv.top_logprobs is not None and req.top_logprobs is not None:
        req.top_logprobs.extend(kv.top_logprobs)
    if req.output_ids:
        replay_draws(req, sched.model.config.vocab_size, len(req.output_ids))
        sched.counters["generated_tokens"] += len(req.output_ids)
        after_new_token(sched, req)
    elif len(req.output_ids) >= req.params.max_new_tokens:
        sched.finish(req, "length")
    return True


def replay_draws(req: Request, vocab_size: int, count: int) -> None:
    """Advance a seeded request's generator past `count` tokens sampled elsewhere (the prefill
    server's first token), so its next draws are the ones one engine would have made: a
    multinomial draw consumes the same random state whatever the probabilities."""
    if req.generator is None or req.params.is_greedy or count <= 0:
        return
    row = torch.full((vocab_size,), 1.0 / vocab_size)
    for _ in range(count):
        torch.multinomial(row, 1, generator=req.generator)
