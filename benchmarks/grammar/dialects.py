"""`--suite dialects` of `benchmarks.grammar.compare`: XGrammar's EBNF and structural-tag
features case by case (`benchmarks.grammar.dialect_cases`, written from its documentation), ours
and XGrammar side by side on the DeepSeek tokenizer, single threaded.

    python -m benchmarks.grammar.compare --suite dialects

Per case and engine: compile time (cold), first mask, the mask times along the accepted texts
(p50 / p99), the documented-accepted texts refused and the documented-refused texts accepted;
a case we refuse by name prints the refusal (expected when the case says so). A summary line
counts the cases each engine answers exactly as documented.
"""

from __future__ import annotations

from typing import Any

from benchmarks.grammar.dialect_cases import CASES, DialectCase
from benchmarks.grammar.structural import _engines, _run


def _compile_fn(engine: Any, case: DialectCase) -> Any:
    if case.kind == "ebnf":
        return lambda: engine.ebnf(case.source)
    return lambda: engine.structural(case.source)


def dialects_suite(tok: Any, keys: list[str]) -> None:
    engines = _engines(tok, keys)
    print("\nsuite: dialects (XGrammar's EBNF and structural tags, feature by feature)\n")
    print(
        "| feature | engine | compile (ms) | first mask (ms) | mask p50 / p99 (us) "
        "| accepted refused | refused accepted | as documented |"
    )
    print("|---" * 8 + "|")
    right = {e.name: 0 for e in engines}
    for case in CASES:
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
        print(f"{name}: {n} of {len(CASES)} cases as documented (ours: refusals by name count)")
