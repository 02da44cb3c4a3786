"""Speculative decoding: tokens/s with and without n-gram speculation, same engine settings.

Run: .venv/bin/python -m benchmarks.engine.speculative [--model PATH] [--quick] [--rounds N]

Workloads (greedy, the default model's GGUF unless --model, CPU):
  extraction  batch 1: a ~1,000-token record, a JSON Schema whose values are spans of it
  code-edit   batch 1: a ~60-line function rewritten with one change
  free-chat   batch 1: an open question (little to copy)
  decode-16   the 16 short prompts of benchmarks.peers (128 new tokens each, ignore_eos)

Rows (`--rows`): no speculation, n-gram (`speculative_algorithm="NGRAM"`), draft model
(`speculative_algorithm="STANDALONE"`, the default model's Q4_1 GGUF drafting for its dense
fp32 folder, which is then every row's target). Each row: tokens/s (completion
tokens over wall time, the faster of `--rounds` runs, the prompts' KV cached by a four-token
run just before, the draft model's too; the rows of a workload alternate on one machine),
forward steps per token, the accept length (tokens per verify forward), and whether the output
equals the no-speculation row token for token; `cpu tok/s`: completion tokens over the
process's CPU time of the run (every thread's; the median round), what a loaded machine's other
processes move least, best read with `--threads 1` (more threads' kernel workers spin while
they wait). `--llamacpp`: llama-server's rows on the same
files (none, its n-gram lookup, `-md` draft model); with the draft row and no `--model`, every
row's target is then the dense folder written once as a Q8_0 GGUF (`--target-gguf`), since
llama-server cannot load the folder. `--verify-ab`: only a verify step's forward as
an extend against as decode rows (`--one-thread`: on one thread, in CPU time).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from benchmarks.peers.compare import CITIES, PEOPLE
from runtime import Engine
from runtime.default_model import cache_root, default_gguf_path, ensure_default_model

FIELDS = ("customer", "email", "company", "street", "city", "order_id", "product", "note")
SCHEMA = {
    "type": "object",
    "properties": {k: {"type": "string", "maxLength": 80} for k in FIELDS},
    "required": list(FIELDS),
    "additionalProperties": False,
}


def record(seed: int = 0) -> str:
    """A support-ticket record of about 1,000 tokens: filler lines around the fields' values."""
    rng = random.Random(seed)
    words = (
        "shipment delayed warehouse invoice refund priority courier tracking customer "
        "support replacement battery charger screen warranty account billing"
    ).split()
    values = {
        "customer": "Margaret Okonkwo-Hale", "email": "m.okonkwo-hale@riverbend-analytics.com",
        "company": "Riverbend Analytics Ltd", "street": "4417 Old Quarry Road, Suite 210",
        "city": "Bellingham, Washington", "order_id": "RB-2024-118-77342-QX",
        "product": "Halcyon X2 portable espresso grinder (matte graphite)",
        "note": "replacement burr assembly requested after the second failed calibration",
    }  # fmt: skip
    lines = []
    for i, (k, v) in enumerate(values.items()):
        for _ in range(4):
            lines.append(" ".join(rng.choice(words) for _ in range(12)) + ".")
        lines.append(f"Ticket field {i + 1} ({k.replace('_', ' ')}): {v}.")
    return "\n".join(lines)


CODE = '''def summarize_orders(orders, currency="USD", include_refunds=False):
    """Totals per customer, the largest order and the refund share."""
    totals = {}
    largest = None
    refunds = 0.0
    count = 0
    for order in orders:
        if order is None:
            continue
        customer = order.get("customer")
        amount = float(order.get("amount", 0.0))
        if order.get("currency", currency) != currency:
            rate = order.get("rate", 1.0)
            amount = amount * rate
        if order.get("refunded"):
            refunds += amount
            if not include_refunds:
                continue
        totals[customer] = totals.get(customer, 0.0) + amount
        count += 1
        if largest is None or amount > largest["amount"]:
            largest = {"customer": customer, "amount": amount}
    grand_total = sum(totals.values())
    share = refunds / grand_total if grand_total else 0.0
    ranked = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)
    top = ranked[:5]
    lines = []
    for customer, total in top:
        lines.append(f"{customer}: {total:.2f} {currency}")
    report = {
        "count": count,
        "grand_total": round(grand_total, 2),
        "largest": largest,
        "refund_share": round(share, 4),
        "top": lines,
    }
    if count == 0:
        report["warning"] = "no orders"
    elif share > 0.25:
        report["warning"] = "many refunds"
    else:
        report["warning"] = None
    average = grand_total / count if count else 0.0
    report["average"] = round(average, 2)
    median_source = sorted(totals.values())
    if median_source:
        middle = len(median_source) // 2
        if len(median_source) % 2:
            median = median_source[middle]
        else:
            median = (median_source[middle - 1] + median_source[middle]) / 2
    else:
        median = 0.0
    report["median"] = round(median, 2)
    report["currency"] = currency
    report["customers"] = len(totals)
    report["refunds"] = round(refunds, 2)
    return report
'''


