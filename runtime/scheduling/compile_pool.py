"""Constraint compilation off the serving process: worker processes with a time and a memory
budget, a cache of what they built, and cancellation.

A compile is pure Python (regex and schema trees, subset construction, token walks): on a
thread of the serving process it takes the GIL from the scheduler and the HTTP loop, so one
pathological constraint (`a{1000000}`, a 100,000-value enum) stalled every other request for as
long as it ran. Here it runs in a worker process (`compile_worker`, started on first use, one
interpreter each without torch); the serving process only receives the result: the automaton
and the first mask, built there (see `compile_worker`).

Budgets. A compile that has not finished within `timeout_s` (the server's
`--grammar-compile-timeout`, `Engine(grammar_compile_timeout_s=)`) is ended: its worker gets a
SIGKILL, the request gets a `CompileBudgetError` (a 400 naming the constraint and the limit) at
once, and only then is the worker reaped (a process that grew to gigabytes takes a while to
give its memory back) and replaced by the spare (below). The clock starts when the request
arrived (`arrival`, set by the HTTP layer; else at submission), so reading its body and the
chat template count, and a small part of the budget (`reply_reserve_s`) is kept for the answer
to reach the client: a refusal arrives within the budget the client set. For a constraint with
a large count or list (`largest_count`: the likely pathological ones) time spent waiting for a
busy or starting worker counts too, and one still queued when its budget runs out is refused
there (not cached); any other constraint gets its wait for a worker added back, so other
users' pathological compiles delay it but cannot make it fail. A compile that needs more than
`memory_mb` of address space fails in its worker with a MemoryError, the same way. A worker
that grew past `memory_mb / 2` while compiling is replaced after its job, so its memory does
not stay held. A worker that dies under a job (killed from outside) is replaced and the job
retried once, with a fresh budget (the death was not the constraint's doing); a second death,
or a worker that cannot start, is the server's failure (`CompileWorkerError`, a 503).

The budget is wall-clock time, but what it bounds is the constraint's cost: on a loaded machine a
worker may get a fraction of a core, and an ordinary constraint then reaches its deadline having
done a fraction of its work. A compile at its deadline whose worker had CPU for less than half
the budget gets more time (`_starved`), up to `_STARVED_GRACE` budgets from its submission;
refused then, its refusal says the worker was starved (`CompileStarvedError`, a 400) and is not
cached, so the same constraint is tried again once the machine is less busy.

The spare. One more worker is started (after the others are ready; by a pool started lazily,
on its first compile, only once a worker has been ended) and kept idle: a slot whose worker
was ended takes it at once, so the next constraint (a large one right after a refusal
too) is tried at once instead of waiting for an interpreter and a vocabulary to start; another
spare starts in the background. It costs one idle worker's memory (an interpreter with
`grammar`, numpy and the vocabulary: see docs/robustness.md).

Sharing. Results are cached per `grammar.Constraint` (its `key`) in this process (LRU,
`cache_size` entries; refusals too, so a pathological constraint sent again is answered at
once; not the refusals the constraint did not cause: a starved compile, a worker failure, a
cancellation), and a compile already under way is shared by every request that asks for the same
constraint. When every request waiting for a compile has been aborted, the compile is ended
(its worker killed and replaced).
"""

from __future__ import annotations

import collections
import contextvars
import logging
import os
import pickle
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from grammar.constraint import Constraint
from grammar.errors import GrammarError
from runtime.scheduling import compile_worker

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 2048
DEFAULT_WORKERS = 2
_REPO = Path(__file__).resolve().parents[2]
_POLL_S = 0.05
_STARVED_GRACE = 3.0  # a compile starved of CPU may run this many budgets (see `_starved`)
_START_TIMEOUT_S = 300.0
_SLOTS_FIRST_S = 60.0  # the spare starts once the slots' workers are ready (or after this)

# When the request that asks for a compile arrived (`time.monotonic()`), set by the HTTP layer
# for each request (and carried into the threads that serve it): a large constraint's budget
# counts from there, so the time its request spent before the compile (reading a large body,
# the chat template) is inside the budget the client sees. Unset: from submission.
arrival: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "sgl_request_arrival", default=None
)


