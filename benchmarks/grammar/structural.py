"""The structural-tag and GBNF suites of `benchmarks.grammar.compare`: ours vs XGrammar in one
run, the DeepSeek tokenizer (129,280 ids), single threaded.

    python -m benchmarks.grammar.compare --suite structural-tags      # 5 / 50 / 200 tools
    python -m benchmarks.grammar.compare --suite gbnf                 # the eight GBNF grammars

structural-tags: tool calling as `triggered_tags` over free text (trigger "<function=", one tag
per tool, each tool's arguments a JSON Schema from the JSONSchemaBench Glaiveai2K / BFCL files);
then, at each size, the built-in structural tags of Qwen3-Coder (XML parameters) and gpt-oss
(Harmony channels), `runtime.server.tools.builtin_structural_tag(family, tools)` with tool_choice
auto, walked with calls written by the family's own renderer (Qwen3-Coder: only the schemas its
XML style can write; a size over their number reuses them under other tool names, and the label
says how many distinct schemas there are); arguments in the schema's property order, and an
invalid instance left out when its text reads back through the family's parser as valid (an
XML value "5" written for a string property reads as the string "5").
For each size: compile time (cold: every cache dropped), first mask, the mask times along walks
of valid outputs (free text, then a call with a schema-valid instance, then free text; each
mask timed the first time the walks reach it, and again on a second pass: "warm"; "CPU": the
thread's CPU time for the mask, which leaves out the time slices other processes take on a
loaded machine), the valid
outputs refused, and the invalid outputs accepted (schema-invalid instances, an
undeclared tool, a call left without its end string).

Set-up objects are frozen out of the cyclic GC before timing (see `_engines`).

With `--clock cpu` the compile, first-mask and mask p50 / p99 columns are the calling thread's CPU
time (`time.thread_time`: A/B runs on a busy machine), as the JSON Schema suites' are.

gbnf: compile and first-mask time of each grammar of `benchmarks.grammar.gbnf_cases`, mask times
along its sentences, sentences refused and broken texts accepted.
"""

from __future__ import annotations

import gc
import json
import time
from typing import Any

import numpy as np

from benchmarks.grammar.engines import Ours, XGrammar
from benchmarks.grammar.gbnf_cases import CASES
from tests.support.json_text import serialise
from tests.support.schema_bench import BenchCase as Case
from tests.support.schema_bench import bench_files, fixed_slice, load_case

SIZES = (5, 50, 200)
CALLED_TOOLS = 20  # tools whose calls are walked, per size
PER_TOOL = 3  # valid and invalid instances walked per called tool
TRIGGER = "<function="
END = "</function>"
# what compile, first mask and the timed masks are measured with: wall time, or the thread's
# CPU time (`--clock cpu`, set by `set_clock`)
_clock = time.perf_counter
_clock_name = "wall"


def set_clock(name: str) -> None:
    """Time with the wall clock ("wall") or the calling thread's CPU time ("cpu")."""
    global _clock, _clock_name
    _clock = time.thread_time if name == "cpu" else time.perf_counter
    _clock_name = name


class OursST(Ours):
    name = "ours"

    def __init__(self, tok: Any) -> None:
        super().__init__(tok)
        # the per-vocabulary tables a running engine already holds (built once per process)
        self.g.compile_ebnf('root ::= "(" root ")" | "x"', self.vocab).matcher().mask()

    def structural(self, spec: dict) -> Any:
        self.g.clear_caches()
        return self.g.compile_structural_tag(spec, self.vocab)

    def ebnf(self, text: str) -> Any:
        self.g.clear_caches()
        return self.g.compile_ebnf(text, self.vocab)

    def lark(self, text: str) -> Any:
        self.g.clear_caches()
        return self.g.compile_lark(text, self.vocab)

    def advance(self, m: Any, t: int) -> bool:
        try:
            m.advance(t)
        except self.g.GrammarError:
            return False
        return True


class XGrammarST(XGrammar):
    def _compiler(self) -> Any:
        return self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)

    def structural(self, spec: dict) -> Any:
        return self._compiler().compile_structural_tag(json.dumps(spec))

    def ebnf(self, text: str) -> Any:
        return self._compiler().compile_grammar(text)

    def advance(self, m: Any, t: int) -> bool:
        return bool(m.accept_token(t))


