"""Constraint compilation off the serving process: worker processes with a time and a memory
budget, a cache of what they built, and cancellation.

A compile is pure Python (regex and schema trees, subset construction, token walks): on a
thread of the serving process it takes the GIL from the scheduler and the HTTP loop, so one
pathological constraint (`a{1000000}`, a 100,000-value enum) stalled every other request for as
long as it ran. Here it runs in a worker process (`compile_worker`, started on first use, one
interpreter each without torch); the serving process only receives the result: the automaton
and the first mask, built there (see `compile_worker`).

Budgets. A compile that has not finished within `timeout_s` (the server's
`--grammar-compile-timeout`, `Engine(grammar_compile_timeout_s=)`) is ended: its worker is
killed (its memory goes back to the system) and a fresh one started; the request gets a
`CompileBudgetError` (a 400 naming the constraint and the limit). For a constraint with a large
count or list (`largest_count`: the likely pathological ones) the clock starts at submission,
so time spent waiting for a busy or starting worker counts, and one still queued when its
budget runs out is refused there (not cached); any other constraint's clock starts when a
worker takes it, so other users' pathological compiles delay it but cannot make it fail. A
compile that needs more than `memory_mb` of address space fails in its worker with a
MemoryError, the same way. A worker that grew past `memory_mb / 2` while compiling is replaced
after its job, so its memory does not stay held. A worker that dies under a job (killed from
outside) is replaced and the job retried once, with a fresh budget (the death was not the
constraint's doing).

Sharing. Results are cached per (kind, constraint text, json_schema_mode) in this process (LRU,
`cache_size` entries; refusals too, so a pathological constraint sent again is answered at
once), and a compile already under way is shared by every request that asks for the same
constraint. When every request waiting for a compile has been aborted, the compile is ended
(its worker killed and replaced).
"""

from __future__ import annotations

import collections
import json
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
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from grammar.errors import GrammarError
from runtime.scheduling import compile_worker

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 2048
DEFAULT_WORKERS = 2
_REPO = Path(__file__).resolve().parents[2]
_POLL_S = 0.05
_START_TIMEOUT_S = 300.0


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


class CompileCancelledError(GrammarError):
    """Every request waiting for the compile went away."""


@dataclass(frozen=True, slots=True)
class CompileSpec:
    """One constraint to compile: `kind` one of compile_worker.KINDS, `value` its text (a
    JSON-able schema or structural tag, a list of choices, a dtype name), `mode` the
    json_schema_mode."""

    kind: str
    value: Any
    mode: str = "strict"
    whitespace: str | None = None  # a json_schema's whitespace pattern (None: compact)

    def key(self) -> tuple:
        text = self.value if isinstance(self.value, str) else json.dumps(self.value)
        if self.kind not in ("json_schema", "structural_tag"):  # (their JSON Schemas)
            return self.kind, text, "", None
        return self.kind, text, self.mode, self.whitespace


@dataclass(slots=True)
class _Job:
    spec: CompileSpec
    future: Future
    deadline: float  # time.monotonic() when its time budget runs out (counted from submission)
    large: str = ""  # `largest_count`: a large count or list it has ("": none)
    waiters: list[Any] = field(default_factory=list)  # requests (`.aborted`) waiting for it
    pinned: bool = False  # someone waits who cannot be aborted (a blocking `compile`)
    taken: bool = False  # a worker thread has it (else it waits in the queue)

    def cancelled(self) -> bool:
        waiting = [getattr(w, "aborted", False) for w in self.waiters]
        return not self.pinned and bool(waiting) and all(waiting)