def reply_reserve_s(timeout_s: float) -> float:
    """The part of a large constraint's budget kept back for its refusal to reach the client
    (the scheduler's pick-up, the HTTP answer): 5 % of the budget, at most half a second."""
    return min(0.5, 0.05 * timeout_s)


BUDGET_MARK = "compiling it went past the"  # in every CompileBudgetError's message


class CompileBudgetError(GrammarError):
    """A constraint whose compile went past its time or memory budget (a 400)."""

    def __init__(self, constraint: str, limit: str, value: str, culprit: str = "") -> None:
        self.constraint = constraint
        self.limit = limit
        why = f" ({culprit})" if culprit else ""
        super().__init__(
            f"{constraint}: {BUDGET_MARK} {limit} ({value}){why}; "
            "simplify the constraint (smaller repetition counts, fewer alternatives)"
        )


class CompileStarvedError(CompileBudgetError):
    """A compile ended by its wall-clock budget while its worker had CPU time for less than
    half of it (a loaded machine), or before a worker had started for it: a 400 as any budget
    refusal, but not cached, since the same constraint may compile in time once the machine is
    less busy."""


class CompileWorkerError(GrammarError):
    """The compile pool could not run the compile (no worker started, the worker died twice
    under it, the pool failed): the server's fault, answered 503 and not cached."""


class CompileCancelledError(GrammarError):
    """Every request waiting for the compile went away."""


@dataclass(slots=True)
class _Job:
    spec: Constraint
    future: Future
    deadline: float  # time.monotonic() when its time budget runs out (see `_new_job`)
    large: str = ""  # `largest_count`: a large count or list it has ("": none)
    waiters: list[Any] = field(default_factory=list)  # requests (`.aborted`) waiting for it
    pinned: bool = False  # someone waits who cannot be aborted (a blocking `compile`)
    taken: bool = False  # a worker thread has it (else it waits in the queue)
    submitted: float = 0.0  # time.monotonic() when it was submitted

    def cancelled(self) -> bool:
        waiting = [getattr(w, "aborted", False) for w in self.waiters]
        return not self.pinned and bool(waiting) and all(waiting)


