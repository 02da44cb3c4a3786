"""The one-call decode chain against the per-layer loop for the family parts it now runs: CPU ms
per decoded token, one thread, alternated in one process.

Run: .venv/bin/python -m benchmarks.engine.chain_families [--rounds 3] [--steps 32]

A small random Llama-shaped GGUF (hidden 256, 8 layers, 8 query / 2 KV heads of 32, MLP 768,
Q8_0 / Q4_K / Q6_K by role as tests/support/gguf_families writes them), loaded as it is, then
run as each variant's config: plain, Qwen2's q / k / v biases, partial rotary with LongRoPE
(Phi-4-mini's kind), attention logit soft-caps, a 48-token sliding window on every layer
(Mistral's). For each, `decode_run` (tests/support/forward_batches: prefill, then greedy decode
steps of the whole batch) with the chain and without it (`model._chain = None`), alternated
within each round; a cell is the median over the rounds of the decode steps' process CPU time
per token ((steps + 1 steps) minus (1 step), over steps x batch). Greedy tokens are compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import torch

from runtime.attention import make_backend
from runtime.config import SLIDING
from runtime.models.gguf import load_gguf
from runtime.models.llama import LlamaModel
from tests.support.forward_batches import decode_run

SHAPE = dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
             head_dim=32, intermediate_size=768)  # fmt: skip


def _file(path: Path) -> Path:
    from transformers import AutoModelForCausalLM

    from tests.support.family_models import family_config
    from tests.support.gguf_families import write_family_gguf

    config = family_config("qwen2", **SHAPE)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.bias"):
                p.add_(torch.randn_like(p) * 0.1)
    write_family_gguf(path, config, model.state_dict())
    return path


def _variants(config, state: dict) -> dict[str, tuple]:
    plain = {k: v for k, v in state.items() if not k.endswith(".bias")}
    rd = config.head_dim // 2
    longrope = {"rope_type": "longrope", "original_max_position_embeddings": 64,
                "short_factor": [1.0] * (rd // 2), "long_factor": [4.0] * (rd // 2)}  # fmt: skip
    return {
        "plain": (config, plain),
        "q/k/v biases (Qwen2)": (config, state),
        "partial rotary + LongRoPE": (
            dataclasses.replace(config, partial_rotary_factor=0.5, rope_scaling=longrope), plain
        ),
        "soft-capped scores": (dataclasses.replace(config, attn_logit_softcapping=30.0), plain),
        "window 48 (Mistral)": (
            dataclasses.replace(config, sliding_window=48,
                                layer_types=(SLIDING,) * config.num_layers), plain,
        ),
    }  # fmt: skip


def _cpu_ms(model, prompts: list[list[int]], steps: int) -> tuple[float, torch.Tensor]:
    start = time.process_time()
    decode_run(model, torch.float32, prompts, steps=1)
    one = time.process_time() - start
    start = time.process_time()
    tokens, _ = decode_run(model, torch.float32, prompts, steps=steps + 1)
    return (time.process_time() - start - one) / (steps * len(prompts)) * 1000, tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        config, state = load_gguf(_file(Path(tmp) / "qwen2.gguf"))
    print(f"CPU ms per decoded token, float32, one thread, {args.steps} steps after a 64-token "
          f"prompt, median of {args.rounds} alternated rounds")  # fmt: skip
    print("| variant | batch | per-layer | chain | per-layer / chain | tokens |")
    print("|---|---:|---:|---:|---:|---|")
    for label, (cfg, weights) in _variants(config, state).items():
        model = LlamaModel(cfg, weights, torch.float32, attention=make_backend("cpu"))
        chain = model._chain
        assert chain is not None, model.decode_path
        for batch in (1, 4):
            prompts = [torch.randint(100, 1000, (64,), generator=gen).tolist()
                       for _ in range(batch)]  # fmt: skip
            times: dict[str, list[float]] = {"per-layer": [], "chain": []}
            tokens = {}
            for _ in range(args.rounds):
                for name, use in (("per-layer", None), ("chain", chain)):
                    model._chain = use
                    ms, tokens[name] = _cpu_ms(model, prompts, args.steps)
                    times[name].append(ms)
            a, b = (statistics.median(times[n]) for n in ("per-layer", "chain"))
            same = torch.equal(tokens["per-layer"], tokens["chain"])
            print(f"| {label} | {batch} | {a:.2f} | {b:.2f} | {a / b:.2f}x | "
                  f"{'equal' if same else 'differ'} |")  # fmt: skip


if __name__ == "__main__":
    main()
