"""Constraint compiles run in worker processes with a time and a memory budget: a pathological
compile never holds up a plain request, ends in a typed error naming the constraint and the
limit (a 400 on the server), a killed worker is replaced, results are shared, and a cancelled
request ends its compile."""

from __future__ import annotations

import contextvars
import os
import signal
import threading
import time

import httpx
import pytest

from grammar.constraint import Constraint
from grammar.errors import GrammarError
from runtime import Engine
from runtime.scheduling import compile_worker
from runtime.scheduling.compile_pool import (
    CompileBudgetError,
    CompileCancelledError,
    CompilePool,
    CompileStarvedError,
    CompileWorkerError,
    arrival,
    largest_count,
)
from tests.support.server_process import shared_server
from tests.support.tiny_models import make_tiny_model

PROMPT = "Give me the data:"
HUGE = "a{1000000}"  # a million-state automaton: minutes of work, gigabytes of it


def _wait_for(cond, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-isolation"), seed=7)
    with Engine(folder, page_size=4, max_total_tokens=4096, grammar_compile_timeout_s=4) as e:
        pool = e.scheduler.hooks.compiles
        # the workers ready before the first test (as a server waits for them before it says it
        # is up): a large constraint's budget counts from its submission, so one that waited for
        # a worker to start would be refused uncached
        assert e.scheduler.hooks.wait_ready(120)
        assert len(pool.worker_pids()) == pool.n_workers  # at once, not eventually
        yield e


def test_a_server_is_up_only_once_its_compile_workers_are_ready():
    server = shared_server()
    log = server.logs(tail=None)  # the whole log: the shared server's other tests add to it
    assert "constraints ready in" in log, log[-2000:]
    assert log.index("constraints ready in") < log.index("Uvicorn running on")


@pytest.fixture(scope="module")
def vocab(engine):
    return engine.scheduler.hooks.vocab()


def test_a_pathological_compile_does_not_hold_up_a_plain_request(engine):
    done: list[str] = []
    bad: dict = {}

    def pathological() -> None:
        (bad["r"],) = engine.generate([PROMPT], regex=HUGE, max_new_tokens=4)
        done.append("pathological")

    t = threading.Thread(target=pathological)
    t.start()
    assert _wait_for(lambda: engine.scheduler.hooks.compiles._inflight)  # compiling now
    plain = engine.generate(PROMPT, max_new_tokens=8, temperature=0.0)
    done.append("plain")
    t.join()
    assert plain.finish_reason == "length" and len(plain.token_ids) == 8
    assert done == ["plain", "pathological"]  # the plain one never waited for the compile
    r = bad["r"]
    assert r.finish_reason == "abort"
    assert "regex" in r.error and "grammar compile timeout (4 s)" in r.error
    assert "a repetition count of 1000000" in r.error  # the likely reason, named
    # refused again at once from the cache, without another compile
    (again,) = engine.generate([PROMPT], regex=HUGE, max_new_tokens=4)
    assert again.error == r.error


@pytest.mark.parametrize(
    ("kind", "value", "named"),
    [
        (
            "json_schema",
            {"properties": {"x": {"minLength": 10**6}}},
            "minLength 1000000 at #/properties/x, unrolled into as many automaton states",
        ),
        (
            "json_schema",
            {"type": "array", "minItems": 10**5},
            "minItems 100000 at #, unrolled into as many automaton states",
        ),
        (
            "json_schema",
            {"anyOf": [{"enum": list(range(10**5))}]},
            "enum of 100000 values at #/anyOf/0",
        ),
        ("regex", "x(ab|cd){20000}", "a repetition count of 20000"),
        ("regex", "(a|b)*a(a|b){22}", ""),
        ("json_schema", {"type": "string", "maxLength": 12}, ""),
    ],
)
def test_a_budget_refusal_names_the_largest_count(kind, value, named):
    assert largest_count(Constraint.of(kind, value)) == named


def test_compiles_are_shared_and_cached(engine):
    pool = engine.scheduler.hooks.compiles
    spec = Constraint.of("regex", "(yes|no) [0-9]{1,3}")
    first = pool.submit(spec)
    assert pool.submit(spec) is first or first.done()  # one compile for both
    g1 = first.result()[0]
    assert pool.compile(spec) is g1
    out = engine.generate(PROMPT, regex=spec.value, max_new_tokens=12, temperature=0.0)
    assert out.error is None


def test_a_cached_refusal_is_handed_out_as_a_copy(engine):
    # raising one exception object again and again would chain every raise's traceback onto
    # it, and with them the frames (the requests, their schemas) of everyone who met it
    pool = engine.scheduler.hooks.compiles
    spec = Constraint.of("regex", "(unclosed")
    errors = []
    for _ in range(3):
        with pytest.raises(GrammarError) as err:
            pool.compile(spec)
        errors.append(err.value)
    assert len({id(e) for e in errors}) == 3 and len({str(e) for e in errors}) == 1
    assert pool._cache[spec.key].__traceback__ is None


def test_a_killed_worker_is_replaced_and_its_job_retried(engine):
    pool = engine.scheduler.hooks.compiles
    assert _wait_for(lambda: len(pool.worker_pids()) == pool.n_workers)
    before = set(pool.worker_pids())
    for pid in before:  # idle workers killed from outside
        os.kill(pid, signal.SIGKILL)
    out = engine.generate(PROMPT, regex="[0-9]{3}-[a-z]{2}", max_new_tokens=12)
    assert out.error is None and out.finish_reason in ("stop", "length")
    assert _wait_for(lambda: len(pool.worker_pids()) == pool.n_workers)
    assert not before & set(pool.worker_pids())
    # killed under a job: retried on a fresh worker (and refused there by the time budget)
    restarts = pool.restarts
    fut = pool.submit(Constraint.of("regex", "b{1000000}"))
    assert _wait_for(lambda: pool._inflight)
    time.sleep(0.5)
    for pid in pool.worker_pids():
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(CompileBudgetError, match="grammar compile timeout"):
        fut.result(timeout=120)
    assert _wait_for(lambda: pool.restarts > restarts)


def test_a_cancelled_request_cancels_its_compile(engine):
    pool = engine.scheduler.hooks.compiles
    pool.timeout_s = 600  # only the cancellation can end this compile soon
    try:
        assert _wait_for(lambda: len(pool.worker_pids()) == pool.n_workers)  # idle, ready
        restarts = pool.restarts
        stream = engine.generate(PROMPT, regex="c{1000000}", max_new_tokens=4, stream=True)
        assert _wait_for(lambda: pool._inflight)
        (job,) = pool._inflight.values()
        time.sleep(0.5)  # on its worker by now
        stream.close()  # the client went away
        with pytest.raises(CompileCancelledError):
            job.future.result(timeout=120)
        assert _wait_for(lambda: pool.restarts > restarts)  # its worker was ended
        assert _wait_for(lambda: len(pool.worker_pids()) == pool.n_workers)
    finally:
        pool.timeout_s = 4
    out = engine.generate(PROMPT, regex="[xy]{4}", max_new_tokens=8)
    assert out.error is None
    engine.check_integrity()


def test_a_compile_past_its_memory_budget_is_refused_naming_it(vocab):
    pool = CompilePool(lambda: vocab, workers=1, timeout_s=300, memory_mb=64, prebuild=False)
    try:
        with pytest.raises(CompileBudgetError, match="memory budget .64 MiB"):
            pool.compile(Constraint.of("regex", HUGE))
        assert pool.compile(Constraint.of("regex", "[a-c]+")) is not None  # the pool goes on
    finally:
        pool.shutdown()


def test_a_large_constraints_budget_counts_from_its_requests_arrival(vocab):
    # one worker, busy with a pathological compile: a large constraint queued behind it, from
    # a request that arrived 4.5 s ago, is refused when its budget, counted from that arrival,
    # runs out (not given a fresh budget once the worker is free; that refusal is not cached);
    # a simple constraint queued beside it waits and compiles (others' compiles delay it but
    # do not make it fail)
    # (6 s budgets: the large one's ends ~1.2 s from now, the busy one's ~6 s: a loaded machine
    # leaves that gap)
    pool = CompilePool(lambda: vocab, workers=1, timeout_s=6, prebuild=False)
    try:
        pool.start()
        assert _wait_for(lambda: len(pool.worker_pids()) == 1)
        busy = pool.submit(Constraint.of("regex", "d{1000000}"))
        request = contextvars.copy_context()
        request.run(arrival.set, time.monotonic() - 4.5)
        large = request.run(pool.submit, Constraint.of("regex", "e{1000000}"))
        simple = pool.submit(Constraint.of("regex", "[0-9]{3}"))
        with pytest.raises(CompileBudgetError, match="it waited for a compile worker"):
            large.result(timeout=120)
        assert not busy.done()  # refused while the worker was still busy: from its arrival
        with pytest.raises(CompileBudgetError, match="a repetition count of 1000000"):
            busy.result(timeout=120)
        assert simple.result(timeout=120)[0] is not None
        assert pool._cache.get(Constraint.of("regex", "e{1000000}").key) is None
    finally:
        pool.shutdown()


def test_a_compile_starved_of_cpu_gets_more_time_and_its_refusal_is_not_cached(vocab):
    # the worker stopped (SIGSTOP: no CPU at all, as on a machine loaded far past its cores)
    # past the 1.5 s budget: not refused at its deadline, answered once it runs again; stopped
    # for good, refused at three budgets saying it was starved, and that refusal is not kept:
    # the same constraint sent again compiles on the replacement worker
    pool = CompilePool(lambda: vocab, workers=1, timeout_s=1.5, prebuild=False)
    try:
        pool.start()
        assert pool.wait_ready(120)
        (pid,) = pool.worker_pids()
        os.kill(pid, signal.SIGSTOP)
        fut = pool.submit(Constraint.of("regex", "[0-9]{3}"))
        time.sleep(2.0)
        assert not fut.done()
        os.kill(pid, signal.SIGCONT)
        assert fut.result(timeout=120)[0] is not None
        (pid,) = pool.worker_pids()
        os.kill(pid, signal.SIGSTOP)
        spec = Constraint.of("regex", "[a-z]{4}")
        with pytest.raises(CompileStarvedError, match="CPU: loaded"):
            pool.compile(spec)
        assert pool._cache.get(spec.key) is None
        assert pool.compile(spec) is not None
    finally:
        pool.shutdown()


def test_a_pool_failure_is_the_servers_503_and_not_cached(vocab, monkeypatch):
    from runtime.server.errors import from_exception

    pool = CompilePool(lambda: vocab, workers=1, timeout_s=30, prebuild=False)

    def no_worker(slot):
        raise OSError("cannot fork")

    monkeypatch.setattr(pool, "_worker", no_worker)
    spec = Constraint.of("regex", "[0-9]{2}")
    try:
        with pytest.raises(CompileWorkerError, match="no compile worker") as err:
            pool.compile(spec)
        assert pool._cache.get(spec.key) is None
        assert from_exception(err.value).status == 503
    finally:
        pool.shutdown()


def test_after_two_refusals_in_a_row_the_spare_takes_over(vocab):
    # two pathological constraints in a row, each ended at its budget: each is answered before
    # its worker is reaped, the slot takes the pre-started spare at once (so the second one,
    # sent right after the first's refusal, is tried on a worker, not refused for waiting),
    # and a plain constraint after them compiles on the next spare: after its first worker no
    # slot had to start one of its own
    # (6 s budgets: the large one's ends ~1.2 s from now, the busy one's ~6 s: a loaded machine
    # leaves that gap)
    pool = CompilePool(lambda: vocab, workers=1, timeout_s=6, prebuild=False)
    try:
        pool.start()
        assert _wait_for(lambda: pool.worker_pids() and pool.spare_pid())
        (first,) = pool.worker_pids()
        for text in ("f{1000000}", "g{1000000}"):
            # (the next spare has its refused predecessor's whole budget to start)
            assert _wait_for(pool.spare_pid)
            with pytest.raises(CompileBudgetError, match="a repetition count of 1000000") as err:
                pool.compile(Constraint.of("regex", text))
            assert "waited for a compile worker" not in str(err.value)
        assert pool.compile(Constraint.of("regex", "[0-9]{3}")) is not None
        events = list(pool.events)
        assert (pool.slot_starts, pool.spares_taken) == (1, 2), events
        assert _wait_for(lambda: ("reaped", first) in pool.events)
        events = list(pool.events)
        assert events.index(("answered", "regex")) < events.index(("reaped", first))
        assert first not in pool.worker_pids()
    finally:
        pool.shutdown()


@pytest.mark.parametrize(
    ("kind", "value", "text"),
    [
        ("grammar", 'start: "The answer is " NUM "."\nNUM: /[0-9]+/\n', b"The answer is 42."),
        ("ebnf", 'root ::= "(" root ")" | "x"', b"((x))"),  # recursive: context-free
        (
            "structural_tag",
            {
                "structures": [
                    {
                        "begin": "<f>",
                        "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                        "end": "</f>",
                    }
                ],
                "triggers": ["<f>"],
            },
            b'hi <f>{"a":1}</f>',
        ),
    ],
)
def test_context_free_constraints_come_back_compiled(vocab, monkeypatch, kind, value, text):
    # built in the worker only: compiling here would fail
    def not_here(*args, **kwargs):
        raise AssertionError("compiled again in the serving process")

    monkeypatch.setattr(compile_worker, "compile_constraint", not_here)
    pool = CompilePool(lambda: vocab, workers=1, timeout_s=120, prebuild=False)
    try:
        g = pool.compile(Constraint.of(kind, value))
        m = g.matcher()
        m.advance_bytes(text)
        assert m.is_accepting()
        assert m.bitmask().any()
    finally:
        pool.shutdown()


def test_the_server_answers_a_400_naming_the_limit_beside_a_plain_200():
    server = shared_server()  # the default budget: 10 s
    order: list[str] = []
    out: dict = {}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def pathological() -> None:
        bad = {**body, "regex": HUGE}
        out["bad"] = httpx.post(f"{server.url}/v1/chat/completions", json=bad, timeout=120)
        order.append("pathological")

    t = threading.Thread(target=pathological)
    t.start()
    time.sleep(0.3)
    plain = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    order.append("plain")
    t.join()
    assert plain.status_code == 200
    bad = out["bad"]
    assert bad.status_code == 400, bad.text
    err = bad.json()["error"]
    assert err["code"] == "constraint_too_complex"
    # which budget it meets first depends on the machine's speed: either is named with its value
    message = err["message"]
    assert "regex" in message
    assert "grammar compile timeout (10 s)" in message or "memory budget (2048 MiB)" in message
    assert order == ["plain", "pathological"]