def chat(tok, user: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def workloads(tok, quick: bool) -> dict[str, dict]:
    short = [f"Write a long story about {p} in {CITIES[i % 8]}." for i, p in enumerate(PEOPLE)]
    return {
        "extraction": {
            "prompts": [
                chat(
                    tok,
                    "Copy these fields of the ticket below into JSON, each value "
                    "exactly as written.\n\n" + record(),
                )
            ],  # fmt: skip
            "kw": {"max_new_tokens": 200, "json_schema": json.dumps(SCHEMA)},
        },
        "code-edit": {
            "prompts": [
                chat(
                    tok,
                    "Rewrite this function with one change: rename the parameter "
                    "`orders` to `records`. Return the whole function.\n\n" + CODE,
                )
            ],  # fmt: skip
            "kw": {"max_new_tokens": 160 if quick else 600},
        },
        "free-chat": {
            "prompts": [
                chat(tok, "What makes a good morning routine? Answer in a few paragraphs.")
            ],  # fmt: skip
            "kw": {"max_new_tokens": 64 if quick else 200},
        },
        "decode-16": {
            "prompts": short,
            "kw": {"max_new_tokens": 32 if quick else 128, "ignore_eos": True},
        },
    }


def run(engine: Engine, w: dict) -> tuple[float, list[list[int]], dict]:
    prompts = w["prompts"] if len(w["prompts"]) > 1 else w["prompts"][0]
    # the prompts' KV first (and the grammar compiled): the timed run is the decoding. A few
    # tokens, so that a draft model computes the prompts' draft KV too (kept for a request
    # with the same head): neither model's prompt prefill is timed
    engine.generate(prompts, temperature=0.0, **{**w["kw"], "max_new_tokens": 4})
    before = engine.stats()
    cpu, start = time.process_time(), time.perf_counter()
    outs = engine.generate(prompts, temperature=0.0, **w["kw"])
    seconds = time.perf_counter() - start
    outs = outs if isinstance(outs, list) else [outs]
    after = engine.stats()
    keys = ("forward_steps", "spec_verify_steps", "spec_draft_tokens", "spec_accepted_tokens")
    delta = {k: after[k] - before[k] for k in keys}
    delta["cpu_s"] = time.process_time() - cpu  # the process's CPU time (every thread's)
    return seconds, [o.token_ids for o in outs], delta


def verify_ab(model_path: str | None, rounds: int, one_thread: bool = False) -> None:
    """A verify step of k + 1 rows computed as an extend against as decode rows (how the
    scheduler runs it now), on the model's own pool, after a 512-token context; the two ways
    alternate, medians of `rounds` runs each, a one-row decode step beside them. `one_thread`:
    on one thread, in CPU time (what a loaded machine's other processes move least)."""

    import torch

    if one_thread:
        torch.set_num_threads(1)
    clock = time.process_time if one_thread else time.perf_counter

    from runtime.attention.forward_batch import ForwardBatch

    engine = Engine(model_path, max_total_tokens=4096)
    model, pool, ps = engine.model, engine.pool, engine.pool.page_size
    context = 512

    def batch(rows: int, as_decode: bool) -> ForwardBatch:
        pos = list(range(context, context + rows))
        slots = [pages[p // ps] * ps + p % ps for p in pos]
        table = torch.tensor([pages], dtype=torch.int32)
        empty = torch.zeros(0, dtype=torch.int32)
        if as_decode:
            return ForwardBatch(
                torch.full((rows,), 100), torch.tensor(pos), torch.tensor(slots), rows,
                table.repeat(rows, 1), torch.tensor([p + 1 for p in pos], dtype=torch.int32),
                torch.zeros((0, 1), dtype=torch.int32), empty, empty, torch.arange(rows),
            )  # fmt: skip
        return ForwardBatch(
            torch.full((rows,), 100), torch.tensor(pos), torch.tensor(slots), 0,
            torch.zeros((0, 1), dtype=torch.int32), empty, table,
            torch.tensor([context], dtype=torch.int32), torch.tensor([rows], dtype=torch.int32),
            torch.arange(rows),
        )  # fmt: skip

    def timed(b: ForwardBatch) -> float:
        start = clock()
        model.forward(b, pool)
        return clock() - start

    pages = engine.scheduler.call(lambda: pool.alloc(-(-(context + 32) // ps)))
    try:
        print(("one thread, CPU ms" if one_thread else "wall ms") + ", medians")
        print(f"{'rows':>4} {'extend ms':>10} {'decode rows ms':>15} {'1-row decode ms':>16}")
        for rows in (2, 4, 5, 6, 9, 12, 16):
            got: dict[str, list[float]] = {"ext": [], "dec": [], "one": []}
            for _ in range(rounds):
                got["ext"].append(engine.scheduler.call(lambda r=rows: timed(batch(r, False))))
                got["dec"].append(engine.scheduler.call(lambda r=rows: timed(batch(r, True))))
                got["one"].append(engine.scheduler.call(lambda: timed(batch(1, True))))
            med = {k: statistics.median(v) * 1000 for k, v in got.items()}
            print(f"{rows:>4} {med['ext']:>10.1f} {med['dec']:>15.1f} {med['one']:>16.1f}")
    finally:
        engine.scheduler.call(lambda: pool.free(pages))
        engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model",
        default=None,
        help="the target (default: the default "
        "model's GGUF; with the draft row, its dense fp32 folder)",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="the draft row's model (default: the default model's GGUF)",
    )
    parser.add_argument(
        "--rows", default="none,ngram,draft", help="comma-separated rows: none, ngram, draft"
    )
    parser.add_argument(
        "--llamacpp",
        action="store_true",
        help="also llama.cpp's llama-server rows (none, n-gram, draft model)",
    )
    parser.add_argument("--llamacpp-threads", type=int, default=1)
    parser.add_argument(
        "--target-gguf",
        default=None,
        help="Q8_0 / F16 / F32: every row's target is the default model's dense folder written "
        "as a GGUF of that type (the default with --llamacpp and the draft row: Q8_0)",
    )
    parser.add_argument(
        "--work-dir", default=None, help="where --target-gguf's file is kept (default: the cache)"
    )
    parser.add_argument(
        "--no-cost-policy",
        action="store_true",
        help="verify every proposal (the cost-aware policy off)",
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--threads", type=int, default=0, help="every engine's num_threads (0: the default)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--draft-tokens", type=int, default=8)
    parser.add_argument("--only", default=None, help="comma-separated workload names")
    parser.add_argument(
        "--verify-ab",
        action="store_true",
        help="only: a verify step as an extend against as decode rows (the target's forward)",
    )
    parser.add_argument(
        "--one-thread",
        action="store_true",
        help="with --verify-ab: one thread, CPU time",
    )
    args = parser.parse_args(argv)
    if args.verify_ab:
        verify_ab(args.model, max(args.rounds, 5), args.one_thread)
        return 0
    rows = args.rows.split(",")
    target = pick_target(args, rows)
    draft = args.draft_model or str(default_gguf_path())
    common = {"max_total_tokens": 16384, "chunked_prefill_tokens": 512,
              "num_threads": args.threads or None}  # fmt: skip
    spec = {"speculative_num_draft_tokens": args.draft_tokens}
    kinds = {
        "none": {},
        "ngram": {"speculative_algorithm": "NGRAM", **spec},
        "draft": {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": draft,
                  **spec},
    }  # fmt: skip
    engines = {row: Engine(target, **common, **kinds[row]) for row in rows}
    if args.no_cost_policy:
        for engine in engines.values():
            if engine.scheduler.speculation is not None:
                engine.scheduler.speculation.cost_aware = False
    print(f"target {target or default_gguf_path()}; draft row: {draft}")
    work = workloads(next(iter(engines.values())).tokenizer, args.quick)
    if args.only:
        work = {k: v for k, v in work.items() if k in args.only.split(",")}
    for engine in engines.values():  # warm up
        engine.generate("Hello", max_new_tokens=4, temperature=0.0)
    print(f"{'workload':<11} {'row':<6} {'tokens':>6} {'tok/s':>8} {'x':>5} {'steps/tok':>9} "
          f"{'accept len':>10} {'identical':>9} {'cpu tok/s':>9} {'cpu x':>5}")  # fmt: skip
    ours: dict[str, dict[str, tuple]] = {}  # workload -> row -> (tok/s, ids)
    for name, w in work.items():
        best: dict[str, tuple] = {}
        cpu: dict[str, list[float]] = {}  # row -> CPU seconds of each round
        for _ in range(args.rounds):
            for row, engine in engines.items():
                engine.flush_cache()
                seconds, ids, delta = run(engine, w)
                cpu.setdefault(row, []).append(delta["cpu_s"])
                if row not in best or seconds < best[row][0]:
                    best[row] = (seconds, ids, delta)
        base_rate = base_cpu = None
        for row, (seconds, ids, delta) in best.items():
            tokens = sum(len(t) for t in ids)
            rate = tokens / seconds
            base_rate = base_rate or rate
            ours.setdefault(name, {})[row] = (rate, ids)
            steps = delta["spec_verify_steps"]
            accept = ((delta["spec_accepted_tokens"] + steps) / steps) if steps else 1.0
            same = ids == best[rows[0]][1]
            cpu_rate = tokens / max(statistics.median(cpu[row]), 1e-9)  # CPU: the median round
            base_cpu = base_cpu or cpu_rate
            print(f"{name:<11} {row:<6} {tokens:>6} {rate:>8.1f} {rate / base_rate:>5.2f} "
                  f"{delta['forward_steps'] / max(tokens, 1):>9.2f} {accept:>10.2f} "
                  f"{'yes' if same else 'NO':>9} {cpu_rate:>9.1f} "
                  f"{cpu_rate / base_cpu:>5.2f}")  # fmt: skip
    for engine in engines.values():
        engine.shutdown()
    if args.llamacpp:
        llamacpp_rows(work, target, draft, args, ours)
    return 0


def pick_target(args, rows: list[str]) -> str | None:
    """The target: `--model`; else with `--target-gguf QTYPE` (the default with `--llamacpp`
    and the draft row) the default model's dense folder written once as a GGUF of QTYPE
    matrices under `--work-dir`, a file llama-server loads too; else with the draft row the
    dense folder itself; else None (the default model's GGUF)."""
    if args.model is not None:
        return args.model
    qtype = args.target_gguf or ("Q8_0" if args.llamacpp and "draft" in rows else None)
    if qtype is not None:
        from benchmarks.peers.gguf_models import folder_gguf

        folder = ensure_default_model()
        path = Path(args.work_dir or cache_root() / "bench") / f"{folder.name}.{qtype}.gguf"
        return str(folder_gguf(folder, path, qtype))
    if "draft" in rows:
        return str(ensure_default_model())  # the GGUF dequantized: the draft's own weights
    return None


def llamacpp_rows(work: dict[str, dict], target: str | None, draft: str, args,
                  ours: dict[str, dict[str, tuple]]) -> None:  # fmt: skip
    """llama.cpp's llama-server on the same workloads (token ids in, greedy): no speculation,
    its n-gram lookup (`--spec-type ngram-simple`), and a draft model (`-md`) where the target
    is a GGUF file other than the draft (it cannot load a safetensors folder). Best of two runs
    each; `identical`: against its own no-speculation row; `= ours`: against our no-speculation
    row's output (the first row); `ours x`: our row of the same kind's tokens/s over this one's."""
    from benchmarks.peers.llamacpp import LlamaServer, find_server

    binary = find_server()
    gguf = target if target and str(target).endswith(".gguf") else str(default_gguf_path())
    if binary is None:
        print("llama.cpp rows: no llama-server found")
        return
    n = str(args.draft_tokens)
    rows = {"lcpp-none": (), "lcpp-ngram": ("--spec-type", "ngram-simple",
                                            "--spec-draft-n-max", n)}  # fmt: skip
    if gguf != draft and str(draft).endswith(".gguf"):
        rows["lcpp-draft"] = ("-md", draft, "--spec-draft-n-max", n)
    print(f"llama.cpp: {binary}, target {gguf}, {args.llamacpp_threads} thread(s)")
    jobs = {
        name: {"prompts": w["prompts"], "max_tokens": w["kw"]["max_new_tokens"],
               "ignore_eos": w["kw"].get("ignore_eos", False),
               "schema": json.loads(w["kw"]["json_schema"]) if "json_schema" in w["kw"] else None}
        for name, w in work.items()
    }  # fmt: skip
    slots = max(len(w["prompts"]) for w in work.values())
    results = {}
    for row, extra in rows.items():
        server = LlamaServer(binary, gguf, slots, 2048, args.llamacpp_threads, extra)
        try:
            results[row] = server.run(jobs)
        finally:
            server.close()
    print(f"{'workload':<11} {'row':<10} {'tokens':>6} {'tok/s':>8} {'identical':>9} "
          f"{'= ours':>6} {'ours x':>6}")  # fmt: skip
    for name in jobs:
        for row, res in results.items():
            r = res[name]
            if "failed" in r:
                print(f"{name:<11} {row:<10} failed: {r['failed']}")
                continue
            tokens = sum(len(t) for t in r["tokens"])
            rate = tokens / r["seconds"]
            same = r["tokens"] == results["lcpp-none"][name].get("tokens")
            mine = ours.get(name, {})
            first = next(iter(mine.values()), (0.0, None))[1]
            our_rate = mine.get(row.removeprefix("lcpp-"), (float("nan"), None))[0]
            print(f"{name:<11} {row:<10} {tokens:>6} {rate:>8.1f} {'yes' if same else 'NO':>9} "
                  f"{'yes' if r['tokens'] == first else 'no':>6} "
                  f"{our_rate / rate:>6.2f}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
