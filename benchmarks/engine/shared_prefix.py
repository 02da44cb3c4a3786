"""Engine throughput on shared-prefix workloads: radix cache on vs off vs transformers.

Run: .venv/bin/python -m benchmarks.engine.shared_prefix [--quick] [--threads N] [--hf-sample K]

Workloads (greedy, SmolLM2-135M-Instruct, fp32, CPU):
  few-shot    Q questions behind one shared few-shot prefix (~1,500 tokens), 32 new tokens each
  multi-turn  C chat conversations x T turns (each turn's prompt is the whole history)
  fork        one prompt, B branches (different branch headers) of 64 new tokens

Modes: the engine with the radix cache; the same engine with the cache off; transformers'
generate() one request at a time (HF loop) and left-padded in one batch (HF batched). The HF
modes run on the first K requests of each round (`--hf-sample`) and their tokens/s are rates
over what they ran. "computed" / "cached" count prompt tokens whose K/V were computed / served
from the radix cache; "hit %" is cached over the shareable tokens (prompt tokens any earlier
request in the workload already had).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from runtime import Engine

COUNTRIES = (
    "France Paris|Japan Tokyo|Italy Rome|Germany Berlin|Spain Madrid|Canada Ottawa|Egypt Cairo|"
    "Kenya Nairobi|Peru Lima|Chile Santiago|Greece Athens|Norway Oslo|Sweden Stockholm|"
    "Poland Warsaw|Austria Vienna|Ireland Dublin|Portugal Lisbon|Hungary Budapest|"
    "Finland Helsinki|Denmark Copenhagen|Belgium Brussels|Cuba Havana|Mexico Mexico City|"
    "Argentina Buenos Aires|Colombia Bogota|Thailand Bangkok|Vietnam Hanoi|Iran Tehran|"
    "Iraq Baghdad|Turkey Ankara|Russia Moscow|China Beijing|India New Delhi|Nepal Kathmandu|"
    "Ghana Accra|Nigeria Abuja|Morocco Rabat|Tunisia Tunis|Ukraine Kyiv|Romania Bucharest"
).split("|")
TOPICS = ["rivers", "mountains", "food", "history", "music", "sports", "weather", "animals"]


@dataclass
class Row:
    workload: str
    mode: str
    requests: int
    seconds: float
    out_tokens: int
    computed: int
    cached: int
    shareable: int

    @property
    def tok_s(self) -> float:
        return self.out_tokens / self.seconds if self.seconds else 0.0


def few_shot(tok, prefix_tokens: int, n: int) -> list[list[str]]:
    shots, i = [], 0
    text = "Answer each question about world geography with one short sentence.\n\n"
    while len(tok(text).input_ids) < prefix_tokens:
        country, capital = COUNTRIES[i % len(COUNTRIES)].split(" ", 1)
        topic = TOPICS[i % len(TOPICS)]
        shots.append(
            f"Q: What is the capital of {country}, and what is it known for ({topic})?\n"
            f"A: The capital of {country} is {capital}, known for its {topic}.\n\n"
        )
        text += shots[-1]
        i += 1
    qs = [f"Q: Tell me about the {TOPICS[j % 8]} of {COUNTRIES[j % 40].split()[0]} (#{j}).\nA:"
          for j in range(n)]  # fmt: skip
    return [[text + q for q in qs]]


def fork(tok, branches: int) -> list[list[str]]:
    base = (
        "You are planning a two-week trip through Europe with a small budget. Think about "
        "transport, lodging, food, museums, and the order of the cities. " * 6
    )
    return [[base + f"\n\nPlan option {b + 1} ({TOPICS[b % 8]} first):" for b in range(branches)]]


def run_engine(engine: Engine, rounds, max_new: int, chat_turns: int = 0) -> tuple[float, int]:
    """Run the rounds (a list of prompt lists, or a chat workload); returns (seconds, tokens)."""
    start, tokens = time.perf_counter(), 0
    if chat_turns:
        histories = rounds
        for turn in range(chat_turns):
            ask = {"role": "user", "content": f"Turn {turn + 1}: what else about {TOPICS[turn]}?"}
            prompts = [engine.tokenizer.apply_chat_template(h + [ask], tokenize=False,
                       add_generation_prompt=True) for h in histories]  # fmt: skip
            results = engine.generate(prompts, max_new_tokens=max_new, temperature=0.0,
                                      ignore_eos=True)  # fmt: skip
            for h, r in zip(histories, results, strict=True):
                h.append(ask)
                h.append({"role": "assistant", "content": r.text})
                tokens += len(r.token_ids)
        return time.perf_counter() - start, tokens
    for prompts in rounds:
        results = engine.generate(prompts, max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
        tokens += sum(len(r.token_ids) for r in results)
    return time.perf_counter() - start, tokens


def hf_generate(model, tok, prompts: list[str], max_new: int, batched: bool) -> int:
    if not batched:
        n = 0
        for p in prompts:
            ids = tok(p, return_tensors="pt")
            out = model.generate(**ids, max_new_tokens=max_new, min_new_tokens=max_new,
                                 do_sample=False)  # fmt: skip
            n += out.shape[1] - ids.input_ids.shape[1]
        return n
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False)
    return (out.shape[1] - enc.input_ids.shape[1]) * len(prompts)


def shareable_tokens(seqs: list[list[int]]) -> int:
    """Prompt tokens that some earlier sequence of the workload already had as a prefix."""
    total = 0
    for i, s in enumerate(seqs):
        best = 0
        for t in seqs[:i]:
            n = 0
            for a, b in zip(s, t, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        total += best
    return total


def memory_bandwidth_gbs() -> float:
    src = torch.empty(64 * 1024 * 1024, dtype=torch.float32).fill_(1.0)  # 256 MiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best / 1e9  # read + write


def decode_b1(engine: Engine, n: int) -> float:
    prompt = "Write a long story about a lighthouse keeper."
    engine.generate(prompt, max_new_tokens=2, temperature=0.0)
    t = time.perf_counter()
    engine.generate(prompt, max_new_tokens=1, temperature=0.0)
    t1 = time.perf_counter() - t
    t = time.perf_counter()
    engine.generate(prompt, max_new_tokens=n + 1, temperature=0.0, ignore_eos=True)
    return n / (time.perf_counter() - t - t1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--hf-sample", type=int, default=0, help="requests per round for HF modes")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--workloads", default="few-shot,multi-turn,fork", help="comma list")
    ap.add_argument("--skip-decode", action="store_true", help="no batch-1 decode measurement")
    ap.add_argument(
        "--nocache-sample",
        type=int,
        default=0,
        help="few-shot requests the cache-off engine runs (0: all)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    q = dict(fs_prefix=400, fs_n=16, fs_new=16, mt_conv=4, mt_turns=3, mt_new=16, fk_b=4,
             fk_new=32, hf=4) if args.quick else dict(fs_prefix=1500, fs_n=64, fs_new=32,
             mt_conv=16, mt_turns=4, mt_new=32, fk_b=8, fk_new=64, hf=8)  # fmt: skip
    hf_k = args.hf_sample or q["hf"]
    cached_engine = Engine(max_running_requests=64)
    tok = cached_engine.tokenizer
    workloads = {
        "few-shot": (few_shot(tok, q["fs_prefix"], q["fs_n"]), q["fs_new"], 0),
        "multi-turn": (None, q["mt_new"], q["mt_turns"]),
        "fork": (fork(tok, q["fk_b"]), q["fk_new"], 0),
    }
    rows: list[Row] = []
    nocache_engine = Engine(enable_radix_cache=False, max_running_requests=64)
    for name, (rounds, max_new, turns) in list(workloads.items()):
        if name not in args.workloads.split(","):
            continue
        for mode, engine in (("engine + radix cache", cached_engine),
                             ("engine, cache off", nocache_engine)):  # fmt: skip
            engine.flush_cache()
            before = engine.stats()
            data = [[{"role": "system", "content": "You are a helpful travel guide. " * 8}]
                    for _ in range(q["mt_conv"])] if turns else rounds  # fmt: skip
            limit = len(seqs_all := [p for r in rounds for p in r]) if not turns else 10**9
            if mode.endswith("cache off") and args.nocache_sample and not turns:
                limit = args.nocache_sample  # cache-off few-shot is prefill-bound: a rate
                data = [seqs_all[:limit]]
            seconds, out = run_engine(engine, data, max_new, turns)
            after = engine.stats()
            if turns:  # rebuild the prompts the chat rounds sent, for the shareable count
                seqs = []
                for t in range(turns):
                    for h in data:
                        text = tok.apply_chat_template(
                            h[: 1 + 2 * t + 1], tokenize=False, add_generation_prompt=True
                        )
                        seqs.append(tok(text).input_ids)
                n_req = len(seqs)
            else:
                seqs = [tok(p).input_ids for p in (data[0] if len(data) == 1 else seqs_all)]
                n_req = len(seqs)
            rows.append(Row(name, mode, min(n_req, limit), seconds, out,
                            after["prefill_computed_tokens"] - before["prefill_computed_tokens"],
                            after["cache_hit_tokens"] - before["cache_hit_tokens"],
                            shareable_tokens(seqs)))  # fmt: skip
            if turns:
                workloads[name] = (data, max_new, turns)
            print(f"# {rows[-1]}", flush=True)
        if args.skip_hf:
            continue
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(cached_engine.model_path)).eval()
        if turns:
            hist = workloads[name][0][:hf_k]
            prompts_by_round = [
                [
                    tok.apply_chat_template(
                        h[: 1 + 2 * t + 1], tokenize=False, add_generation_prompt=True
                    )
                    for h in hist
                ]
                for t in range(turns)
            ]
        else:  # fmt: skip
            prompts_by_round = [r[:hf_k] for r in rounds]
        for mode, batched in (("HF generate loop", False), ("HF generate batched", True)):
            start, out, computed = time.perf_counter(), 0, 0
            with torch.inference_mode():
                for prompts in prompts_by_round:
                    out += hf_generate(hf, tok, prompts, max_new, batched)
                    computed += sum(len(tok(p).input_ids) for p in prompts)
            n = sum(len(p) for p in prompts_by_round)
            rows.append(Row(name, mode, n, time.perf_counter() - start, out, computed, 0, 0))
            print(f"# {rows[-1]}", flush=True)
    print_table(rows)
    if args.skip_decode:
        return
    bw = memory_bandwidth_gbs()
    weights = cached_engine.model.weight_bytes()
    tok_s = decode_b1(cached_engine, 64 if not args.quick else 32)
    bound = bw * 1e9 / weights
    print(
        f"\nbatch-1 decode: {tok_s:.1f} tok/s; bound = weights {weights / 1e6:.0f} MB / copy "
        f"bandwidth {bw:.1f} GB/s = {bound:.1f} tok/s; ratio {bound / tok_s:.2f}x "
        f"(threads={torch.get_num_threads()})"
    )
    cached_engine.shutdown()
    nocache_engine.shutdown()


def print_table(rows: list[Row]) -> None:
    head = ("workload", "mode", "reqs", "wall s", "out tok", "tok/s", "computed", "cached",
            "hit %", "vs HF loop", "vs cache off")  # fmt: skip
    lines = []
    for r in rows:
        same = [x for x in rows if x.workload == r.workload]
        hf_loop = next((x for x in same if x.mode == "HF generate loop"), None)
        off = next((x for x in same if x.mode == "engine, cache off"), None)
        lines.append((r.workload, r.mode, str(r.requests), f"{r.seconds:.1f}", str(r.out_tokens),
                      f"{r.tok_s:.1f}", str(r.computed), str(r.cached),
                      f"{100 * r.cached / r.shareable:.0f}" if r.shareable else "-",
                      f"{r.tok_s / hf_loop.tok_s:.1f}x" if hf_loop else "-",
                      f"{r.tok_s / off.tok_s:.1f}x" if off else "-"))  # fmt: skip
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    fmt = lambda cells: (
        "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"
    )
    print(fmt(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        print(fmt(line))


if __name__ == "__main__":
    main()
