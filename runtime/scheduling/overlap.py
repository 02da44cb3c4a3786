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
from typing import Protocol

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.scheduling.request import Request, Status
from runtime.scheduling.step_plan import StepPlan, build_batch


class StepHost(Protocol):
    """What the overlap runner asks of the scheduler (which alone changes its queues)."""

    page_size: int

    def plan_step(self) -> StepPlan | None:
        """The next step's plan (admissions included), or None when nothing can run."""
        ...

    def run_model(self, batch: ForwardBatch) -> torch.Tensor:
        """The model's forward over `batch` (called on the model thread)."""
        ...

    def book_ahead(self, plan: StepPlan) -> None:
        """Count the plan's tokens as computed before its logits exist (no score rows)."""
        ...

    def complete_step(
        self, plan: StepPlan, logits: torch.Tensor, seconds: float, booked: bool
    ) -> None:
        """Sample, finish, stream: the step's outputs, and its forward time."""
        ...

    def room_to_plan_ahead(self) -> bool:
        """Enough free pages that planning the next step can never preempt."""
        ...

    def queue_state(self) -> tuple[int, bool]:
        """(waiting requests, whether another request could be admitted now)."""
        ...

    def is_running(self, req: Request) -> bool: ...


def _requests(plan: StepPlan) -> list[Request]:
    return plan.decodes + [item.req for item in plan.extends]


class OverlapRunner:
    """Runs each forward on a model thread and plans the next step meanwhile (see above)."""

    def __init__(self, host: StepHost) -> None:
        self.host = host
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
        h = self.host
        ready, self._next = self._next, None
        if ready is not None and self._still_valid(*ready):
            plan, batch, _ = ready
            self.steps_planned_ahead += 1
        else:
            plan = h.plan_step()
            if plan is None:
                return False
            batch = build_batch(plan, h.page_size)
        future = self._model_thread.submit(self._forward, batch)
        ahead, booked = None, False
        try:
            if self._can_plan_ahead(plan):
                h.book_ahead(plan)
                booked = True
                waiting, _ = h.queue_state()
                next_plan = h.plan_step()
                if next_plan is not None:
                    ahead = (next_plan, build_batch(next_plan, h.page_size, True), waiting)
        finally:
            logits, seconds = future.result()  # wait for the forward even if planning failed
        h.complete_step(plan, logits, seconds, booked)
        if ahead is not None and self._fill(ahead[0], ahead[1]):
            self._next = ahead
        return True

    def _forward(self, batch: ForwardBatch) -> tuple[torch.Tensor, float]:
        start = time.perf_counter()
        logits = self.host.run_model(batch)
        return logits, time.perf_counter() - start

    def _can_plan_ahead(self, plan: StepPlan) -> bool:
        if plan.score_rows:
            return False
        if any(r.constraint is not None or r.handoff is not None for r in _requests(plan)):
            return False
        # every decoder's next slot, every prefill chunk and admission, with room to spare:
        # planning must never need to preempt
        return self.host.room_to_plan_ahead()

    def _still_valid(self, plan: StepPlan, batch: ForwardBatch, waiting: int) -> bool:
        """Every request of the plan still runs, and no request arrived that this step would
        have admitted."""
        for req in _requests(plan):
            if req.status is not Status.RUNNING or not self.host.is_running(req) or req.aborted:
                return False
        now_waiting, can_admit = self.host.queue_state()
        arrived = now_waiting > waiting and can_admit
        return not arrived

    def _fill(self, plan: StepPlan, batch: ForwardBatch) -> bool:
        """Put step N's sampled tokens into the placeholders; False if the plan is stale."""
        for row, req in plan.pending_inputs:
            sampled = req.computed - len(req.prompt_ids) == len(req.output_ids) - 1
            if req.status is not Status.RUNNING or not sampled:
                return False
            batch.input_ids[row] = req.output_ids[-1]
        return True
