"""`fn(*args)` for each item of a suite, each in a forked worker killed after a timeout: one
schema that hangs or crashes the compiler costs one row, not the run (the conformance and
soundness suites and the grammar engines' timings run their items this way)."""

from __future__ import annotations

import multiprocessing as mp
import sys
from typing import Any


def _child(conn: Any, fn: Any, args: tuple) -> None:
    conn.send(fn(*args))
    conn.close()


def forked_rows(fn: Any, arg_tuples: list[tuple], timeout: float, label: str) -> list[dict]:
    """`fn(*args)` for each argument tuple, each in a forked worker killed after `timeout`
    seconds (a timeout or a crash: a row that did not compile)."""
    ctx = mp.get_context("fork")
    rows = []
    for n, args in enumerate(arg_tuples):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(child, fn, args))
        p.start()
        res: dict = {"compiled": False, "error": "timeout"}
        if parent.poll(timeout):
            try:
                res = parent.recv()
            except EOFError:
                res = {"compiled": False, "error": "crash"}
        p.kill()
        p.join()
        rows.append(res)
        if (n + 1) % 50 == 0:
            print(f"  {label}{n + 1}/{len(arg_tuples)}", file=sys.stderr, flush=True)
    return rows