class _Worker:
    """One worker process and its end of the socket."""

    def __init__(self, vocab_message: bytes, memory_mb: int) -> None:
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
        # `kill` runs once: the pool's shutdown and the slot's thread (a worker that died while
        # it waited) may both call it, and a second close of the socket could close an unrelated
        # descriptor that reused its number
        self._kill_lock = threading.Lock()
        self._killed = False
        try:
            self.conn.send_bytes(vocab_message)
        except OSError:
            self.kill()
            raise

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the worker has built its vocabulary (False: not within `timeout_s`);
        raises RuntimeError when it died or took longer than any start may."""
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
        self.is_ready = True
        self.base_rss = self.rss()
        return True

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            return 0

    def kill(self) -> None:
        with self._kill_lock:
            if self._killed:
                return
            self._killed = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()


class CompilePool:
    """Compiles constraints in `workers` worker processes (started on first use)."""

    def __init__(
        self,
        vocab: Any,
        *,
        workers: int = DEFAULT_WORKERS,
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
        self.cache_size = cache_size
        self.prebuild = prebuild
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self._inflight: dict[tuple, _Job] = {}
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._workers: list[_Worker | None] = []
        self._clock: threading.Thread | None = None
        self._closed = False
        self._next_id = 0
        self.restarts = 0  # workers replaced (timeouts, cancellations, deaths, recycling)

    # ---- the callers' side ---------------------------------------------------------------
    def submit(self, spec: CompileSpec, waiter: Any = None) -> Future:
        """A future of (compiled constraint, vocabulary, seconds); `waiter` (a request with
        `.aborted`) is counted for cancellation, None pins the compile."""
        key = spec.key()
        with self._lock:
            if self._closed:
                raise RuntimeError("the compile pool is shut down")
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                fut: Future = Future()
                if isinstance(hit, BaseException):
                    fut.set_exception(hit)
                else:
                    fut.set_result((hit, hit.vocab, 0.0))
                return fut
            job = self._inflight.get(key)
            if job is None:
                job = _Job(spec, Future(), time.monotonic() + self.timeout_s, largest_count(spec))
                self._inflight[key] = job
                self._jobs.put(job)
                self._start_threads()
            if waiter is None:
                job.pinned = True
            else:
                job.waiters.append(waiter)
            return job.future

    def compile(self, spec: CompileSpec) -> Any:
        """The compiled constraint, blocking (raises its error)."""
        return self.submit(spec).result()[0]

    def clear(self) -> None:
        """Forget the compiled constraints (and refusals) kept here."""
        with self._lock:
            self._cache.clear()

    def worker_pids(self) -> list[int]:
        """The workers that are up and ready for a job."""
        with self._lock:
            return [w.pid for w in self._workers if w is not None and w.is_ready and w.alive()]

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._jobs.put(None)
            workers = [w for w in self._workers if w is not None]
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

    def _watch_queue(self) -> None:
        """Ends the jobs with a large count or list (`_Job.large`) still waiting for a worker
        when their budget, counted from submission, runs out."""
        while not self._closed:
            time.sleep(_POLL_S)
            now = time.monotonic()
            with self._lock:
                late = [j for j in self._inflight.values()
                        if j.large and not j.taken and now > j.deadline]  # fmt: skip
                for job in late:
                    job.taken = True  # a worker thread that gets it from the queue skips it
            for job in late:
                why = f"{job.large}; it waited for a compile worker"
                self._finish(job, self._timeout_error(job.spec, why), cache=False)

    def _vocab_message(self) -> bytes:
        v = self.vocab()
        data = [v.token_bytes(i) for i in range(len(v))]
        specials = set(v.special_token_ids) - set(v.eos_token_ids)
        return pickle.dumps((data, v.eos_token_ids, sorted(specials), self.prebuild))

    def _worker(self, slot: int) -> _Worker:
        """The slot's worker, started (not necessarily ready yet) when it had none."""
        w = self._workers[slot]
        if w is not None and w.alive():
            return w
        if w is not None:
            w.kill()
            self.restarts += 1
        w = _Worker(self._vocab_message(), self.memory_mb)
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
        w = self._workers[slot]
        if w is not None:
            w.kill()
            self.restarts += 1
            self._workers[slot] = None

    def start(self) -> None:
        """Start the workers now (else on the first compile), so that no request's compile
        waits for one to start."""
        with self._lock:
            self._start_threads()

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
            if not job.large:  # it waited for others' compiles: its own budget starts now
                job.deadline = max(job.deadline, time.monotonic() + self.timeout_s)
            try:
                outcome = self._run(slot, job)
            except BaseException as exc:  # the pool itself failed: the job must still end
                logger.exception("compile pool: job failed")
                outcome = GrammarError(f"{job.spec.kind}: the compile failed: {exc}")
            self._finish(job, outcome)

    def _run(self, slot: int, job: _Job) -> Any:
        """The job's (compiled, vocab, seconds), or the exception it ends with."""
        for attempt in range(2):
            if job.cancelled():
                return CompileCancelledError("the requests waiting for this compile went away")
            try:
                worker = self._worker(slot)
                while not worker.wait_ready(_POLL_S):
                    if job.cancelled():
                        return CompileCancelledError("the requests waiting for it went away")
                    if job.large and time.monotonic() > job.deadline:
                        return self._timeout_error(job.spec, job.large)
                if not job.large:  # (the wait for a worker to start is not its doing)
                    job.deadline = max(job.deadline, time.monotonic() + self.timeout_s)
            except (OSError, RuntimeError) as exc:
                self._retire(slot)
                return GrammarError(f"{job.spec.kind}: no compile worker: {exc}")
            outcome = self._on_worker(slot, worker, job)
            if outcome != "died" or attempt == 1:
                break
            logger.warning("compile worker %d died under a job; retrying once", worker.pid)
            # the worker was killed from outside, not for the constraint: a fresh budget
            job.deadline = max(job.deadline, time.monotonic() + self.timeout_s)
        if outcome == "died":
            return GrammarError(f"{job.spec.kind}: the compile worker died while compiling it")
        return outcome

    def _timeout_error(self, spec: CompileSpec, why: str) -> CompileBudgetError:
        limit = f"{self.timeout_s:g} s"
        return CompileBudgetError(_name(spec), "grammar compile timeout", limit, why)

    def _on_worker(self, slot: int, worker: _Worker, job: _Job) -> Any:
        self._next_id += 1
        spec = job.spec
        try:
            # the value as its key's text: a deeply nested schema pickles past the recursion
            # limit, and JSON is what the worker would read anyway
            message = (self._next_id, spec.kind, spec.key()[1], spec.mode, spec.whitespace)
            worker.conn.send_bytes(pickle.dumps(message))
        except OSError:
            self._retire(slot)
            return "died"
        while True:
            try:
                ready = worker.conn.poll(_POLL_S)
            except OSError:
                ready = False
            if ready:
                break
            if not worker.alive():
                self._retire(slot)
                return "died"
            if job.cancelled():
                self._retire(slot)  # the only way to stop a compile: end its process
                return CompileCancelledError("the requests waiting for this compile went away")
            if time.monotonic() > job.deadline:
                self._retire(slot)
                return self._timeout_error(spec, largest_count(spec))
        try:
            header = pickle.loads(worker.conn.recv_bytes())
            payload = worker.conn.recv_bytes()
        except (EOFError, OSError):
            self._retire(slot)
            return "died"
        if worker.rss() - worker.base_rss > self.memory_mb * 2**20 // 2:
            self._retire(slot)  # give the memory it grew to back
        return self._outcome(spec, header, payload)

    def _outcome(self, spec: CompileSpec, header: tuple, payload: bytes) -> Any:
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
            compiled = compile_worker.compile_constraint(
                spec.kind, spec.value, spec.mode, vocab, spec.whitespace
            )
        return compiled, vocab, header[2]

    def _finish(self, job: _Job, outcome: Any, cache: bool = True) -> None:
        key = job.spec.key()
        with self._lock:
            if self._inflight.get(key) is job:
                self._inflight.pop(key)
            if cache and not isinstance(outcome, CompileCancelledError):
                self._cache[key] = outcome if isinstance(outcome, BaseException) else outcome[0]
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if isinstance(outcome, BaseException):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)


_COUNT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties",
                   "maxProperties", "minContains", "maxContains")  # fmt: skip
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_NOTABLE = 1000  # counts from here on are named in a budget error


def largest_count(spec: CompileSpec) -> str:
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
    if spec.kind == "choices" and isinstance(spec.value, list) and len(spec.value) >= _NOTABLE:
        return f"{len(spec.value)} choices"
    return ""


def _name(spec: CompileSpec) -> str:
    return {"grammar": "grammar (lark)"}.get(spec.kind, spec.kind)


def _rebuild_error(name: str, message: str, attrs: dict) -> GrammarError:
    import grammar.errors as errors

    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, GrammarError)):
        cls = GrammarError
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(attrs)
    return exc


_active: CompilePool | None = None


def register(pool: CompilePool | None) -> None:
    """The pool the server's request checks use (`active`): the engine's, one per process."""
    global _active
    _active = pool


def active() -> CompilePool | None:
    return _active
