"""Continuous batching on a background thread.

Each step: (1) every decoding request gets a slot for its next token, evicting cached pages or
preempting the newest request when the pool is full; (2) chunked prefills in progress go on;
(3) waiting requests are admitted, longest cached prefix first, until the prefill token budget
or the pool runs out; (4) one forward pass computes all of it; (5) tokens are sampled, finished
requests retire their pages into the radix cache.

Only the scheduler thread touches the pool, the tree and requests' state; other threads talk
to it through `submit`, `abort` and `call`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.device.runner import ModelRunner
from runtime.errors import KVTransferError, PromptTooLongError, WorkerError
from runtime.memory.hicache import HiCache
from runtime.memory.kv_pool import KVPool
from runtime.memory.pages import PageBook
from runtime.memory.radix_cache import MatchResult, RadixCache
from runtime.scheduling.constrained import ConstraintHooks
from runtime.scheduling.detokenize import Detokenizer
from runtime.scheduling.handoff import install_imported
from runtime.scheduling.overlap import OverlapRunner
from runtime.scheduling.request import Request, Status
from runtime.scheduling.step_plan import ExtendItem, StepPlan, VerifyItem, build_batch
from runtime.scheduling.step_results import (
    OutputContext,
    Speculation,
    StepResult,
    book_step,
    sample_step,
)

logger = logging.getLogger(__name__)


class Scheduler:
    """The one owner of the request queues (`waiting`, `running`) and the counters: the step's
    phases (plan, build, run, outputs, hand-off admission, overlap) get what they need and
    return what changed (`step_results.StepResult`), which only this class applies."""

    def __init__(
        self,
        model: ModelRunner,
        pool: KVPool,
        tree: RadixCache | None,
        detokenizer: Detokenizer,
        *,
        max_running: int,
        chunk_tokens: int,
        hooks: ConstraintHooks | None = None,
        overlap: bool = False,
        tier: HiCache | None = None,
        speculation: Speculation | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.page_size = pool.page_size
        self.tree = tree
        self.tier = tier  # the storage tier under the tree (hierarchical cache), or None
        self.book = PageBook(pool, tree, tier)
        self.detokenizer = detokenizer
        self.max_running = max_running
        self.chunk_tokens = max(chunk_tokens, pool.page_size)
        self.hooks = hooks  # constrained decoding; None when unused
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # decode side, mooncake: admitted, pages allocated, the transfer reading into them
        self.landing: list[Request] = []
        # prefill side, mooncake: finished, their pages held until the decode server read them
        self.held: list[Request] = []
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.generator = torch.Generator().manual_seed(0)
        self.counters = dict.fromkeys(
            ("prefill_computed", "prefill_cached", "prefill_cached_storage", "decode_tokens",
             "generated_tokens", "forward_steps", "preemptions", "requests_finished",
             "rank_restarts", "spec_verify_steps", "spec_draft_tokens", "spec_accepted_tokens",
             "spec_verify_tokens"),
            0,
        )  # fmt: skip
        self.busy_s = 0.0  # wall time of steps that ran a forward pass
        self.forward_s = 0.0  # of which the model's forward (the rest: scheduling, sampling)
        self._admit_clock = 0
        # speculative decoding (runtime/speculative), None when off; overlap is off beside it
        self.speculation = speculation
        if speculation is not None:
            speculation.bind_clock(model)
        self._outputs = OutputContext(pool, self.book, detokenizer, hooks, self.generator,
                                      model.config.vocab_size, speculation)  # fmt: skip
        # overlap.py: plan step N+1 while step N's forward runs on a model thread
        self.overlap = OverlapRunner(self) if overlap and speculation is None else None
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="sgl-scheduler", daemon=True)
        self._thread.start()

    # ---- called from other threads -------------------------------------------------------
    def submit(self, req: Request) -> None:
        self.inbox.put(("req", req))

    def abort(self, req: Request) -> None:
        req.aborted = True
        self.inbox.put(("abort", req))

    def wake(self) -> None:
        """Something a step waits for happened elsewhere (a transfer ended): look again."""
        self.inbox.put(("wake", None))

    def post(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the scheduler thread between steps, without waiting for it."""
        self.inbox.put(("post", fn))

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the scheduler thread between steps and return its result."""
        done: queue.SimpleQueue = queue.SimpleQueue()
        self.inbox.put(("call", (fn, done)))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def shutdown(self) -> None:
        self._stop = True
        self.inbox.put(("wake", None))
        if self.hooks is not None:
            self.hooks.shutdown()
        self._thread.join(timeout=30)
        if self.overlap is not None:
            self.overlap.shutdown()

    # ---- the loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop:
            if not self.waiting and not self.running and not self.landing:
                self._handle(self.inbox.get())  # idle: sleep until something arrives
            while True:
                try:
                    self._handle(self.inbox.get_nowait())
                except queue.Empty:
                    break
            if self._stop:
                break
            try:
                self._reap_aborted()
                if self.model.failed and self._restartable():
                    self._recover_ranks(WorkerError(f"parallel engine: {self.model.failed}"))
                t0 = time.perf_counter()
                if self.step():
                    self.busy_s += time.perf_counter() - t0
                else:  # nothing could run (e.g. grammars compiling): wait for a message
                    try:
                        self._handle(self.inbox.get(timeout=0.05))
                    except queue.Empty:
                        pass
            except WorkerError as exc:
                if not self._restartable():
                    self._abort_all(exc)
                else:
                    self._recover_ranks(exc)
            except Exception as exc:  # a bug or a bad input must not kill the engine
                logger.exception("scheduler step failed; aborting the requests in flight")
                self._abort_all(exc)
        for req in list(self.running) + list(self.waiting) + list(self.landing):
            req.error = RuntimeError("engine shut down")
            self.finish(req, "abort")

    def _abort_all(self, exc: BaseException) -> None:
        """End every request in flight or waiting with `exc` (a step failed; one of them may
        be the cause, so none is retried)."""
        for req in list(self.running):
            req.error = exc
            self.finish(req, "abort")
        while self.waiting:
            req = self.waiting.popleft()
            req.error = exc
            self._deliver_finished(req, "abort")

    def _restartable(self) -> bool:
        return self.model.restartable

    def _recover_ranks(self, exc: WorkerError) -> None:
        """A rank of the parallel engine died: its KV is gone. The running requests go back to
        the queue (their tokens so far kept, their KV recomputed, as after a preemption; one
        that was running at two rank failures is ended instead: it may be the cause), the
        radix cache is emptied (its KV lived on the ranks too) and the ranks are restarted.
        The waiting requests wait meanwhile."""
        logger.error("%s; requeueing %d running requests, restarting the ranks", exc,
                     len(self.running))  # fmt: skip
        for req in sorted(self.running, key=lambda r: r.admit_order, reverse=True):
            req.rank_failures += 1
            if req.rank_failures >= 2 or req.handoff is not None or req.imported is not None:
                req.error = exc
                self.finish(req, "abort")
            else:
                self.preempt(req)
        if self.tree is not None:
            self.tree.evict(self.tree.evictable_pages)
        try:
            self.model.restart()
        except Exception as err:  # no ranks: nothing can run; the next request tries again
            logger.exception("restarting the parallel engine's ranks failed")
            self._abort_all(err)
            return
        self.counters["rank_restarts"] += 1

    def _handle(self, item: tuple[str, Any] | None) -> None:
        if item is None:
            return
        kind, payload = item
        if kind == "req":
            self._accept(payload)
        elif kind == "abort":
            self._reap_aborted()
        elif kind == "wake":  # a compile ended
            self._reap_refused()
        elif kind == "post":
            try:
                payload()
            except Exception:
                logger.exception("a posted scheduler task failed")
        elif kind == "call":
            fn, done = payload
            try:
                done.put((True, fn()))
            except BaseException as exc:  # handed back to the caller
                done.put((False, exc))

    def _accept(self, req: Request) -> None:
        if req.finish_reason is not None:  # failed before reaching the scheduler
            self._deliver(req)
            return
        if req.seq_len + 1 > self.pool.capacity_tokens:
            req.error = PromptTooLongError(
                f"prompt of {req.seq_len} tokens does not fit in the KV pool "
                f"({self.pool.capacity_tokens} tokens); raise mem_budget_gb"
            )
            self._deliver_finished(req, "abort")
            return
        limit = self.model.config.max_position_embeddings
        if req.seq_len + 1 > limit:
            req.error = PromptTooLongError(
                f"prompt of {req.seq_len} tokens exceeds the model's context of {limit} tokens"
            )
            self._deliver_finished(req, "abort")
            return
        self.waiting.append(req)

    def _reap_refused(self) -> None:
        """The waiting requests whose constraint failed to compile leave the queue now, with
        that error (a refusal goes out when it is known, not when admission reaches it)."""
        for req in [r for r in self.waiting if r.constraint is not None and r.constraint.refused()]:
            self.constraint_ready(req)

    def _reap_aborted(self) -> None:
        for req in [r for r in self.waiting if r.aborted]:
            self.waiting.remove(req)
            self._deliver_finished(req, "abort")
        for req in [r for r in self.running if r.aborted]:
            self.finish(req, "abort")

    # ---- one step ----------------------------------------------------------------------------
    def step(self) -> bool:
        """Plan, run and process one forward pass; False when there was nothing to do."""
        if self.overlap is not None:
            return self.overlap.step()
        clock = self.speculation.clock if self.speculation is not None else time.perf_counter
        planned = clock()
        plan = self.plan_step()
        if plan is None:
            return False
        batch = build_batch(plan, self.page_size)
        start = time.perf_counter()
        logits = self.run_model(batch)
        self.complete_step(plan, logits, time.perf_counter() - start, booked=False)
        if self.speculation is not None:  # what decode and verify steps cost, as measured
            self.speculation.observe(plan, clock() - planned, batch.num_tokens)
        return True

    # ---- the phases' results, applied here (overlap.StepHost) ----------------------------------
    def run_model(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model.forward(batch, self.pool)

    def book_ahead(self, plan: StepPlan) -> None:
        self._apply(book_step(self._outputs, plan, None))

    def complete_step(
        self, plan: StepPlan, logits: torch.Tensor, seconds: float, booked: bool
    ) -> None:
        self.forward_s += seconds
        self.counters["forward_steps"] += 1
        if self.tier is not None:  # what recomputing a prompt token costs, as measured
            self.tier.note_compute(sum(item.length for item in plan.extends), seconds)
        if not booked:
            self._apply(book_step(self._outputs, plan, logits))
        self._apply(sample_step(self._outputs, plan, logits))

    def room_to_plan_ahead(self) -> bool:
        free = self.pool.num_free_pages + (self.tree.evictable_pages if self.tree else 0)
        return free >= 2 * self.max_running + self.chunk_tokens // self.page_size + 2

    def queue_state(self) -> tuple[int, bool]:
        return len(self.waiting), len(self.running) < self.max_running

    def is_running(self, req: Request) -> bool:
        return req in self.running

    def _apply(self, result: StepResult) -> None:
        for name, count in result.counts.items():
            self.counters[name] += count
        for req, reason in result.finished:
            self.finish(req, reason)

    def plan_step(self) -> StepPlan | None:
        """Who decodes, who extends by how much, who is admitted; None when nothing can run."""
        if self.landing:
            self._land()  # transfers that ended: decode from here, or end with the error
        if self.waiting and any(r.imported is not None for r in self.waiting):
            self._admit_imported()  # KV that arrived from a prefill server: no prefill here
        plan = StepPlan()
        self._plan_decodes(plan)
        budget = self.chunk_tokens
        for req in sorted(self.running, key=lambda r: r.admit_order):
            if req.prefill_done or budget <= 0 or req in plan.decodes:
                continue
            length = min(req.seq_len - req.computed, budget)
            if self.book.reserve(req, req.computed + length):
                plan.extends.append(ExtendItem(req, req.computed, length))
                budget -= length
        budget = self._admit(plan, budget)
        if self.speculation is not None:
            self._speculate(plan, self.speculation)
        if not plan:
            if self.running:  # everyone is stuck waiting for pages: free some
                self.preempt(max(self.running, key=lambda r: r.admit_order))
            return None
        return plan

    def _plan_decodes(self, plan: StepPlan) -> None:
        decoders = [r for r in self.running if r.prefill_done]
        decoders.sort(key=lambda r: r.admit_order)
        for req in decoders:
            if req.status is not Status.RUNNING:
                continue  # preempted below to make room for an older request
            while not self.book.reserve(req, req.computed + 1):
                victim = max(self.running, key=lambda r: r.admit_order)
                if victim is req and len(self.running) == 1:
                    req.error = RuntimeError("KV pool exhausted by a single request")
                    self.finish(req, "length")
                    break
                if victim in plan.decodes:
                    plan.decodes.remove(victim)
                self.preempt(victim)
                if victim is req:
                    break
            else:
                plan.decodes.append(req)

    def _speculate(self, plan: StepPlan, spec: Speculation) -> None:
        """Decodes (and extends that end a jumped request's forced text) whose request gets
        drafts become verifies: the same tokens, then the drafts, in one extend. Not when more
        than `spec.max_batch` requests decode this step (verifying would cost more than it
        saves)."""
        jumped = [i for i in plan.extends if i.req.output_ids and i.end == i.req.seq_len
                  and i.req.logprob_start is None and i.req.handoff is None]  # fmt: skip
        batch = len(plan.decodes) + len(jumped)
        if batch > spec.max_batch:
            return
        items = []  # (request, most drafts it has room for), its decode or extend item
        for req, entry in [(r, r) for r in plan.decodes] + [(e.req, e) for e in jumped]:
            room = min(req.params.max_new_tokens - len(req.output_ids) - 1,
                       self.model.config.max_position_embeddings - req.seq_len - 1)  # fmt: skip
            if room > 0:
                items.append(((req, room), entry))
        if not items:
            return
        proposed = spec.propose([i for i, _ in items], batch)
        for ((req, _), entry), drafts in zip(items, proposed, strict=True):
            if not drafts or not self.book.reserve(req, req.seq_len + len(drafts)):
                continue
            (plan.decodes if entry is req else plan.extends).remove(entry)
            plan.verifies.append(VerifyItem(req, req.computed, drafts))

    def _admit(self, plan: StepPlan, budget: int) -> int:
        if not self.waiting or budget <= 0 or len(self.running) >= self.max_running:
            return budget
        extending = [i.req for i in plan.extends]
        candidates = []
        for order, req in enumerate(self.waiting):
            if req.imported is not None:
                continue  # admitted by _admit_imported
            # never reuse the last token (its logits are needed) nor a scored position
            cap = req.seq_len - 1 if req.logprob_start is None else req.logprob_start - 1
            match = self.book.match(req.seq, cap)
            candidates.append((match.length, order, cap, req))
        candidates.sort(key=lambda c: (-c[0], c[1]))
        for _, _, cap, req in candidates:
            if budget <= 0 or len(self.running) >= self.max_running:
                break
            if not self.constraint_ready(req):
                continue
            # match again: admitting the previous candidate may have evicted pages
            match = self.book.match(req.seq, cap)
            # then the storage tier's pages after the tree's (hierarchical cache)
            match, loaded = self.book.load_from_tier(req.seq, cap, match)
            if self._shares_pending_prefix(req, match.length, extending):
                continue  # wait: another request is computing the same prefix right now
            length = min(req.seq_len - match.length, budget)
            if not self._admit_request(req, match, match.length + length):
                break
            self.counters["prefill_cached_storage"] += loaded
            plan.extends.append(ExtendItem(req, req.computed, length))
            extending.append(req)
            budget -= length
        return budget

    def _admit_imported(self) -> None:
        """Admit the waiting requests that carry transferred KV, oldest first, while room
        lasts: the same admission as any request, then their pages are written in."""
        for req in [r for r in self.waiting if r.imported is not None]:
            landing = req.imported.landing
            if landing is not None and not landing.pending:  # the transfer gave up waiting
                self.waiting.remove(req)
                req.error = landing.error
                self._deliver_finished(req, "abort")
                continue
            if len(self.running) + len(self.landing) >= self.max_running:
                return
            if not self.constraint_ready(req):
                continue
            tokens = req.imported.kv_tokens
            match = self.book.match(req.seq, tokens)
            if not self._admit_request(req, match, tokens + 1, landing=landing is not None):
                return  # the pool is full: try again after a step has freed pages
            if landing is not None:  # mooncake: the pages first, then the read fills them
                first, last = match.length // self.page_size, -(-tokens // self.page_size)
                if not landing.place(first, req.pages[first:last]):
                    self._land()  # it gave up meanwhile: free them now
                continue
            self._apply(install_imported(self._outputs, req, match.length))

    def _land(self) -> None:
        """Landing requests whose read has ended: those that got their KV run from their first
        token; the others give their pages back and end with the transfer's error."""
        for req in [r for r in self.landing if not r.imported.landing.pending]:
            self.landing.remove(req)
            landing = req.imported.landing
            if landing.state != "landed" or req.aborted:
                self.book.release(req)  # nothing past the radix cache's prefix was booked
                req.error = landing.error if landing.state != "landed" else req.error
                self._deliver_finished(req, "abort")
                continue
            self._enter_running(req, req.cached)
            self._apply(install_imported(self._outputs, req, req.cached))

    def _admit_request(
        self, req: Request, match: MatchResult, upto: int, landing: bool = False
    ) -> bool:
        """The one admission path (plain and imported requests): pages for positions up to
        `upto` after the cached `match`, then the request moves from waiting to running (or,
        `landing`, to `self.landing` until a transfer has filled the pages: `_land`). False
        (nothing changed) when the pool has no room."""
        if not self.book.admit(req, match, upto):
            return False
        self.waiting.remove(req)
        if landing:
            self.landing.append(req)
        else:
            self._enter_running(req, match.length)
        return True

    def _enter_running(self, req: Request, matched: int) -> None:
        req.status = Status.RUNNING
        self._admit_clock += 1
        req.admit_order = self._admit_clock
        if req.cached_tokens_at_admission is None:
            req.cached_tokens_at_admission = matched
        self.counters["prefill_cached"] += matched
        self.running.append(req)

    def constraint_ready(self, req: Request) -> bool:
        """Whether a waiting request may be admitted: True unless its constraint is still
        compiling; one whose grammar failed to compile leaves the queue with that error."""
        if self.hooks is None:
            return True
        ok = self.hooks.admissible(req)
        if ok is True:
            return True
        if ok is not False:  # its grammar failed to compile
            self.waiting.remove(req)
            req.imported = None
            req.error = ok
            self._deliver_finished(req, "abort")
        return False

    def _shares_pending_prefix(self, req: Request, matched: int, extending: list[Request]) -> bool:
        if self.tree is None:
            return False
        need = matched + self.pool.page_size
        seq = req.seq
        for other in extending:
            other_seq = other.seq
            if len(other_seq) >= need and len(seq) > need and seq[:need] == other_seq[:need]:
                return True
        return False

    # ---- state transitions -----------------------------------------------------------------
    def preempt(self, req: Request) -> None:
        """Give back a running request's pages (keeping them in the tree) and requeue it."""
        self.book.release(req)
        if self.speculation is not None:
            self.speculation.release(req)
        self.running.remove(req)
        req.status = Status.WAITING
        req.prefill_done = False
        self.waiting.appendleft(req)
        self.counters["preemptions"] += 1

    def finish(self, req: Request, reason: str) -> None:
        if self.speculation is not None:
            self.speculation.release(req)
        if req in self.running:
            self.running.remove(req)
            if req.handoff is not None and req.handoff.keeps_pages:
                self._hold(req)
            else:
                self.book.release(req)
        self._deliver_finished(req, reason)

    def _hold(self, req: Request) -> None:
        """Prefill side, mooncake: the decode server reads the finished request's pages where
        they are, so they stay its own until the room has ended (read, failed, timed out)."""
        self.held.append(req)

        def release() -> None:
            if req in self.held:
                self.held.remove(req)
                self.book.release(req)

        req.handoff.when_sent(lambda: self.post(release))

    def _deliver_finished(self, req: Request, reason: str) -> None:
        if req.imported is not None and req.imported.landing is not None:
            req.imported.landing.end(KVTransferError(f"the request ended ({reason})"))
        req.finish_reason = req.finish_reason or reason
        if reason == "abort":
            req.finish_reason = "abort"
        req.status = Status.FINISHED
        self.detokenizer.finalize_text(req)
        self.counters["requests_finished"] += 1
        self._deliver(req)

    def _deliver(self, req: Request) -> None:
        if req.stream:
            req.outbox.put(self.detokenizer.stream_chunk(req, finished=True))
        else:
            req.outbox.put(req.to_result())

    def check_integrity(self) -> None:
        self.book.check_integrity(self.running + self.landing + self.held)
