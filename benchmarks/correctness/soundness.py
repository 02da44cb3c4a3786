"""Soundness by generation: random walks through compiled JSON-Schema constraints, each emitted
text decoded with the tokenizer, parsed and validated with `jsonschema` (formats asserted).
Every text the constraint lets through must be a valid instance; one that is not is a bug.

    python -m benchmarks.correctness.soundness                                  # the official suite
    python -m benchmarks.correctness.soundness --suite jsonschemabench --limit 300
    python -m benchmarks.correctness.soundness --walks 50 --seed 1 --only unevaluated

A walk advances a matcher from the start: most steps take one byte (its single-byte token),
picked by first choosing uniformly among the distinct states the allowed bytes lead to (so the
closing quote of a string is as likely as "one more letter" and walks stay short), some steps
take a longer token the mask allows; at an accepting state it ends with probability
--end-bias. Walks that reach --cap tokens are discarded. A text naming a member twice (which
a regular language cannot rule out among free-form names) is counted, and both readings (first
or last member wins) must be valid. Formats date, date-time, time, duration, uri-template
and relative-json-pointer, and patterns (read as ECMA-262, `\\p{..}` in the Unicode version
of this Python's `unicodedata`, as the grammar reads it) are checked by
`benchmarks.correctness.soundness_checkers`; the other formats by `jsonschema`, as far as it
has checkers (uri, iri, hostname need the optional packages rfc3987 and fqdn); the run lists
the formats walked but not asserted.
"""

from __future__ import annotations

import argparse
import decimal
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.correctness.forked import forked_rows
from benchmarks.correctness.soundness_checkers import CHECKERS, ecma_patterns, format_checker
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab


@dataclass(slots=True)
class WalkSettings:
    walks: int = 20
    seed: int = 0
    cap: int = 400  # tokens; a walk that reaches it is discarded
    end_bias: float = 0.4  # chance of ending at each accepting state
    token_share: float = 0.15  # chance of a multi-byte token (from the mask) instead of a byte
    hint_share: float = 0.25  # chance of following a hint (a spelling from the schema)
    budget_s: float = 10.0  # walking time per schema, after compiling


@dataclass(slots=True)
class Emitted:
    text: str
    reason: str


@dataclass(slots=True)
class SchemaRow:
    compiled: bool
    error: str = ""
    walks: int = 0  # kept walks (ended at an accepting state)
    capped: int = 0
    stuck: int = 0  # reached a state with no byte allowed that is not accepting
    invalid_count: int = 0  # kept walks whose text is not a valid instance
    duplicate_names: int = 0  # kept walks whose text names a member twice
    invalid: list[Emitted] = field(default_factory=list)
    validator_error: str = ""


@dataclass(slots=True)
class WalkTokens:
    """The vocabulary as walks use it: the single-byte token of each byte value (a byte-level
    vocabulary has all 256) and which ids are tokens of two or more bytes."""

    byte_ids: list[int]
    multi_byte: Any  # numpy bool [len(vocab)]

    @classmethod
    def of(cls, vocab: Any) -> WalkTokens:
        import numpy as np

        byte_ids = [-1] * 256
        multi = np.zeros(len(vocab), dtype=bool)
        for i in range(len(vocab)):
            b = vocab.token_bytes(i) or b""
            multi[i] = len(b) > 1
            if len(b) == 1 and byte_ids[b[0]] < 0:
                byte_ids[b[0]] = i
        missing = [b for b in range(256) if byte_ids[b] < 0]
        if missing:
            raise ValueError(f"the vocabulary has no single-byte token for bytes {missing[:8]}")
        return cls(byte_ids, multi)


def schema_hints(schema: Any) -> list[bytes]:
    """Spellings worth trying: the schema's strings (names, consts, enums) as JSON strings, with
    their first character \\u-escaped too, and other spellings of its numbers (1.0, 1e0, -0).
    Walks follow them as far as the constraint allows, to reach the corners (an escaped name
    that equals a declared one, a number equal to a const) that uniform choice rarely finds."""
    out: set[bytes] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                visit(k)
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)
        elif isinstance(node, str) and len(node) < 40:
            out.add(json.dumps(node, ensure_ascii=False).encode())
            if node:
                first = node[0]
                esc = json.dumps(first)[1:-1] if ord(first) > 0x7E else f"\\u{ord(first):04x}"
                out.add(f'"{esc}{json.dumps(node[1:], ensure_ascii=False)[1:]}'.encode())
        elif isinstance(node, int | float) and not isinstance(node, bool):
            out.update(f"{node}".encode() for node in (node, float(node), -node))
            out.add(f"{node}e0".encode())

    visit(schema)
    return sorted(out)


