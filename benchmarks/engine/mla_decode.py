"""DeepSeek's decode paths side by side in one process: CPU ms per decoded token, one thread.

Run: .venv/bin/python -m benchmarks.engine.mla_decode [--rounds 5] [--dtype float32]

The DeepSeek-V3-shaped tiny model of benchmarks/engine/mla.py (hidden 256, 4 layers, 8 heads,
latent 64 + 16, MoE after layer 1), random weights, twice: the dense folder, and a GGUF of it
(tests/support/gguf_families' block formats: Q8_0 / Q4_K / Q6_K ...). Paths, alternated within
each round on the same engine (the prompts in the radix cache), context 256, 48 new tokens,
batch 1 and 4:
  torch  mla.py's torch ops per layer (`mla.C_DECODE = False`, no decode chain)
  C      each layer's decode attention in one C call (csrc/mla.c), per layer
  chain  the GGUF's whole decode step in one C call (quant_chain.py with mla.py's and moe.py's
         hooks); the dense folder has no chain
Each cell is the median over the rounds of (process CPU time / tokens); greedy tokens are
compared across the paths (float32: equal).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.engine.mla import MODELS, SHAPE
from runtime import Engine
from runtime.models import mla
from tests.support.tiny_models import make_tiny_model, tiny_config

CONTEXT, NEW = 256, 48


def _gguf(path: Path) -> Path:
    from transformers import AutoModelForCausalLM

    from tests.support.gguf_families import write_family_gguf

    kind, overrides = MODELS["deepseek-v3"]
    config = tiny_config(kind, **SHAPE, **overrides)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    write_family_gguf(path, config, model.state_dict())
    return path


def measure(model: Path, dtype: str, rounds: int) -> dict[tuple[int, str], tuple[float, bool]]:
    """(batch, path) -> (median CPU ms per token, tokens equal the torch path's)."""
    times: dict[tuple[int, str], list[float]] = {}
    tokens: dict[tuple[int, str], list] = {}
    with Engine(str(model), page_size=16, mem_budget_gb=0.5, dtype=dtype) as engine:
        chain = engine.model._chain
        paths = {"torch": (False, None), "C": (True, None)}
        if chain is not None:
            paths["chain"] = (True, chain)
        gen = torch.Generator().manual_seed(0)
        for batch in (1, 4):
            prompts = [torch.randint(100, 1000, (CONTEXT,), generator=gen).tolist()
                       for _ in range(batch)]  # fmt: skip
            engine.generate(prompts, max_new_tokens=1)
            for _ in range(rounds):
                for name, (c_decode, step_chain) in paths.items():
                    mla.C_DECODE, engine.model._chain = c_decode, step_chain
                    start = time.process_time()
                    out = engine.generate(prompts, max_new_tokens=NEW, min_new_tokens=NEW,
                                          temperature=0.0)  # fmt: skip
                    ms = (time.process_time() - start) / (NEW * batch) * 1000
                    times.setdefault((batch, name), []).append(ms)
                    tokens[(batch, name)] = [r.token_ids for r in out]
        mla.C_DECODE, engine.model._chain = True, chain
    return {key: (statistics.median(v), tokens[key] == tokens[(key[0], "torch")])
            for key, v in times.items()}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        kind, overrides = MODELS["deepseek-v3"]
        folder = make_tiny_model(Path(tmp) / "dense", kind, **SHAPE, **overrides)
        models = {"dense folder": folder, "GGUF": _gguf(Path(tmp) / "deepseek-v3.gguf")}
        print(f"CPU ms per decoded token, {args.dtype}, one thread, context {CONTEXT}, "
              f"median of {args.rounds} alternated rounds")  # fmt: skip
        print("| model | batch | torch | C | chain | C / torch | chain / torch | tokens |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for label, path in models.items():
            cells = measure(path, args.dtype, args.rounds)
            for batch in (1, 4):
                base = cells[(batch, "torch")][0]
                row = [cells.get((batch, n), (None, True))[0] for n in ("torch", "C", "chain")]
                same = all(cells[k][1] for k in cells if k[0] == batch)
                shown = ["-" if v is None else f"{v:.2f}" for v in row]
                ratios = ["-" if v is None else f"{base / v:.2f}x" for v in row[1:]]
                print(f"| {label} | {batch} | " + " | ".join(shown + ratios) +
                      f" | {'equal' if same else 'differ'} |")  # fmt: skip


if __name__ == "__main__":
    main()
