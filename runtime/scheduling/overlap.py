"""The overlap scheduler: while step N's forward runs, the scheduler prepares step N+1.

    scheduler thread                               model thread
    launch forward(batch N)  ------------------->  forward N
    book N (tokens computed, pages cached)
    plan N+1 (decodes, chunks, admissions) and
      build its batch, with a placeholder for
      each token step N is about to sample
    wait for N's logits  <------------------------ logits N
    sample N, stop checks, streams, retirements
    fill N+1's placeholders with N's tokens
    (the next `step` launches N+1 at once)

What a step computes does not change: step N+1's plan is the one the scheduler would make
after N anyway, except that a request N finishes is still in it; such a plan is dropped and
made again. Planning ahead is skipped (the step runs as without overlap) where it could change
step N's results: a request of step N with a constraint (its matcher advances, and may jump
forward, only once the token is sampled), score rows (their log-probs read the positions before
booking), a prefill server's hand-off, or a pool with too few free pages to plan without
preempting (which would take pages from a request of the step in flight).

Invariant: at most one forward runs at a time, and none runs between `step` calls, so messages
the scheduler handles between steps (submissions, aborts, `call`) never race a forward.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.scheduling.request import Request, Status
from runtime.scheduling.step_output import book_step, process_step_output
from runtime.scheduling.step_plan import StepPlan, build_batch

if TYPE_CHECKING:
    from runtime.scheduling.scheduler import Scheduler


def _requests(plan: StepPlan) -> list[Request]:
    return plan.decodes + [item.req for item in plan.extends]


class OverlapRunner:
    """Runs each forward on a model thread and plans the next step meanwhile (see above)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        threads = torch.get_num_threads()
        self._model_thread = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="sgl-model",
            initializer=torch.set_num_threads,
            initargs=(threads,),
        )
        self._next: tuple[StepPlan, ForwardBatch, int] | None = None
        self.steps_planned_ahead = 0  # steps whose batch was built while the previous one ran

    def shutdown(self) -> None:
        self._model_thread.shutdown(wait=True)

    def step(self) -> bool:
        s = self.sched
        ready, self._next = self._next, None
        if ready is not None and self._still_valid(*ready):
            plan, batch, _ = ready
            self.steps_planned_ahead += 1
        else:
            plan = s.plan_step()
            if plan is None:
                return False
            batch = build_batch(plan, s.pool.page_size)
        future = self._model_thread.submit(self._forward, batch)
        ahead, booked = None, False
        try:
            if self._can_plan_ahead(plan):
                book_step(s, plan, None)
                booked = True
                waiting = len(s.waiting)
                next_plan = s.plan_step()
                if next_plan is not None:
                    ahead = (next_plan, build_batch(next_plan, s.pool.page_size, True), waiting)
        finally:
            logits, seconds = future.result()  # wait for the forward even if planning failed
        s.forward_s += seconds
        s.counters["forward_steps"] += 1
        process_step_output(s, plan, logits, booked=booked)
        if ahead is not None and self._fill(ahead[0], ahead[1]):
            self._next = ahead
        return True

    def _forward(self, batch: ForwardBatch) -> tuple[torch.Tensor, float]:
        start = time.perf_counter()
        logits = self.sched.model.forward(batch, self.sched.pool)
        return logits, time.perf_counter() - start

    def _can_plan_ahead(self, plan: StepPlan) -> bool:
        s = self.sched
        if plan.score_rows:
            return False
        if any(r.constraint is not None or r.handoff is not None for r in _requests(plan)):
            return False
        # every decoder's next slot, every prefill chunk and admission, with room to spare:
        # planning must never need to preempt
        free = s.pool.num_free_pages + (s.tree.evictable_pages if s.tree is not None else 0)
        need = 2 * s.max_running + s.chunk_tokens // s.pool.page_size + 2
        return free >= need

    def _still_valid(self, plan: StepPlan, batch: ForwardBatch, waiting: int) -> bool:
        """Every request of the plan still runs, and no request arrived that this step would
        have admitted."""
        s = self.sched
        running = {id(r) for r in s.running}
        for req in _requests(plan):
            if req.status is not Status.RUNNING or id(req) not in running or req.aborted:
                return False
        arrived = len(s.waiting) > waiting and len(s.running) < s.max_running
        return not arrived

    def _fill(self, plan: StepPlan, batch: ForwardBatch) -> bool:
        """Put step N's sampled tokens into the placeholders; False if the plan is stale."""
        for row, req in plan.pending_inputs:
            sampled = req.computed - len(req.prompt_ids) == len(req.output_ids) - 1
            if req.status is not Status.RUNNING or not sampled:
                return False
            batch.input_ids[row] = req.output_ids[-1]
        return True
