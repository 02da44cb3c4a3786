"""What happens after a forward pass: tokens booked, log-probs recorded, tokens sampled (through
the grammar masks), constraints advanced, stop conditions checked, streams fed.

These functions change requests (their tokens, pages and streams) but never the scheduler's
queues or counters: they read what they need from an `OutputContext` and record in a
`StepResult` the counts to add and the requests to retire, which the scheduler applies.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import torch

from runtime.memory.kv_pool import KVPool
from runtime.memory.pages import PageBook
from runtime.scheduling.constrained import ConstraintHooks
from runtime.scheduling.detokenize import Detokenizer
from runtime.scheduling.request import Request, Status
from runtime.scheduling.sampling import sample
from runtime.scheduling.step_plan import StepPlan, VerifyItem


class Speculation(Protocol):
    """Speculative decoding as the scheduler sees it (runtime/speculative's `Speculator`)."""

    max_batch: int  # more decoding requests than this in a step: no drafts at all

    def propose(self, items: list[tuple[Request, int]], batch: int) -> list[list[int]]:
        """Per (request, limit): at most `limit` draft tokens to follow `req.seq` (the grammar
        allows them all); `batch`: the requests decoding this step."""
        ...

    def observe(self, plan: StepPlan, seconds: float) -> None:
        """The step of `plan` took `seconds` (its cost, for deciding when drafting pays)."""
        ...

    def release(self, req: Request) -> None:
        """`req` finished or was preempted (its drafting state can go)."""
        ...

    def accept(
        self, ctx: OutputContext, item: VerifyItem, logits: torch.Tensor, result: StepResult
    ) -> None:
        """Take the tokens the target model's `logits` (a row per draft, plus one) confirm:
        appended to the request as decoding them one by one would have."""
        ...


@dataclass(slots=True)
class OutputContext:
    """The scheduler's parts the output phase uses (fixed for the engine's life)."""

    pool: KVPool
    book: PageBook
    detokenizer: Detokenizer
    hooks: ConstraintHooks | None
    generator: torch.Generator
    vocab_size: int
    speculation: Speculation | None = None


@dataclass(slots=True)
class StepResult:
    """What a phase asks of the scheduler: counters to add (`counts`), requests to retire, in
    order, with their reason (`finished`). A request is listed at most once."""

    counts: Counter[str] = field(default_factory=Counter)
    finished: list[tuple[Request, str]] = field(default_factory=list)
    _done: set[int] = field(default_factory=set)

    def finish(self, req: Request, reason: str) -> None:
        if req.rid not in self._done:
            self._done.add(req.rid)
            self.finished.append((req, reason))

    def finishing(self, req: Request) -> bool:
        return req.rid in self._done


def book_step(ctx: OutputContext, plan: StepPlan, logits: torch.Tensor | None) -> StepResult:
    """Score log-probs (needs `logits`), then count the plan's tokens as computed."""
    result = StepResult()
    for req, row0, count in plan.score_rows:
        # row i scores token (position of the row + 1)
        first = max(req.logprob_start, req.computed + 1)
        targets = torch.tensor(req.seq[first : first + count], dtype=torch.long,
                               device=logits.device)  # fmt: skip
        lp = torch.log_softmax(logits[row0 : row0 + count], dim=-1)
        req.prompt_logprobs.extend(lp.gather(1, targets[:, None])[:, 0].tolist())
    for req in plan.decodes:
        req.computed += 1
        req.decode_steps += 1
    result.counts["decode_tokens"] += len(plan.decodes) + len(plan.verifies)
    for v in plan.verifies:  # the real tokens are computed; the drafts wait for `accept`
        req = v.req
        req.decode_steps += 1
        result.counts["prefill_computed"] += req.seq_len - v.start - 1
        req.computed = req.seq_len
        req.prefill_done = True
    for item in plan.extends:
        req = item.req
        if req.output_ids:
            req.decode_steps += 1
        req.computed = item.end
        result.counts["prefill_computed"] += item.length
        if req.computed == req.seq_len:
            req.prefill_done = True
        ctx.book.cache_computed(req)
    return result


@torch.inference_mode()  # the logits are the forward's (inference) tensor, written in place
def sample_step(ctx: OutputContext, plan: StepPlan, logits: torch.Tensor) -> StepResult:
    """Sample the plan's sample rows (through the grammar masks), then finish or stream."""
    result = StepResult()
    rows = [row for _, row in plan.sample_rows]
    reqs = [req for req, _ in plan.sample_rows]
    # the usual step samples every logits row in order: no gathered copy then
    in_order = len(rows) == logits.shape[0] and rows == list(range(len(rows)))
    sample_logits = logits if in_order else logits[rows]
    if ctx.hooks is not None and reqs:
        dead = ctx.hooks.mask_logits(reqs, sample_logits)
        for req in dead:  # its constraint allows no token at all (or failed: req.error says)
            if req.error is None:
                req.error = RuntimeError("the constraint allows no token here")
            result.finish(req, "abort")
        if dead:
            keep = [i for i, r in enumerate(reqs) if r not in dead]
            reqs, sample_logits = [reqs[i] for i in keep], sample_logits[keep]
    if reqs:
        out = sample(sample_logits, reqs, ctx.detokenizer.eos_ids, ctx.generator)
        for i, req in enumerate(reqs):
            req.output_ids.append(out.tokens[i])
            if req.logprobs is not None:
                req.logprobs.append(out.logprobs[i])
            if req.top_logprobs is not None:
                req.top_logprobs.append(out.top_logprobs[i] or {})
            result.counts["generated_tokens"] += 1
            if req.handoff is not None:  # a prefill server's request ends at its first token
                hand_off(ctx, req, result)
            else:
                after_new_token(ctx, req, result)
    for v, row0 in plan.verify_rows:
        if result.finishing(v.req):
            continue
        ctx.speculation.accept(ctx, v, logits[row0 : row0 + len(v.drafts) + 1], result)
    for item in plan.extends:  # prefill-only requests (max_new_tokens=0, score)
        req = item.req
        if req.prefill_done and req.status is Status.RUNNING and not result.finishing(req):
            if len(req.output_ids) >= req.params.max_new_tokens:
                if req.handoff is not None:
                    hand_off(ctx, req, result)
                else:
                    result.finish(req, "length")
    return result


def hand_off(ctx: OutputContext, req: Request, result: StepResult) -> None:
    """Prefill-decode disaggregation, prefill side: the prompt is prefilled and the first token
    sampled; the room copies the request's KV out for the decode server, and the request ends
    here (its pages retire into the radix cache as any finished request's do)."""
    req.handoff.stage(ctx.pool, req)
    result.finish(req, "length")


def after_new_token(ctx: OutputContext, req: Request, result: StepResult) -> None:
    """A token was appended to `req`: advance its constraint (maybe jumping forward), check
    stop conditions, then finish the request or stream what is new."""
    hooks = ctx.hooks
    if hooks is not None:
        hooks.after_token(ctx.book, req)
    if req.finish_reason != "abort":  # a failed constraint keeps its abort and error
        ctx.detokenizer.check_finish(req)
    if req.finish_reason == "length" and hooks is not None:
        reason = hooks.length_reason(req)
        if reason:
            req.error = RuntimeError(reason)
    if req.finish_reason is not None:
        result.finish(req, req.finish_reason)
    elif req.stream:
        chunk = ctx.detokenizer.stream_chunk(req, finished=False)
        if chunk is not None:
            req.outbox.put(chunk)
