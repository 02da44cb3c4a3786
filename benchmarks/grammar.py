"""Grammar benchmark: ours vs outlines-core, XGrammar and llguidance on the JSONSchemaBench
sample, same deepseek tokenizer (129,280 ids), compact separators, schema-ordered keys.

    python -m benchmarks.grammar                 # ours on all 758 schemas, peers on 100
    python -m benchmarks.grammar --limit 60 --peer-limit 30 --engines ours,xgrammar

Each schema runs in a forked worker killed after --timeout seconds (counted as failed), single
threaded; before forking, every engine compiles and walks one unrelated warm-up schema.
Peers that are not installed are skipped with a note. Prints one table.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from tests._grammar_fixtures import (
    NO_BENCH,
    bench_files,
    deepseek_tokenizer,
    deepseek_vocab,
    fixed_slice,
    load_case,
    serialise,
)

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


# ---------------------------------------------------------------- engines
class Ours:
    name = "ours (grammar/)"

    def __init__(self, tok: Any) -> None:
        import grammar

        self.g = grammar
        self.vocab = deepseek_vocab()
        self.vocab.prepared()
        self.out = np.zeros((len(self.vocab) + 31) // 32, dtype=np.int32)
        self.eos = self.vocab.eos_token_ids[0]

    def compile(self, schema: Any) -> Any:
        self.g.clear_caches()
        return self.g.compile_json_schema(schema, self.vocab)

    def matcher(self, compiled: Any) -> Any:
        return compiled.matcher()

    def fill(self, m: Any) -> np.ndarray:
        m.fill_bitmask(self.out)
        return self.out

    def advance(self, m: Any, t: int) -> bool:
        m.advance(t)
        return True

    def accepting(self, m: Any) -> bool:
        return m.is_accepting()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok: Any) -> None:
        import torch
        import xgrammar as xgr

        torch.set_num_threads(1)
        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
        self.out = xgr.allocate_token_bitmask(1, self.info.vocab_size).numpy()
        self.eos = tok.eos_token_id

    def compile(self, schema: Any) -> Any:
        import json

        compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        return compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=False
        )

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m: Any) -> np.ndarray:
        m.fill_next_token_bitmask(self.out)
        return self.out[0]

    def advance(self, m: Any, t: int) -> bool:
        return m.accept_token(t)

    def accepting(self, m: Any) -> bool:
        return m.accept_token(self.eos) if not m.is_terminated() else True


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok: Any) -> None:
        import llguidance
        import llguidance.hf

        self.llg = llguidance
        self.tok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))
        self.eos = tok.eos_token_id

    def compile(self, schema: Any) -> Any:
        g = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, m: Any) -> Any:
        return m.compute_bitmask()

    def advance(self, m: Any, t: int) -> bool:
        return m.consume_token(t)

    def accepting(self, m: Any) -> bool:
        return m.is_accepting()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok: Any) -> None:
        import outlines_core

        self.oc = outlines_core
        vocab = deepseek_vocab()
        mapping: dict[bytes, list[int]] = {}
        for i in range(len(vocab)):
            b = vocab.token_bytes(i)
            if b:
                mapping.setdefault(b, []).append(i)
        self.eos = tok.eos_token_id
        self.vocabulary = outlines_core.Vocabulary(self.eos, mapping)

    def compile(self, schema: Any) -> Any:
        import json

        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled: Any) -> Any:
        return [compiled, compiled.get_initial_state()]

    def fill(self, m: Any) -> Any:
        return m[0].get_allowed_tokens(m[1])

    def advance(self, m: Any, t: int) -> bool:
        nxt = m[0].get_next_state(m[1], t)
        if nxt is None:
            return False
        m[1] = nxt
        return True

    def accepting(self, m: Any) -> bool:
        return m[0].is_final_state(m[1])


ENGINES = {"ours": Ours, "xgrammar": XGrammar, "llguidance": LLGuidance, "outlines": OutlinesCore}


# ---------------------------------------------------------------- measuring
def _walk(engine: Any, compiled: Any, ids: list[int], mask_times: list[float] | None) -> bool:
    """Mask + advance along ids; False if a token is refused or the end is not accepting."""
    m = engine.matcher(compiled)
    try:
        for t in ids:
            t0 = time.perf_counter()
            engine.fill(m)
            if mask_times is not None:
                mask_times.append(time.perf_counter() - t0)
            if not engine.advance(m, t):
                return False
        return bool(engine.accepting(m))
    except Exception:  # our GrammarError on a refused token
        return False


def run_schema(engine: Any, path: str, tok: Any) -> dict:
    case = load_case(path)
    t0 = time.perf_counter()
    try:
        compiled = engine.compile(case.schema)
        m = engine.matcher(compiled)
        engine.fill(m)
    except Exception as e:  # unsupported / failed to compile
        return {"compiled": False, "error": type(e).__name__}
    first_mask = time.perf_counter() - t0
    mask_times: list[float] = []
    valid_rejected = invalid_accepted = 0
    for instance, valid in case.tests:
        ids = tok.encode(serialise(case.schema, instance), add_special_tokens=False)
        ok = _walk(engine, compiled, ids, mask_times if valid else None)
        valid_rejected += valid and not ok
        invalid_accepted += (not valid) and ok
    return {
        "compiled": True,
        "first_mask": first_mask,
        "mask_times": mask_times,
        "valid_rejected": valid_rejected,
        "invalid_accepted": invalid_accepted,
    }


def _child(conn: Any, engine: Any, path: str, tok: Any) -> None:
    conn.send(run_schema(engine, path, tok))
    conn.close()


def warm_up(engine: Any, tok: Any) -> None:
    """Compile and walk one unrelated schema in the parent, the same for every engine: each
    forked worker then starts where a long-running process would (first-use set-up done,
    e.g. per-tokenizer tables built lazily), so its times are those of an unseen schema."""
    ids = tok.encode(serialise(*WARM_UP), add_special_tokens=False)
    _walk(engine, engine.compile(WARM_UP[0]), ids, None)


def run_suite(engine: Any, files: list[str], tok: Any, timeout: float) -> dict:
    ctx = mp.get_context("fork")
    warm_up(engine, tok)
    rows = []
    for i, path in enumerate(files):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(child, engine, path, tok))
        p.start()
        res = {"compiled": False, "error": "timeout"}
        if parent.poll(timeout):
            try:
                res = parent.recv()
            except EOFError:
                res = {"compiled": False, "error": "crash"}
        p.kill()
        p.join()
        rows.append(res)
        if (i + 1) % 25 == 0:
            print(f"  {engine.name}: {i + 1}/{len(files)}", file=sys.stderr, flush=True)
    compiled = [r for r in rows if r["compiled"]]
    masks = [t for r in compiled for t in r["mask_times"]]
    firsts = [r["first_mask"] for r in compiled]
    return {
        "n": len(files),
        "compiled": len(compiled),
        "refused": sum(r.get("error") == "UnsupportedSchemaError" for r in rows),
        "timeouts": sum(r.get("error") == "timeout" for r in rows),
        "correct": sum(r["valid_rejected"] == 0 and r["invalid_accepted"] == 0 for r in compiled),
        "valid_rejected": sum(r["valid_rejected"] for r in compiled),
        "invalid_accepted": sum(r["invalid_accepted"] for r in compiled),
        "first_mask_ms": _pcts(firsts, 1e3),
        "mask_us": _pcts(masks, 1e6),
    }


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
        t0 = time.perf_counter()
        compiled = engine.compile(FIXED_SCHEMAS[name])
        ok &= _walk(engine, compiled, ids, None)
        colds.append(time.perf_counter() - t0)
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
    ap.add_argument("--limit", type=int, default=0, help="schemas for ours (0: all)")
    ap.add_argument("--peer-limit", type=int, default=100, help="schemas for the peers")
    ap.add_argument("--engines", default="ours,xgrammar,llguidance,outlines")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per schema")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = deepseek_tokenizer()
    files = bench_files()
    if not files:
        sys.exit(NO_BENCH)
    ours_files = fixed_slice(args.limit, files) if args.limit else files
    peer_files = fixed_slice(args.peer_limit, files)
    lines = []
    for key in args.engines.split(","):
        try:
            engine = ENGINES[key](tok)
        except ImportError as e:
            print(f"note: {key} skipped (not installed: {e.name})", file=sys.stderr)
            continue
        sel = ours_files if key == "ours" else peer_files
        suite = run_suite(engine, sel, tok, args.timeout)
        fixed = {n: fixed_schema(engine, n, tok) for n in FIXED_SCHEMAS}
        lines.append((engine.name, suite, fixed))
    cold_col = " | ".join(f"cold {n} (ms)" for n in FIXED_SCHEMAS)
    print(
        f"| engine | schemas | compiled | refused | timeouts | fully correct | valid rejected "
        f"| invalid accepted "
        f"| first mask p50 / p99 (ms) | mask p50 / p99 (us) | {cold_col} "
        f"| median cold (ms) | warm mask p50 / p99 (us) |"
    )
    print("|---" * (12 + len(FIXED_SCHEMAS)) + "|")
    for name, s, fixed in lines:
        colds = [fixed[n]["cold_ms"] for n in FIXED_SCHEMAS]
        warm = [fixed[n]["warm_us"] for n in FIXED_SCHEMAS if fixed[n]["warm_us"]]
        warm_p = (max(w[0] for w in warm), max(w[1] for w in warm)) if warm else None
        cold_cells = " | ".join(
            f"{c:,.1f}" + ("" if fixed[n]["ok"] else " (!)")
            for c, n in zip(colds, FIXED_SCHEMAS, strict=True)
        )
        print(
            f"| {name} | {s['n']} | {s['compiled']} | {s['refused']} | {s['timeouts']} "
            f"| {s['correct']} | {s['valid_rejected']} "
            f"| {s['invalid_accepted']} | {_fmt(s['first_mask_ms'])} | {_fmt(s['mask_us'])} "
            f"| {cold_cells} | {statistics.median(colds):,.1f} | {_fmt(warm_p)} |"
        )


if __name__ == "__main__":
    main()
