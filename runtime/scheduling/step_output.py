"""What happens after a forward pass: tokens booked, log-probs recorded, tokens sampled (through
the grammar masks), stop conditions checked, results streamed or delivered."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from runtime.scheduling.request import Request, Status
from runtime.scheduling.sampling import sample
from runtime.scheduling.step_plan import StepPlan

if TYPE_CHECKING:
    from runtime.scheduling.scheduler import Scheduler


def process_step_output(
    sched: Scheduler, plan: StepPlan, logits: torch.Tensor, booked: bool = False
) -> None:
    """Book the computed tokens, record score log-probs, sample, and finish or stream.
    `booked`: `book_step` already ran for this plan (the overlap path books ahead)."""
    if not booked:
        book_step(sched, plan, logits)
    sample_step(sched, plan, logits)


def book_step(sched: Scheduler, plan: StepPlan, logits: torch.Tensor | None) -> None:
    """Score log-probs (needs `logits`), then count the plan's tokens as computed."""
    for req, row0, count in plan.score_rows:
        # row i scores token (position of the row + 1)
        first = max(req.logprob_start, req.computed + 1)
        targets = torch.tensor(req.seq[first : first + count], dtype=torch.long)
        lp = torch.log_softmax(logits[row0 : row0 + count], dim=-1)
        req.prompt_logprobs.extend(lp.gather(1, targets[:, None])[:, 0].tolist())
    for req in plan.decodes:
        req.computed += 1
        req.decode_steps += 1
        sched.counters["decode_tokens"] += 1
    for item in plan.extends:
        req = item.req
        if req.output_ids:
            req.decode_steps += 1
        req.computed = item.end
        sched.counters["prefill_computed"] += item.length
        if req.computed == req.seq_len:
            req.prefill_done = True
        sched.book.cache_computed(req)


@torch.inference_mode()  # the logits are the forward's (inference) tensor, written in place
def sample_step(sched: Scheduler, plan: StepPlan, logits: torch.Tensor) -> None:
    """Sample the plan's sample rows (through the grammar masks), then finish or stream."""
    rows = [row for _, row in plan.sample_rows]
    reqs = [req for req, _ in plan.sample_rows]
    # the usual step samples every logits row in order: no gathered copy then
    in_order = len(rows) == logits.shape[0] and rows == list(range(len(rows)))
    sample_logits = logits if in_order else logits[rows]
    if sched.hooks is not None and reqs:
        dead = sched.hooks.mask_logits(reqs, sample_logits)
        for req in dead:  # its constraint allows no token at all (or failed: req.error says)
            if req.error is None:
                req.error = RuntimeError("the constraint allows no token here")
            sched.finish(req, "abort")
        if dead:
            keep = [i for i, r in enumerate(reqs) if r not in dead]
            reqs, sample_logits = [reqs[i] for i in keep], sample_logits[keep]
    if reqs:
        out = sample(sample_logits, reqs, sched.output.eos_ids, sched.generator)
        for i, req in enumerate(reqs):
            req.output_ids.append(out.tokens[i])
            if req.logprobs is not None:
                req.logprobs.append(out.logprobs[i])
            if req.top_logprobs is not None:
                req.top_logprobs.append(out.top_logprobs[i] or {})
            sched.counters["generated_tokens"] += 1
            if req.handoff is not None:  # a prefill server's request ends at its first token
                hand_off(sched, req)
            else:
                after_new_token(sched, req)
    for item in plan.extends:  # prefill-only requests (max_new_tokens=0, score)
        req = item.req
        if req.prefill_done and req.status is Status.RUNNING:
            if len(req.output_ids) >= req.params.max_new_tokens:
                if req.handoff is not None:
                    hand_off(sched, req)
                else:
                    sched.finish(req, "length")


def hand_off(sched: Scheduler, req: Request) -> None:
    """Prefill-decode disaggregation, prefill side: the prompt is prefilled and the first token
    sampled; the room copies the request's KV out for the decode server, and the request ends
    here (its pages retire into the radix cache as any finished request's do)."""
    req.handoff.stage(sched.pool, req)
    sched.finish(req, "length")


def after_new_token(sched: Scheduler, req: Request) -> None:
    """A token was appended to `req`: advance its constraint (maybe jumping forward), check
    stop conditions, then finish the request or stream what is new."""
    if sched.hooks is not None:
        sched.hooks.after_token(sched, req)
    if req.finish_reason != "abort":  # a failed constraint keeps its abort and error
        sched.output.check_finish(req)
    if req.finish_reason == "length" and sched.hooks is not None:
        reason = sched.hooks.length_reason(req)
        if reason:
            req.error = RuntimeError(reason)
    if req.finish_reason is not None:
        sched.finish(req, req.finish_reason)
    elif req.stream:
        chunk = sched.output.stream_chunk(req, finished=False)
        if chunk is not None:
            req.outbox.put(chunk)