def _walk(
    engine: Any,
    compiled: Any,
    ids: list[int],
    times: list[float] | None,
    cpu: list[float] | None = None,
) -> bool:
    m = engine.matcher(compiled)
    for t in ids:
        c0, t0 = time.thread_time(), _clock()
        words = engine.fill(m)
        if times is not None:
            times.append(_clock() - t0)
        if cpu is not None:
            cpu.append(time.thread_time() - c0)
        if not (int(words[t >> 5]) >> (t & 31)) & 1:
            return False
        if not engine.advance(m, t):
            return False
    return bool(engine.accepting(m))


def tool_spec(cases: list) -> dict:
    tags = [
        {
            "type": "tag",
            "begin": f"{TRIGGER}tool_{i}>",
            "content": {"type": "json_schema", "json_schema": c.schema},
            "end": END,
        }
        for i, c in enumerate(cases)
    ]
    return {
        "type": "structural_tag",
        "format": {"type": "triggered_tags", "triggers": [TRIGGER], "tags": tags},
    }


def tool_walks(cases: list) -> tuple[list[str], list[str]]:
    """(valid outputs, invalid outputs) for the tools at evenly spaced indices."""
    valid, invalid = [], []
    step = max(1, len(cases) // CALLED_TOOLS)
    for i in range(0, len(cases), step)[:CALLED_TOOLS]:
        c = cases[i]
        good = [x for x, ok in c.tests if ok][:PER_TOOL]
        bad = [x for x, ok in c.tests if not ok][:PER_TOOL]
        for x in good:
            args = serialise(c.schema, x)
            valid.append(f"Let me look that up. {TRIGGER}tool_{i}>{args}{END} Here it is.")
        for x in bad:
            invalid.append(f"{TRIGGER}tool_{i}>{serialise(c.schema, x)}{END}")
        if good:
            args = serialise(c.schema, good[0])
            invalid.append(f"{TRIGGER}tool_x{i}>{args}{END}")  # undeclared tool
            invalid.append(f"ok {TRIGGER}tool_{i}>{args}")  # no end string
    return valid, invalid


def _stats(times: list[float]) -> dict:
    a = np.asarray(times) * 1e6
    return {
        "p50": float(np.percentile(a, 50)) if a.size else 0.0,
        "p99": float(np.percentile(a, 99)) if a.size else 0.0,
        "over_1ms": int((a > 1000).sum()),
        "n": int(a.size),
    }


def _run(engine: Any, compile_fn: Any, valid: list[list[int]], invalid: list[list[int]]) -> dict:
    t0 = _clock()
    try:
        compiled = compile_fn()
    except Exception as e:  # a peer's parse error counts as not compiled
        return {"error": f"{type(e).__name__}: {str(e)[:80]}"}
    t1 = _clock()
    engine.fill(engine.matcher(compiled))
    t2 = _clock()
    times: list[float] = []
    cpu: list[float] = []
    refused = sum(not _walk(engine, compiled, ids, times, cpu) for ids in valid)
    accepted = sum(_walk(engine, compiled, ids, None) for ids in invalid)
    warm: list[float] = []  # the same walks again: masks every engine has cached by now
    for ids in valid:
        _walk(engine, compiled, ids, warm)
    return {
        "warm_p99": _stats(warm)["p99"],
        "cpu_p99": _stats(cpu)["p99"],
        "compile_ms": (t1 - t0) * 1e3,
        "first_ms": (t2 - t0) * 1e3,
        "valid_refused": refused,
        "invalid_accepted": accepted,
        **_stats(times),
    }


# an unrelated tool walked once by every engine before timing, as `benchmarks.grammar.compare`
# warms up with an unrelated schema: the timed compiles and walks then start where a long-running
# process would (per-vocabulary tables that any JSON string or number builds on first use)
WARM_UP_SCHEMA = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "n": {"type": "integer"}, "x": {"type": "number"}},
    "required": ["q", "n", "x"],
}
WARM_UP_CALL = f'Warm up. {TRIGGER}warm_up>{{"q":"a b","n":12,"x":1.5}}{END} done'


def warm_up(engine: Any, tok: Any) -> None:
    spec = tool_spec([Case("warm_up", WARM_UP_SCHEMA, [])])
    spec["format"]["tags"][0]["begin"] = f"{TRIGGER}warm_up>"
    ids = tok.encode(WARM_UP_CALL, add_special_tokens=False)
    if not _walk(engine, engine.structural(spec), ids, None):
        raise RuntimeError(f"{engine.name}: the warm-up call was refused")


