"""Conformance on the official JSON-Schema-Test-Suite (drafts 2020-12 and 7, required tests plus
`optional/format`), scored as the suite's README in the shared data says: one group = one
schema (a draft-7 group declaring its dialect with `$schema`), each `data` serialised compactly
in the schema's property order, tokenized with the deepseek tokenizer and walked through the
compiled constraint.

    python -m benchmarks.conformance                     # ours, the whole suite
    python -m benchmarks.conformance --only format       # groups whose file path has "format"
    python -m benchmarks.conformance --failures          # also list the groups not fully correct

Each group runs in a forked worker killed after --timeout seconds (counted as not compiled).
Prints our row beside the peers' figures from the suite's README.
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import re
import sys
from pathlib import Path
from typing import Any

from tests._grammar_fixtures import deepseek_tokenizer, serialise, shared_dir

DRAFTS = ("draft2020-12", "draft7")


def suite_dir() -> Path:
    return shared_dir() / "data" / "json-schema-test-suite"


NO_SUITE = f"JSON-Schema-Test-Suite not found at {suite_dir()} (set SGL_SHARED_DIR)"


def suite_files(only: str = "") -> list[str]:
    """The scored files: each draft's required tests, then its optional/format tests."""
    root = suite_dir() / "tests"
    files: list[str] = []
    for draft in DRAFTS:
        files += sorted(glob.glob(str(root / draft / "*.json")))
        files += sorted(glob.glob(str(root / draft / "optional" / "format" / "*.json")))
    return [f for f in files if only in os.path.relpath(f, root)]


def groups(files: list[str]) -> list[tuple[str, int, dict]]:
    """(file, index, group) for every group of the files."""
    out = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for i, group in enumerate(json.load(f)):
                out.append((path, i, group))
    return out


DIALECTS = {"draft7": "http://json-schema.org/draft-07/schema#"}


def scored_schema(schema: Any, path: str = "") -> Any:
    """Bare boolean schemas count as {} / {"not": {}}. A group from the draft-7 folder (its
    file `path`) declares that dialect with `$schema`, as a validator is told its draft for
    the suite (the suite's schemas leave it out)."""
    if schema is True:
        schema = {}
    elif schema is False:
        return {"not": {}}
    draft = next((d for d in DIALECTS if d in Path(path).parts), None)
    if draft and isinstance(schema, dict) and "$schema" not in schema:
        return {"$schema": DIALECTS[draft], **schema}
    return schema


def run_group(group: dict, tok: Any, vocab: Any, path: str = "") -> dict:
    """Compile one group's schema and walk each of its instances."""
    import grammar
    from tests._grammar_fixtures import walk

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


def run_all(items: list[tuple[str, int, dict]], timeout: float) -> list[dict]:
    from tests._grammar_fixtures import deepseek_vocab

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