def random_walk(
    compiled: Any, rng: random.Random, wt: WalkTokens, s: WalkSettings, hints: list[bytes] = ()
) -> Any:
    """Token ids of one walk that ended at an accepting state; "capped" or "stuck" otherwise."""
    import numpy as np

    m = compiled.matcher()
    ids: list[int] = []
    while len(ids) < s.cap:
        accepting = m.is_accepting()
        if accepting and rng.random() < s.end_bias:
            return ids
        row = compiled.dfa.byte_row(m.state)
        live = np.nonzero(row)[0]
        if not len(live):
            return ids if accepting else "stuck"
        fits = [h for h in hints if row[h[0]]] if hints else []
        if fits and rng.random() < s.hint_share:
            # a hint whose first byte is allowed, as far as its bytes stay allowed
            for b in rng.choice(fits):
                if len(ids) >= s.cap or not compiled.dfa.byte_row(m.state)[b]:
                    break
                m.advance(wt.byte_ids[b])
                ids.append(wt.byte_ids[b])
            continue
        if rng.random() < s.token_share:
            # a token of two or more bytes the packed mask allows (as a decoder would pick)
            allowed = np.nonzero(m.mask() & wt.multi_byte)[0]
            if len(allowed):
                t = int(allowed[rng.randrange(len(allowed))])
                m.advance(t)
                ids.append(t)
                continue
        # one byte: first a target state, uniformly, then a byte leading there
        targets = row[live]
        target = rng.choice(sorted(set(targets.tolist())))
        byte = int(rng.choice(live[targets == target].tolist()))
        m.advance(wt.byte_ids[byte])
        ids.append(wt.byte_ids[byte])
    return "capped"


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class DuplicateNames(ValueError):
    """An object names a member twice: JSON (RFC 8259) leaves its meaning open."""


def parse_instance(text: str, exact: bool = False, keep: str = "") -> Any:
    """Strict JSON: no NaN / Infinity (ValueError); `exact` reads fractions and exponents as
    Decimal. A name given twice raises DuplicateNames unless `keep` says which member wins
    ("first" or "last")."""

    def pairs(items: list[tuple[str, Any]]) -> dict:
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            if not keep:
                raise DuplicateNames(sorted(k for k in set(keys) if keys.count(k) > 1))
            return dict(items if keep == "last" else reversed(items))
        return dict(items)

    return json.loads(
        text,
        parse_constant=_no_constants,
        object_pairs_hook=pairs,
        parse_float=decimal.Decimal if exact else float,
    )


@dataclass(slots=True)
class InstanceCheck:
    """A schema's `jsonschema` validator (formats asserted), twice: on floats, and, to confirm
    a rejection, on Decimals (schema and instance) with integral Decimals counted as integers,
    so `multipleOf` and bounds are exact where floats round (2.1e112 is a multiple of 30)."""

    plain: Any
    exact: Any

    @classmethod
    def of(cls, schema: Any) -> InstanceCheck:
        import jsonschema

        base = jsonschema.validators.validator_for(schema if isinstance(schema, dict) else {})

        def is_integer(checker: Any, inst: Any) -> bool:
            if isinstance(inst, decimal.Decimal):
                return inst.is_finite() and inst == inst.to_integral_value()
            return base.TYPE_CHECKER.is_type(inst, "integer")

        exact_cls = jsonschema.validators.extend(
            base, type_checker=base.TYPE_CHECKER.redefine("integer", is_integer)
        )
        exact_schema = json.loads(json.dumps(schema), parse_float=decimal.Decimal)
        ecma_patterns()
        formats = format_checker(base.FORMAT_CHECKER)
        return cls(
            base(schema, format_checker=formats), exact_cls(exact_schema, format_checker=formats)
        )

    def why_invalid(self, text: str) -> tuple[str, bool]:
        """("", _) when `text` is a valid instance, else why not; and whether it names a member
        twice (then both readings, first and last member winning, must be valid)."""
        try:
            parse_instance(text)
            readings, twice = [""], False
        except DuplicateNames:
            readings, twice = ["first", "last"], True
        except ValueError as e:
            return f"not JSON: {e}"[:200], False
        for keep in readings:
            reason = self._reading(text, keep)
            if reason:
                return (f"({keep} member wins) " if keep else "") + reason, twice
        return "", twice

    def _reading(self, text: str, keep: str) -> str:
        if self.plain.is_valid(parse_instance(text, keep=keep)):
            return ""
        with decimal.localcontext() as ctx:
            ctx.prec = 4000
            errors = list(self.exact.iter_errors(parse_instance(text, exact=True, keep=keep)))
        if not errors:
            return ""
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path)
        return f"at /{where}: {e.message}"[:300]