def _engines(tok: Any, keys: list[str]) -> list[Any]:
    """The engines, set up; then the objects built so far (tokenizer, torch, tables) are moved
    out of the cyclic GC's reach, as a long-running server does after start-up: a full
    collection would otherwise traverse them in the middle of a mask (a 50-400 ms pause)."""
    out: list[Any] = []
    for k in keys:
        if k == "ours":
            out.append(OursST(tok))
        elif k == "xgrammar":
            try:
                out.append(XGrammarST(tok))
            except ImportError:
                print("note: xgrammar not installed: .venv/bin/pip install --no-deps "
                      "xgrammar==0.2.9 apache-tvm-ffi")  # fmt: skip
    for e in out:
        warm_up(e, tok)
    gc.collect()
    gc.freeze()
    return out


# the 2026 tool-call formats, as their built-in structural tags (`tool_choice` "auto")
FAMILIES = ("qwen3_coder", "gpt-oss")


def _tool(i: int, schema: Any) -> dict:
    return {"type": "function", "function": {"name": f"tool_{i}", "parameters": schema}}


def writable(family: str, cases: list) -> list:
    """The cases whose schemas the family's argument style can write (Qwen3-Coder's XML
    parameters refuse, by name, schemas such as a root `anyOf`)."""
    from grammar import GrammarError, TokenVocabulary, compile_structural_tag
    from runtime.server.tools.call_tags import builtin_structural_tag

    # the language alone: one token per byte, and an EOS
    vocab = TokenVocabulary([bytes([b]) for b in range(256)] + [None], [256])
    out = []
    for c in cases:
        try:
            compile_structural_tag(builtin_structural_tag(family, [_tool(0, c.schema)]), vocab)
        except GrammarError:
            continue
        out.append(c)
    return out


def family_spec(family: str, cases: list) -> dict:
    from runtime.server.tools.call_tags import builtin_structural_tag

    return builtin_structural_tag(family, [_tool(i, c.schema) for i, c in enumerate(cases)])