class _Worker:
    """One worker process and its end of the socket."""

    def __init__(self, vocab_message: Callable[[], bytes], memory_mb: int) -> None:
        mine, theirs = socket.socketpair()
        budget = memory_mb * 2**20
        cmd = [sys.executable, "-c", compile_worker.LAUNCH, str(_REPO),
               compile_worker.__file__, str(theirs.fileno()), str(budget)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.started = time.monotonic()
        self.base_rss = 0
        self.is_ready = False
        self.condemned = False  # sent SIGKILL; reaped (`kill`) once its job has been answered
        # the spare's keeper and the slot that takes the spare may both wait for it to start
        self._ready_lock = threading.Lock()
        # `kill` runs once: the pool's shutdown and the slot's thread (a worker that died while
        # it waited) may both call it, and a second close of the socket could close an unrelated
        # descriptor that reused its number
        self._kill_lock = threading.Lock()
        self._killed = False
        # the vocabulary is larger than the socket's buffer: made and sent on a thread, so the
        # start does not wait for the new interpreter's imports (a spare is published at once)
        # and the interpreter starts while the vocabulary is still being read (a server's start)
        self._sender = threading.Thread(target=self._send, args=(vocab_message,),
                                        name="sgl-compile-vocab", daemon=True)  # fmt: skip
        self._sender.start()

    def _send(self, message: Callable[[], bytes]) -> None:
        try:
            self.conn.send_bytes(message())
        except OSError:  # it died (or was killed) while starting: `wait_ready` sees it
            self.condemn()
        except Exception:  # no vocabulary to send: the worker cannot start
            logger.exception("compile worker: no vocabulary for it")
            self.condemn()

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the worker has built its vocabulary (False: not within `timeout_s`);
        raises RuntimeError when it died or took longer than any start may."""
        with self._ready_lock:
            if self.is_ready:
                return True
            try:
                ready = self.conn.poll(timeout_s)
                if ready:
                    self.conn.recv_bytes()  # ("ready", vocab hash)
            except (EOFError, OSError):
                self.kill()
                raise RuntimeError("the compile worker died while starting") from None
            if not ready:
                if time.monotonic() - self.started > _START_TIMEOUT_S or not self.alive():
                    self.kill()
                    raise RuntimeError("the compile worker did not start")
                return False
            self.base_rss = self.rss()
            self.is_ready = True
            return True

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def usable(self) -> bool:
        return not self.condemned and self.alive()

    def rss(self) -> int:
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            return 0

    def cpu_s(self) -> float:
        """CPU seconds the process has used (user + system); 0.0 when unreadable."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def condemn(self) -> None:
        """SIGKILL, without waiting for the process to end (a large one takes a while to give
        its memory back): its job is answered first, `kill` reaps it after."""
        self.condemned = True
        with self._kill_lock:
            if not self._killed and self.proc.poll() is None:
                self.proc.kill()

    def kill(self) -> None:
        with self._kill_lock:
            if self._killed:
                return
            self._killed = True
        self.condemned = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        # (its peer gone, a send under way fails at once; closing under it could let its
        # next write reach a descriptor that reused the number)
        if self._sender is not threading.current_thread():
            self._sender.join(10)
        self.conn.close()


class CompilePool:
    """Compiles constraints in `workers` worker processes (started on first use), with
    `spares` more started and kept idle to replace a worker that is ended at once."""

    def __init__(
        self,
        vocab: Any,
        *,
        workers: int = DEFAULT_WORKERS,
        spares: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        cache_size: int = 128,
        prebuild: bool = True,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"grammar_compile_timeout_s must be positive, got {timeout_s}")
        self.vocab = vocab  # a callable returning the TokenVocabulary (built on first use)
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.n_workers = max(1, int(workers))
        self.n_spares = min(1, max(0, int(spares)))  # (one keeper: 0 or 1)
        self.cache_size = cache_size
        self.prebuild = prebuild
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self._inflight: dict[tuple, _Job] = {}
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._workers: list[_Worker | None] = []
        self._spare: _Worker | None = None
        self._spare_taken = threading.Event()
        self._clock: threading.Thread | None = None
        self._keeper: threading.Thread | None = None
        self._vocab_bytes: bytes | None = None
        self._vocab_lock = threading.Lock()
        self._closed = False
        self._next_id = 0
        self.restarts = 0  # workers replaced (timeouts, cancellations, deaths, recycling)
        self.spares_taken = 0  # replacements that found the spare there
        self.slot_starts = 0  # workers a slot had to start itself (first start or no spare)
        self.start_waits = 0  # jobs that waited for their worker to start
        # what happened, oldest first: ("answered", kind), ("reaped", pid), ("spare", pid)...
        self.events: collections.deque[tuple[str, Any]] = collections.deque(maxlen=256)

    # ---- the callers' side ---------------------------------------------------------------
    def submit(self, spec: Constraint, waiter: Any = None) -> Future:
        """A future of (compiled constraint, vocabulary, seconds); `waiter` (a request with
        `.aborted`) is counted for cancellation, None pins the compile."""
        key = spec.key
        with self._lock:
            if self._closed:
                raise RuntimeError("the compile pool is shut down")
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                fut: Future = Future()
                if isinstance(hit, BaseException):
                    fut.set_exception(_fresh(hit))
                else:
                    fut.set_result((hit, hit.vocab, 0.0))
                return fut
            job = self._inflight.get(key)
            if job is None:
                job = self._new_job(spec)
                self._inflight[key] = job
                self._jobs.put(job)
                self._start_threads()
            if waiter is None:
                job.pinned = True
            else:
                job.waiters.append(waiter)
            return job.future

    def _new_job(self, spec: Constraint) -> _Job:
        """The budget counts from the request's arrival (`arrival`; else from now), less the
        reserve for its answer. A constraint without a large count or list gets the time it
        then waits for a worker (others' compiles, a start) added back (`_serve`, `_run`)."""
        now = time.monotonic()
        since = min(now, arrival.get() or now)
        deadline = since + self.timeout_s - reply_reserve_s(self.timeout_s)
        return _Job(spec, Future(), deadline, largest_count(spec), submitted=now)

    def compile(self, spec: Constraint) -> Any:
        """The compiled constraint, blocking (raises its error)."""
        return self.submit(spec).result()[0]

    def clear(self) -> None:
        """Forget the compiled constraints (and refusals) kept here."""
        with self._lock:
            self._cache.clear()

    def worker_pids(self) -> list[int]:
        """The workers that are up and ready for a job (the spare not counted)."""
        with self._lock:
            return [w.pid for w in self._workers if w is not None and w.is_ready and w.usable()]

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether every slot's worker became ready within `timeout_s` (after `start`)."""
        deadline = time.monotonic() + timeout_s
        while len(self.worker_pids()) < self.n_workers:
            if self._closed or time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def spare_pid(self) -> int | None:
        """The spare worker's pid, once it is ready (else None)."""
        with self._lock:
            w = self._spare
            return w.pid if w is not None and w.is_ready and w.usable() else None

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._jobs.put(None)
            workers = [w for w in [*self._workers, self._spare] if w is not None]
        self._spare_taken.set()
        for w in workers:
            w.kill()

    # ---- the workers' side ---------------------------------------------------------------
    def _start_threads(self) -> None:
        while len(self._threads) < self.n_workers:
            slot = len(self._threads)
            self._workers.append(None)
            t = threading.Thread(
                target=self._serve, args=(slot,), name=f"sgl-compile-{slot}", daemon=True
            )
            self._threads.append(t)
            t.start()
        if self._clock is None:
            self._clock = threading.Thread(target=self._watch_queue, name="sgl-compile-clock",
                                           daemon=True)  # fmt: skip
            self._clock.start()

    def _start_keeper(self) -> None:
        """Start keeping a spare worker (once)."""
        with self._lock:
            if self._keeper is not None or not self.n_spares or self._closed:
                return
            self._keeper = threading.Thread(target=self._keep_spare, name="sgl-compile-spare",
                                            daemon=True)  # fmt: skip
            self._keeper.start()

    def _watch_queue(self) -> None:
        """Ends the jobs with a large count or list (`_Job.large`) still waiting for a worker
        when their budget, counted from their request's arrival, runs out."""
        while not self._closed:
            with self._lock:
                queued = [j.deadline for j in self._inflight.values() if j.large and not j.taken]
            now = time.monotonic()
            time.sleep(max(0.0, min([_POLL_S, *(d - now for d in queued)])))
            now = time.monotonic()
            with self._lock:
                late = [j for j in self._inflight.values()
                        if j.large and not j.taken and now >= j.deadline]  # fmt: skip
                for job in late:
                    job.taken = True  # a worker thread that gets it from the queue skips it
            for job in late:
                why = f"{job.large}; it waited for a compile worker"
                self._finish(job, self._timeout_error(job.spec, why), cache=False)

    def _vocab_message(self) -> bytes:
        with self._vocab_lock:  # (every worker gets the same: built once, by the first sender)
            if self._vocab_bytes is None:
                v = self.vocab()
                data = [v.token_bytes(i) for i in range(len(v))]
                specials = set(v.special_token_ids) - set(v.eos_token_ids)
                self._vocab_bytes = pickle.dumps((data, v.eos_token_ids, sorted(specials),
                                                  self.prebuild, v.token_names))  # fmt: skip
            return self._vocab_bytes

    def _keep_spare(self) -> None:
        """Keeps one started worker aside (started once the slots' own are ready, so the
        first requests do not share the cores with it): a slot whose worker was ended takes
        it at once instead of starting one (`_worker`), and another is started here."""
        until = time.monotonic() + _SLOTS_FIRST_S
        while not self._closed and time.monotonic() < until:
            if len(self.worker_pids()) >= self.n_workers:
                break
            time.sleep(0.2)
        while not self._closed:
            with self._lock:
                spare = self._spare
            try:
                if spare is None:
                    spare = _Worker(self._vocab_message, self.memory_mb)
                    with self._lock:
                        self._spare = spare
                        if self._closed:
                            spare.kill()
                            return
                    self.events.append(("spare started", spare.pid))
                elif not spare.wait_ready(1.0):
                    continue
                elif not spare.usable():  # killed while idle, from outside
                    self._drop_spare(spare)
                    continue
            except (OSError, RuntimeError):
                self._drop_spare(spare)
                if self._closed:
                    return
                logger.warning("the spare compile worker did not start", exc_info=True)
                time.sleep(1.0)
                continue
            if spare.is_ready:
                self._spare_taken.wait(1.0)
                self._spare_taken.clear()

    def _drop_spare(self, spare: _Worker | None) -> None:
        with self._lock:
            if spare is None or self._spare is not spare:
                return  # a slot took it meanwhile
            self._spare = None
        spare.kill()
        self.restarts += 1

    def _take_spare(self) -> _Worker | None:
        """The spare (ready or still starting), now the caller's; None when there is none."""
        with self._lock:
            w = self._spare
            if w is None or not w.usable():
                return None
            self._spare = None
            self.spares_taken += 1
        self._spare_taken.set()
        self.events.append(("spare taken", w.pid))
        return w

    def _worker(self, slot: int) -> _Worker:
        """The slot's worker: the spare, or one started here (not necessarily ready yet), when
        it had none or its worker was ended."""
        w = self._workers[slot]
        if w is not None and w.usable():
            return w
        if w is not None:
            self._retire(slot)
        w = self._take_spare()
        if w is None:
            w = _Worker(self._vocab_message, self.memory_mb)
            self.slot_starts += 1
        with self._lock:
            self._workers[slot] = w
            if self._closed:
                w.kill()
        return w

    def _ready_worker(self, slot: int) -> None:
        """Start the slot's worker (if it has none) and wait until it is ready."""
        try:
            w = self._worker(slot)
            while not self._closed and not w.wait_ready(1.0):
                pass
        except (OSError, RuntimeError):
            if self._closed:  # the pool shut down while the worker started
                return
            logger.warning("compile worker %d did not start", slot, exc_info=True)
            self._retire(slot)
            time.sleep(1.0)

    def _retire(self, slot: int) -> None:
        """Leave the slot empty; its worker is ended and reaped on a thread of its own (a
        process that grew to gigabytes takes a while to exit), so the slot takes the spare
        at once."""
        w = self._workers[slot]
        if w is not None:
            self._workers[slot] = None
            self.restarts += 1
            w.condemn()
            threading.Thread(target=self._reap, args=(w,), name="sgl-compile-reap",
                             daemon=True).start()  # fmt: skip
            self._start_keeper()

    def _reap(self, w: _Worker) -> None:
        w.kill()
        self.events.append(("reaped", w.pid))

    def start(self) -> None:
        """Start the workers now (else on the first compile), so that no request's compile
        waits for one to start, and the spare once they are ready (else after the first
        worker is ended: an in-process engine that never meets a pathological constraint
        does not pay for it)."""
        with self._lock:
            self._start_threads()
        self._start_keeper()

    def _serve(self, slot: int) -> None:
        while True:
            if not self._closed:  # a replacement starts while the slot is idle
                self._ready_worker(slot)
            try:
                job = self._jobs.get(timeout=1.0)
            except queue.Empty:
                continue  # (a worker that died idle is replaced above)
            if job is None:
                return
            with self._lock:
                if job.taken:  # its budget ran out while it waited (see _watch_queue)
                    continue
                job.taken = True
            if not job.large:  # the time it waited for others' compiles is not charged
                job.deadline += time.monotonic() - job.submitted
            try:
                outcome = self._run(slot, job)
            except BaseException as exc:  # the pool itself failed: the job must still end
                logger.exception("compile pool: job failed")
                outcome = CompileWorkerError(f"{job.spec.kind}: the compile failed: {exc}")
            self._finish(job, outcome)  # the answer first,
            w = self._workers[slot]
            if w is not None and w.condemned:
                self._retire(slot)  # then the ended worker goes (the spare takes its place)

    def _run(self, slot: int, job: _Job) -> Any:
        """The job's (compiled, vocab, seconds), or the exception it ends with."""
        for attempt in range(2):
            if job.cancelled():
                return CompileCancelledError("the requests waiting for this compile went away")
            try:
                worker = self._worker(slot)
                if not worker.is_ready:
                    self.start_waits += 1
                waiting = time.monotonic()
                while not worker.wait_ready(self._wait_s(job) if job.large else _POLL_S):
                    if job.cancelled():
                        return CompileCancelledError("the requests waiting for it went away")
                    if job.large and time.monotonic() >= job.deadline:  # (not cached)
                        why = f"{job.large}; it waited for a compile worker to start"
                        return self._timeout_error(job.spec, why, starved=True)
                if not job.large:  # (the wait for a worker to start is not its doing)
                    job.deadline += time.monotonic() - waiting
            except (OSError, RuntimeError) as exc:
                self._retire(slot)
                return CompileWorkerError(f"{job.spec.kind}: no compile worker: {exc}")
            outcome = self._on_worker(worker, job)
            if outcome != "died" or attempt == 1:
                break
            logger.warning("compile worker %d died under a job; retrying once", worker.pid)
            # the worker was killed from outside, not for the constraint: a fresh budget
            job.deadline = max(job.deadline, time.monotonic() + self.timeout_s)
        if outcome == "died":
            return CompileWorkerError(
                f"{job.spec.kind}: the compile worker died while compiling it"
            )
        return outcome

    @staticmethod
    def _wait_s(job: _Job) -> float:
        """How long to wait for the worker before looking at the job again: up to its
        deadline, at most `_POLL_S` (so a cancellation is seen soon)."""
        return max(0.0, min(_POLL_S, job.deadline - time.monotonic()))

    def _timeout_error(
        self, spec: Constraint, why: str, cpu_s: float | None = None, starved: bool = False
    ) -> CompileBudgetError:
        """The refusal of a compile past its time budget. `cpu_s`: the CPU seconds its worker
        spent on it; under half the budget, the machine (not the constraint) ran out the clock:
        the refusal says so and is not cached (`CompileStarvedError`). `starved`: the clock ran
        out before any worker took it (`why` says so); also a `CompileStarvedError`."""
        limit = f"{self.timeout_s:g} s"
        if cpu_s is not None and cpu_s < self.timeout_s / 2:
            why = f"{why + '; ' if why else ''}the worker had {cpu_s:.1f} s of CPU: loaded"
            starved = True
        if starved:
            return CompileStarvedError(_name(spec), "grammar compile timeout", limit, why)
        return CompileBudgetError(_name(spec), "grammar compile timeout", limit, why)

    def _starved(self, job: _Job, cpu_s: float) -> bool:
        """Whether a compile at its deadline gets more time: its worker had CPU for less than
        half the budget (a loaded machine ran out the clock, not the constraint) and it is
        within `_STARVED_GRACE` budgets of its submission. The deadline then moves by the CPU
        time it has left of that half."""
        now = time.monotonic()
        if cpu_s >= self.timeout_s / 2 or now >= job.submitted + _STARVED_GRACE * self.timeout_s:
            return False
        job.deadline = now + max(_POLL_S, self.timeout_s / 2 - cpu_s)
        return True

    def _on_worker(self, worker: _Worker, job: _Job) -> Any:
        """The job on `worker`: its outcome, or "died". A worker ended for the job (its time,
        its cancellation, the memory it grew to) is only condemned here (SIGKILL sent): the
        caller answers the job, then reaps it."""
        self._next_id += 1
        spec = job.spec
        try:
            # the value as its key's text: a deeply nested schema pickles past the recursion
            # limit, and JSON is what the worker would read anyway
            message = (self._next_id, spec.wire())
            cpu_at_send = worker.cpu_s()
            worker.conn.send_bytes(pickle.dumps(message))
        except OSError:
            worker.condemn()
            return "died"
        while True:
            try:
                ready = worker.conn.poll(self._wait_s(job))
            except OSError:
                ready = False
            if ready:
                break
            if not worker.alive():
                worker.condemn()
                return "died"
            if job.cancelled():
                worker.condemn()  # the only way to stop a compile: end its process
                return CompileCancelledError("the requests waiting for this compile went away")
            if time.monotonic() >= job.deadline:
                cpu_s = worker.cpu_s() - cpu_at_send
                if self._starved(job, cpu_s):
                    continue
                worker.condemn()
                self.events.append(("timeout", worker.pid))
                return self._timeout_error(spec, largest_count(spec), cpu_s)
        try:
            header = pickle.loads(worker.conn.recv_bytes())
            payload = worker.conn.recv_bytes()
        except (EOFError, OSError):
            worker.condemn()
            return "died"
        if worker.rss() - worker.base_rss > self.memory_mb * 2**20 // 2:
            worker.condemn()  # give the memory it grew to back
        return self._outcome(spec, header, payload)

    def _outcome(self, spec: Constraint, header: tuple, payload: bytes) -> Any:
        status = header[0]
        if status == "memory":
            limit = f"{self.memory_mb} MiB"
            return CompileBudgetError(
                _name(spec), "grammar compile memory budget", limit, largest_count(spec)
            )
        if status == "error":
            return _rebuild_error(*header[2:])
        vocab = self.vocab()
        packing = header[3] if len(header) > 3 else ""
        if packing == "portable":
            compiled = compile_worker.loads_portable(payload, vocab)
        elif packing == "whole":
            compiled = compile_worker.loads_whole(payload, vocab)
        else:  # checked within the budget there, but not packable: built here
            compiled = compile_worker.compile_constraint(spec, vocab)
        return compiled, vocab, header[2]

    def _finish(self, job: _Job, outcome: Any, cache: bool = True) -> None:
        key = job.spec.key
        with self._lock:
            if self._inflight.get(key) is job:
                self._inflight.pop(key)
            # (what the constraint did not cause is not kept: a cancellation, a starved
            # compile, a worker that died or could not start)
            transient = CompileCancelledError | CompileStarvedError | CompileWorkerError
            if cache and not isinstance(outcome, transient):
                refused = isinstance(outcome, BaseException)
                self._cache[key] = _fresh(outcome) if refused else outcome[0]
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        self.events.append(("answered", job.spec.kind))
        if isinstance(outcome, BaseException):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)


