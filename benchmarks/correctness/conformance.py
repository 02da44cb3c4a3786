"""Conformance on the official JSON-Schema-Test-Suite (drafts 2020-12 and 7, required tests plus
`optional/format`), scored as the suite's README in the shared data says: one group = one
schema (a draft-7 group declaring its dialect with `$schema`), each `data` serialised compactly
in the schema's property order, tokenized with the deepseek tokenizer and walked through the
compiled constraint.

    python -m benchmarks.correctness.conformance                # ours, the whole suite
    python -m benchmarks.correctness.conformance --only format  # groups whose path has "format"
    python -m benchmarks.correctness.conformance --failures     # also list the groups not correct

Each group runs in a forked worker killed after --timeout seconds (counted as not compiled).
Prints our row beside the peers' figures from the suite's README.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from benchmarks.correctness.forked import forked_rows
from benchmarks.correctness.suites import (
    NO_SUITE,
    groups,
    scored_schema,
    suite_dir,
    suite_files,
)
from tests.support.json_text import serialise
from tests.support.tokenizers import deepseek_tokenizer


def run_group(group: dict, tok: Any, vocab: Any, path: str = "") -> dict:
    """Compile one group's schema and walk each of its instances."""
    import grammar
    from tests.support.walks import walk

    schema = scored_schema(group["schema"], path)
    try:
        grammar.clear_caches()
        compiled = grammar.compile_json_schema(schema, vocab)
        compiled.matcher().mask()
    except Exception as e:
        return {"compiled": False, "error": f"{type(e).__name__}: {e}"[:200]}
    valid_rejected: list[str] = []
    invalid_accepted: list[str] = []
    for test in group["tests"]:
        try:
            text = serialise(schema, test["data"])
            ids = tok.encode(text, add_special_tokens=False)
            ok = walk(compiled, ids)
        except Exception:  # e.g. an instance the tokenizer cannot encode
            ok = False
        if test["valid"] and not ok:
            valid_rejected.append(test["description"])
        elif not test["valid"] and ok:
            invalid_accepted.append(test["description"])
    return {
        "compiled": True,
        "valid_rejected": valid_rejected,
        "invalid_accepted": invalid_accepted,
    }


def run_all(items: list[tuple[str, int, dict]], timeout: float) -> list[dict]:
    from tests.support.tokenizers import deepseek_vocab

    tok = deepseek_tokenizer()
    vocab = deepseek_vocab()
    vocab.prepared()
    run_group({"schema": {"type": "string"}, "tests": [{"data": "w", "valid": True}]}, tok, vocab)
    args = [(group, tok, vocab, path) for path, _, group in items]
    return forked_rows(run_group, args, timeout, "")


def summary(rows: list[dict]) -> dict:
    done = [r for r in rows if r["compiled"]]
    return {
        "groups": len(rows),
        "compiled": len(done),
        "correct": sum(not r["valid_rejected"] and not r["invalid_accepted"] for r in done),
        "valid_rejected": sum(len(r["valid_rejected"]) for r in done),
        "invalid_accepted": sum(len(r["invalid_accepted"]) for r in done),
    }


def peer_rows() -> list[str]:
    """The peers' rows of the README's table (engine | compiled | correct | rejected | accepted)."""
    try:
        text = (suite_dir() / "README.md").read_text(encoding="utf-8")
    except OSError:
        return []
    return [
        line
        for line in text.splitlines()
        if re.match(r"\|\s*[^|]+\|\s*[\d,]+\s*\|", line) and "this project" not in line
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="files whose path (under tests/) contains this")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per group")
    ap.add_argument("--failures", action="store_true", help="list groups not fully correct")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    files = suite_files(args.only)
    if not files:
        sys.exit(NO_SUITE)
    items = groups(files)
    rows = run_all(items, args.timeout)
    s = summary(rows)
    root = suite_dir() / "tests"
    if args.failures:
        for (path, i, group), r in zip(items, rows, strict=True):
            where = f"{os.path.relpath(path, root)}#{i} {group['description']!r}"
            if not r["compiled"]:
                print(f"refused  {where}: {r['error']}")
            elif r["valid_rejected"] or r["invalid_accepted"]:
                print(
                    f"WRONG    {where}: valid rejected {r['valid_rejected']}, "
                    f"invalid accepted {r['invalid_accepted']}"
                )
    print(f"\n{s['groups']} groups\n")
    print("| engine | compiled | fully correct | valid rejected | invalid accepted |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| ours (grammar/) | {s['compiled']} | {s['correct']} | {s['valid_rejected']} "
        f"| {s['invalid_accepted']} |"
    )
    if not args.only:
        for line in peer_rows():
            print(line + "  (README)")


if __name__ == "__main__":
    main()