def family_walks(family: str, cases: list) -> tuple[list[str], list[str]]:
    """(valid outputs, invalid outputs) in the family's own call format, as `tool_walks`."""
    from runtime.server.tools.formats import FORMATS

    fmt = FORMATS[family]
    valid, invalid = [], []
    step = max(1, len(cases) // CALLED_TOOLS)
    for i in range(0, len(cases), step)[:CALLED_TOOLS]:
        c = cases[i]
        # in the schema's property order, as `tool_walks` writes them (the grammar keeps it)
        good = [_ordered(c, x) for x, ok in c.tests if ok and isinstance(x, dict)][:PER_TOOL]
        bad = [_ordered(c, x) for x, ok in c.tests if not ok and isinstance(x, dict)][:PER_TOOL]
        for x in good:
            valid.append(f"Let me look that up. {fmt.render([(f'tool_{i}', x)])} Here it is.")
        for x in bad:
            text = fmt.render([(f"tool_{i}", x)])
            if not _reads_valid(family, text, f"tool_{i}", c.schema):
                invalid.append(text)
        if good:
            call = fmt.render([(f"tool_{i}", good[0])])
            invalid.append(call.replace(f"tool_{i}", f"tool_x{i}", 1))  # undeclared tool
            invalid.append("ok " + call[: len(call) - len(fmt.call_end + fmt.block_end)])
    return valid, invalid


def _reads_valid(family: str, text: str, name: str, schema: Any) -> bool:
    """The call `text` (written from a schema-invalid instance) reads back, through the
    family's own parser, as schema-valid arguments: an XML style writes a string "5" and
    the number 5 alike, so that text is a valid call, not an invalid one."""
    import jsonschema

    from runtime.server.tools.registry import get_parser

    _, calls = get_parser(family).parse(text, [_tool_obj(name, schema)])
    if len(calls) != 1:
        return False
    args = json.loads(calls[0]["function"]["arguments"])
    return jsonschema.Draft202012Validator(schema).is_valid(args)


def _tool_obj(name: str, schema: Any) -> Any:
    from runtime.server.protocol import Tool

    return Tool.model_validate(
        {"type": "function", "function": {"name": name, "parameters": schema}}
    )


def _ordered(case: Case, instance: dict) -> dict:
    return json.loads(serialise(case.schema, instance))


def warm_up_family(engine: Any, tok: Any, family: str) -> None:
    """`warm_up` in a family's format: its JSON white space (one character a run) and XML
    arguments build per-vocabulary tables of their own, which a server using the family has."""
    case = Case("warm_up", WARM_UP_SCHEMA, [({"q": "a b", "n": 12, "x": 1.5}, True)])
    spec = family_spec(family, [case])
    text = family_walks(family, [case])[0][0].replace("tool_0", "warm_up")
    spec_text = json.dumps(spec).replace("tool_0", "warm_up")
    ids = tok.encode(text, add_special_tokens=False)
    if not _walk(engine, engine.structural(json.loads(spec_text)), ids, None):
        raise RuntimeError(f"{engine.name}: the {family} warm-up call was refused")


def structural_suite(tok: Any, keys: list[str], sizes: tuple[int, ...] = SIZES) -> None:
    files = [f for f in bench_files() if "Glaiveai2K" in f or "BFCL" in f]
    engines = _engines(tok, keys)
    for e in engines:
        for fam in FAMILIES:
            warm_up_family(e, tok, fam)
    pool = [load_case(f) for f in files]
    can_write = {fam: writable(fam, pool) for fam in FAMILIES}
    print("\nsuite: structural-tags (triggered_tags, one JSON-Schema tag per tool; then the "
          "built-in tags of qwen3_coder and gpt-oss, tool_choice auto; times: "
          f"{_clock_name})\n")  # fmt: skip
    print(
        "| tools | engine | compile (ms) | first mask (ms) | mask p50 / p99 (us) "
        "| masks over 1 ms | mask p99 CPU (us) | warm mask p99 (us) | valid refused "
        "| invalid accepted |"
    )
    print("|---" * 10 + "|")
    for n in sizes:
        cases = [load_case(f) for f in fixed_slice(n, files)]
        valid_text, invalid_text = tool_walks(cases)
        valid = [tok.encode(t, add_special_tokens=False) for t in valid_text]
        invalid = [tok.encode(t, add_special_tokens=False) for t in invalid_text]
        spec = tool_spec(cases)
        for e in engines:
            r = _run(e, lambda e=e, s=spec: e.structural(s), valid, invalid)
            _row(f"{len(cases)}", e.name, r, len(valid), len(invalid))
        for fam in FAMILIES:
            usable = can_write[fam]
            # n tools: the first n schemas the style can write, spread evenly (cycled, under
            # other names, when fewer are writable)
            chosen = [usable[(k * max(1, len(usable) // n)) % len(usable)] for k in range(n)]
            valid_text, invalid_text = family_walks(fam, chosen)
            valid = [tok.encode(t, add_special_tokens=False) for t in valid_text]
            invalid = [tok.encode(t, add_special_tokens=False) for t in invalid_text]
            spec = family_spec(fam, chosen)
            distinct = len({id(c) for c in chosen})
            for e in engines:
                r = _run(e, lambda e=e, s=spec: e.structural(s), valid, invalid)
                label = f"{n} {fam} ({distinct} schemas)" if distinct < n else f"{n} {fam}"
                _row(label, e.name, r, len(valid), len(invalid))


def gbnf_suite(tok: Any, keys: list[str]) -> None:
    engines = _engines(tok, keys)
    print(
        f"\nsuite: gbnf (the eight llama.cpp-style grammars of benchmarks.grammar.gbnf_cases; "
        f"times: {_clock_name})\n"
    )
    print(
        "| grammar | engine | compile (ms) | first mask (ms) | mask p50 / p99 (us) "
        "| masks over 1 ms | mask p99 CPU (us) | warm mask p99 (us) | valid refused "
        "| invalid accepted |"
    )
    print("|---" * 10 + "|")
    for name, case in CASES.items():
        valid = [tok.encode(t, add_special_tokens=False) for t in case.accept]
        invalid = [tok.encode(t, add_special_tokens=False) for t in case.refuse]
        for e in engines:
            r = _run(e, lambda e=e, c=case: e.ebnf(c.grammar), valid, invalid)
            _row(name, e.name, r, len(valid), len(invalid))


def _row(label: str, engine: str, r: dict, n_valid: int, n_invalid: int) -> None:
    if "error" in r:
        print(f"| {label} | {engine} | not compiled: {r['error']} | | | | | | | |")
        return
    print(
        f"| {label} | {engine} | {r['compile_ms']:,.1f} | {r['first_ms']:,.1f} "
        f"| {r['p50']:,.0f} / {r['p99']:,.0f} | {r['over_1ms']} of {r['n']} "
        f"| {r['cpu_p99']:,.0f} | {r['warm_p99']:,.0f} "
        f"| {r['valid_refused']} of {n_valid} | {r['invalid_accepted']} of {n_invalid} |"
    )