_COUNT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties",
                   "maxProperties", "minContains", "maxContains")  # fmt: skip
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_NOTABLE = 1000  # counts from here on are named in a budget error


def largest_count(spec: Constraint) -> str:
    """The constraint's largest repetition count or alternative list, as the likely reason a
    compile went past its budget ("" when none is large): `minLength 1000000 at #/x, unrolled
    into as many automaton states`, `enum of 100000 values at #`, `a repetition count of
    1000000`."""
    if spec.kind == "json_schema":
        best: tuple[int, str] = (0, "")
        stack: list[tuple[Any, str]] = [(spec.value, "#")]
        while stack and len(stack) < 100_000:
            node, ptr = stack.pop()
            if isinstance(node, list):
                stack += [(v, f"{ptr}/{i}") for i, v in enumerate(node[:1000])]
                continue
            if not isinstance(node, dict):
                continue
            for key, v in node.items():
                if key in _COUNT_KEYWORDS and isinstance(v, int) and v > best[0]:
                    best = (v, f"{key} {v} at {ptr}, unrolled into as many automaton states")
                elif key == "enum" and isinstance(v, list) and len(v) > best[0]:
                    best = (len(v), f"enum of {len(v)} values at {ptr}")
                elif isinstance(v, dict | list) and key not in ("enum", "const", "default"):
                    stack.append((v, f"{ptr}/{key}"))
        return best[1] if best[0] >= _NOTABLE else ""
    if spec.kind in ("regex", "ebnf", "grammar") and isinstance(spec.value, str):
        counts = [int(x) for m in _REPEAT.finditer(spec.value) for x in m.groups() if x]
        if counts and max(counts) >= _NOTABLE:
            return f"a repetition count of {max(counts)}"
    if spec.kind == "choices" and isinstance(spec.value, tuple) and len(spec.value) >= _NOTABLE:
        return f"{len(spec.value)} choices"
    return ""


def _name(spec: Constraint) -> str:
    return {"grammar": "grammar (lark)"}.get(spec.kind, spec.kind)


def _fresh(exc: BaseException) -> BaseException:
    """A copy of `exc` without a traceback. A cached refusal is handed out as a copy: raising
    one exception object again and again chains every raise's traceback onto it, and with them
    the frames of every request that met it (their locals: the request, a 100,000-value
    schema), kept for as long as the cache keeps the refusal."""
    copy = type(exc).__new__(type(exc))
    copy.args = exc.args
    copy.__dict__.update(exc.__dict__)
    return copy


def _rebuild_error(name: str, message: str, attrs: dict) -> GrammarError:
    import grammar.errors as errors

    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, GrammarError)):
        cls = GrammarError
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(attrs)
    return exc
