"""Token healing on prompts cut mid-token: `python -m benchmarks.engine.dsl --suite healing`.

Cases are built from the model's own text, so the unsplit prompt's greedy output is known to
continue through the cut:

  1. each seed prompt (URLs, code identifiers, numbers, words before a suffix) is continued
     greedily (`--seed-tokens` tokens, no healing): text T = seed + continuation;
  2. for each of the first continuation tokens that is two characters or longer, the cut goes
     in its middle: that is where the tokenizer merges across the cut (the token spans it).
     The *unsplit prompt* is T up to the token's start; the *split prompt* is T up to the cut;
  3. oracle: the unsplit prompt's greedy output (`--max-new-tokens` tokens, no healing). A case
     whose oracle does not start with the text between the token's start and the cut (the
     unsplit prompt re-encodes differently from the seed's run) is left out and counted;
  4. the split prompt runs as a program, `s += split + gen(...)`, greedy, with token healing
     (the default for a gen after text) and with `token_healing=False`, both with
     `MAX_BACKOFF` more tokens than the oracle (healing may spend a token or two re-spelling
     the cut token); an output is *equal* when it starts with the oracle's text after the cut
     (the oracle's whole text covered), *token* when it starts with the rest of the cut token.

Every generation runs alone (one request at a time), so batch shapes cannot flip a greedy tie.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import sgl_dsl as sgl
from runtime.scheduling.healing import MAX_BACKOFF

SEEDS: dict[str, list[str]] = {
    "url": [
        "The official website of the Python programming language is",
        "You can download the latest release from",
        "For the full documentation, visit",
        "The source code is hosted on GitHub at",
        "Send your application through the careers page at",
        "The API endpoint for user data is",
        "Our blog moved to a new address:",
        "Wikipedia's article on the Moon is at",
        "To install the package, run pip install requests and read",
        "Find the tutorial at the link",
    ],
    "code": [
        "def compute_average(values):\n    total =",
        "import numpy as np\n\nmatrix = np.",
        "class HttpRequestHandler:\n    def",
        "for index, item in enumerate(",
        "const userProfile = await fetch",
        "public static void main(String[] args) {\n    System.",
        "SELECT customer_name, order_total FROM",
        "from collections import defaultdict\n\ncounts =",
        "    def __init__(self, config):\n        self.",
        "if response.status_code ==",
    ],
    "number": [
        "The year the Berlin Wall fell was",
        "Pi is approximately equal to",
        "The boiling point of water in Fahrenheit is",
        "The price of the laptop was $",
        "There are 365 days in a year and",
        "The speed of light is about",
        "Version 3.11 of Python was released in",
        "The population of Tokyo is roughly",
        "A kilometre equals",
        "The meeting starts at 10:",
    ],
    "word": [
        "The results of the experiment were unbeliev",
        "She spoke about the internationali",
        "It was an extraordinar",
        "The committee reached a unanim",
        "He was known for his generos",
        "The company announced a reorganiz",
        "Scientists studied the photosynth",
        "The government introduced new regul",
        "They celebrated the anniver",
        "The teacher explained the importance of respons",
    ],
}


@dataclass(slots=True)
class Case:
    kind: str
    split: str  # the prompt cut mid-token
    oracle_after_cut: str  # the unsplit prompt's greedy output, after the cut
    token_rest: str  # the rest of the token the cut is inside


def _greedy(backend: Any, prompt: str, max_tokens: int, heal: bool) -> str:
    """A program's greedy gen after `prompt` (alone: one request in flight)."""

    @sgl.function
    def after(s):
        s += prompt + sgl.gen("x", max_tokens=max_tokens, temperature=0, token_healing=heal)

    return after.run(backend=backend)["x"]


def build_cases(backend: Any, seed_tokens: int, max_new: int, per_seed: int) -> tuple:
    """The cases (see the module's steps 1-3) and how many candidate cuts were left out."""
    tok = backend.tokenizer
    cases, unstable = [], 0
    for kind, seeds in SEEDS.items():
        for seed in seeds:
            text = seed + _greedy(backend, seed, seed_tokens, heal=False)
            enc = tok(text, return_offsets_mapping=True)
            made = 0
            for start, end in enc.offset_mapping:
                if start < len(seed) or end - start < 2:
                    continue  # a cut inside the seed, or a one-character token
                if made >= per_seed:
                    break
                cut = start + (end - start) // 2
                unsplit, partial = text[:start], text[start:cut]
                if not unsplit.strip():
                    continue
                oracle = _greedy(backend, unsplit, max_new, heal=False)
                if not oracle.startswith(partial):
                    unstable += 1
                    continue
                cases.append(Case(kind, text[:cut], oracle[len(partial) :], text[cut:end]))
                made += 1
    return cases, unstable


def healing_suite(seed_tokens: int = 16, max_new: int = 12, per_seed: int = 4) -> None:
    backend = sgl.Runtime()
    try:
        t0 = time.perf_counter()
        cases, unstable = build_cases(backend, seed_tokens, max_new, per_seed)
        equal: dict[str, Counter] = {"healed": Counter(), "plain": Counter()}
        token: dict[str, Counter] = {"healed": Counter(), "plain": Counter()}
        missed = []
        for case in cases:  # healed and plain alternate, case by case
            for label, heal in (("healed", True), ("plain", False)):
                out = _greedy(backend, case.split, max_new + MAX_BACKOFF, heal)
                equal[label][case.kind] += out.startswith(case.oracle_after_cut)
                if heal and not out.startswith(case.oracle_after_cut):
                    missed.append((case, out))
                token[label][case.kind] += out.startswith(case.token_rest)
        wall = time.perf_counter() - t0
    finally:
        backend.shutdown()
    total = Counter(c.kind for c in cases)
    print(
        f"\ntoken healing: {len(cases)} prompts cut mid-token ({unstable} candidate cuts left "
        f"out: the unsplit prompt's output did not run through the cut), greedy, "
        f"{max_new} new tokens, default model; {wall:.0f} s. '= unsplit': the output is the "
        "unsplit prompt's (all of it); 'token': it starts by finishing the cut token"
    )
    print(
        f"| {'cases':8s} | {'n':>4s} | {'= unsplit, healed':>17s} | {'= unsplit, plain':>16s} "
        f"| {'token, healed':>13s} | {'token, plain':>12s} |"
    )
    print(f"|{'-' * 10}|{'-' * 6}|{'-' * 19}|{'-' * 18}|{'-' * 15}|{'-' * 14}|")
    for kind in [*SEEDS, "all"]:
        n = len(cases) if kind == "all" else total[kind]
        if not n:
            continue
        cells = []
        for table, width in ((equal, 17), (equal, 16), (token, 13), (token, 12)):
            label = "healed" if len(cells) % 2 == 0 else "plain"
            hits = sum(table[label].values()) if kind == "all" else table[label][kind]
            cells.append(f"{f'{hits} ({100 * hits / n:.1f}%)':>{width}s}")
        print(f"| {kind:8s} | {n:4d} | " + " | ".join(cells) + " |", flush=True)
    for case, out in missed[:6]:
        print(f"  healed, not equal: ...{case.split[-24:]!r} -> {out[:40]!r}, "
              f"unsplit: {case.oracle_after_cut[:40]!r}")  # fmt: skip
