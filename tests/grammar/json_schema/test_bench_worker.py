"""The grammar benchmark's long-running worker (`benchmarks.grammar.compare.worker_rows`):
rows come back in order from one process, and a row that hangs or crashes costs that row and
its worker only (a new one takes the rest)."""

from __future__ import annotations

import os
import threading

from benchmarks.grammar.compare import worker_rows


def _job(kind: str, x: int) -> dict:
    if kind == "crash":
        os._exit(3)
    if kind == "hang":
        threading.Event().wait()  # never set: only the timeout ends it
    return {"compiled": True, "x": x * 10, "pid": os.getpid()}


def test_rows_in_order_from_one_worker_past_a_hang_and_a_crash() -> None:
    jobs = [("ok", 1), ("ok", 2), ("hang", 3), ("ok", 4), ("crash", 5), ("ok", 6), ("ok", 7)]
    rows = worker_rows(_job, jobs, 2.0, "test: ")
    assert [r.get("x") for r in rows] == [10, 20, None, 40, None, 60, 70]
    assert rows[2] == {"compiled": False, "error": "timeout"}
    assert rows[4] == {"compiled": False, "error": "crash"}
    pids = [r.get("pid") for r in rows]
    assert pids[0] == pids[1] != os.getpid()  # one worker for consecutive rows
    assert pids[3] not in (pids[0], None)  # a new worker after the hang
    assert pids[5] == pids[6] not in (pids[3], None)  # and after the crash
