"""`--suite dialects` of `benchmarks.grammar.compare`: XGrammar's EBNF and structural-tag
features case by case (`benchmarks.grammar.dialect_cases`, written from its documentation), ours
and XGrammar side by side on the DeepSeek tokenizer, single threaded; then llguidance's lark
dialect (`benchmarks.grammar.llguidance_cases`, from its docs/syntax.md), ours and llguidance
(`pip install --no-deps llguidance`) side by side.

    python -m benchmarks.grammar.compare --suite dialects

Per case and engine: compile time (cold), first mask, the mask times along the accepted texts
(p50 / p99), the documented-accepted texts refused and the documented-refused texts accepted;
a case we refuse by name prints the refusal (expected when the case says so). A summary line
counts the cases each engine answers exactly as documented.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.grammar.dialect_cases import CASES, DialectCase
from benchmarks.grammar.engines import LLGuidance
from benchmarks.grammar.llguidance_cases import LLGUIDANCE_CASES
from benchmarks.grammar.structural import _engines, _run


class LLGuidanceLark(LLGuidance):
    """llguidance compiling lark text (its own dialect), one matcher per walk."""

    def lark(self, text: str) -> Any:
        m = self.llg.LLMatcher(self.tok, self.llg.grammar_from("lark", text), log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, m: Any) -> Any:
        return np.frombuffer(m.compute_bitmask(), dtype="<u4")  # bytes: 32 tokens a word


def _compile_fn(engine: Any, case: DialectCase) -> Any:
    if case.kind == "ebnf":
        return lambda: engine.ebnf(case.source)
    if case.kind == "lark":
        return lambda: engine.lark(case.source)
    return lambda: engine.structural(case.source)


def dialects_suite(tok: Any, keys: list[str]) -> None:
    engines = _engines(tok, keys)
    _table(tok, engines, CASES, "XGrammar's EBNF and structural tags")
    lark_engines = [e for e in engines if e.name == "ours"]
    try:
        lark_engines.append(LLGuidanceLark(tok))
    except ImportError:
        print("note: llguidance not installed: .venv/bin/pip install --no-deps llguidance")
    _table(tok, lark_engines, LLGUIDANCE_CASES, "llguidance's lark dialect")


def _table(tok: Any, engines: list[Any], cases: list[DialectCase], title: str) -> None:
    print(f"\nsuite: dialects ({title}, feature by feature)\n")
    print(
        "| feature | engine | compile (ms) | first mask (ms) | mask p50 / p99 (us) "
        "| accepted refused | refused accepted | as documented |"
    )
    print("|---" * 8 + "|")
    right = {e.name: 0 for e in engines}
    for case in cases:
        valid = [tok.encode(t, add_special_tokens=False) for t in case.accept]
        invalid = [tok.encode(t, add_special_tokens=False) for t in case.refuse]
        for e in engines:
            r = _run(e, _compile_fn(e, case), valid, invalid)
            if "error" in r:
                expected = bool(case.unsupported) and e.name == "ours"
                right[e.name] += expected
                verdict = "refused by name (expected)" if expected else "not compiled"
                print(f"| {case.feature} | {e.name} | {verdict}: {r['error'][:70]} | | | | | "
                      f"{'yes' if expected else 'no'} |")  # fmt: skip
                continue
            ok = r["valid_refused"] == 0 and r["invalid_accepted"] == 0
            ok = ok and not (case.unsupported and e.name == "ours")
            right[e.name] += ok
            print(
                f"| {case.feature} | {e.name} | {r['compile_ms']:,.1f} | {r['first_ms']:,.1f} "
                f"| {r['p50']:,.0f} / {r['p99']:,.0f} | {r['valid_refused']} of {len(valid)} "
                f"| {r['invalid_accepted']} of {len(invalid)} | {'yes' if ok else 'no'} |"
            )
    print()
    for name, n in right.items():
        print(f"{name}: {n} of {len(cases)} cases as documented (ours: refusals by name count)")