def walk_schema(schema: Any, tok: Any, vocab: Any, wt: WalkTokens, s: WalkSettings) -> dict:
    """Compile `schema`, take s.walks walks (within s.budget_s) and validate what they emit."""
    import grammar

    try:
        grammar.clear_caches()
        compiled = grammar.compile_json_schema(schema, vocab)
        compiled.matcher().mask()
    except Exception as e:
        return asdict(SchemaRow(False, f"{type(e).__name__}: {e}"[:200]))
    row = SchemaRow(True)
    if compiled.admits_nothing:
        return asdict(row)
    try:
        check = InstanceCheck.of(schema)
    except Exception as e:
        row.validator_error = f"{type(e).__name__}: {e}"[:200]
        return asdict(row)
    # seeded by the schema too, so schemas that compile alike still take different walks
    rng = random.Random(f"{s.seed}:{json.dumps(schema, sort_keys=True)}")
    start = time.monotonic()
    seen: set[str] = set()
    hints = schema_hints(schema)
    for _ in range(s.walks):
        if time.monotonic() - start > s.budget_s:
            break
        ids = random_walk(compiled, rng, wt, s, hints)
        if ids == "capped":
            row.capped += 1
            continue
        if ids == "stuck":
            row.stuck += 1
            continue
        row.walks += 1
        raw = b"".join(vocab.token_bytes(t) for t in ids)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            row.invalid_count += 1
            row.invalid.append(Emitted(repr(raw)[:300], "not UTF-8"))
            continue
        text = tok.decode(ids)
        if text in seen:
            continue
        seen.add(text)
        try:
            reason, twice = check.why_invalid(text)
        except Exception as e:  # e.g. a remote $ref the validator cannot resolve
            row.validator_error = f"{type(e).__name__}: {e}"[:200]
            break
        row.duplicate_names += twice
        row.invalid_count += bool(reason)
        if reason and len(row.invalid) < 5:
            row.invalid.append(Emitted(text[:300], reason))
    return asdict(row)


def asserted_formats() -> set[str]:
    import jsonschema

    return set(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers) | set(CHECKERS)


def formats_used(schema: Any, out: set[str] | None = None) -> set[str]:
    out = set() if out is None else out
    if isinstance(schema, dict):
        if isinstance(schema.get("format"), str):
            out.add(schema["format"])
        for v in schema.values():
            formats_used(v, out)
    elif isinstance(schema, list):
        for v in schema:
            formats_used(v, out)
    return out


def load_items(suite: str, limit: int, only: str) -> list[Any]:
    from benchmarks.correctness.suites import bench_items, official_items

    items = official_items() if suite == "json-schema-test-suite" else bench_items(limit)
    items = [i for i in items if only in i.label]
    return items[:limit] if limit and suite == "json-schema-test-suite" else items


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--suite",
        default="json-schema-test-suite",
        choices=("json-schema-test-suite", "jsonschemabench"),
    )
    ap.add_argument("--walks", type=int, default=20, help="walks per schema")
    ap.add_argument("--limit", type=int, default=0, help="schemas (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="schemas whose label contains this")
    ap.add_argument("--cap", type=int, default=400, help="tokens per walk")
    ap.add_argument("--end-bias", type=float, default=0.4)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per schema (hard)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    items = load_items(args.suite, args.limit, args.only)
    if not items:
        sys.exit(f"no schemas for --suite {args.suite} --only {args.only!r} (set SGL_SHARED_DIR)")
    tok, vocab = deepseek_tokenizer(), deepseek_vocab()
    vocab.prepared()
    wt = WalkTokens.of(vocab)
    budget = max(1.0, args.timeout / 2)
    s = WalkSettings(args.walks, args.seed, args.cap, args.end_bias, budget_s=budget)
    walk_schema({"type": "string"}, tok, vocab, wt, s)  # warm the fork parent
    rows = forked_rows(
        walk_schema, [(i.schema, tok, vocab, wt, s) for i in items], args.timeout, ""
    )
    done = [r for r in rows if r["compiled"]]
    bad = [(i, r) for i, r in zip(items, rows, strict=True) if r["compiled"] and r["invalid"]]
    checked = asserted_formats()
    unasserted = sorted({f for i in items for f in formats_used(i.schema)} - checked)
    for item, r in bad:
        print(f"\nINVALID  {item.label}\n  schema: {json.dumps(item.schema)[:400]}")
        for e in r["invalid"]:
            print(f"  text:   {e['text']!r}\n  why:    {e['reason']}")
    skipped = sum(bool(r.get("validator_error")) for r in done)
    print(f"\n{args.suite}: {len(items)} schemas, seed {args.seed}, {args.walks} walks each\n")
    print(
        "| compiled | walked | walks | capped | stuck | duplicate names | invalid emitted "
        "| schemas with one |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {len(done)} | {sum(r['walks'] > 0 for r in done)} | {sum(r['walks'] for r in done)} "
        f"| {sum(r['capped'] for r in done)} | {sum(r['stuck'] for r in done)} "
        f"| {sum(r['duplicate_names'] for r in done)} "
        f"| {sum(r['invalid_count'] for r in done)} | {len(bad)} |"
    )
    if skipped:
        print(f"\n{skipped} compiled schemas not validated (jsonschema could not build or run)")
    if unasserted:
        print(f"formats walked but not asserted by jsonschema here: {', '.join(unasserted)}")


if __name__ == "__main__":
    main()
