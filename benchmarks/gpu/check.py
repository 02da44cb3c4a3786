"""The engine on a GPU, checked against transformers on the same device, in one table.

Run on a GPU machine by `bash benchmarks/gpu_check.sh` (which first runs the kernel tests
compiled on CUDA); here, without a GPU, `python -m benchmarks.gpu.check --device cpu --quick`
runs the same code at small sizes (what `gpu_check.sh --dry-run` and tests/project/test_gpu_check.py
do), so an error in it shows before a GPU is lent.

Sections (`--sections`, comma-separated; all by default):
  tiny     random tiny Llama (CUDA graphs on and off) and DeepSeek V2 / V3 (MLA + MoE): the
           engine's greedy tokens on the device equal transformers' on the device
  default  the default model (SmolLM2-135M-Instruct: its Q4_1 GGUF, `--gguf`, dequantized),
           fp32: the same comparison
  bench    decode and prefill throughput of the default model, bf16 weights, KV bf16 or
           fp8_e4m3, CUDA graphs on and off
  fewshot  the few-shot workload of benchmarks/engine/shared_prefix.py: the engine with the
           radix cache vs transformers' generate() (batched, left-padded) on the same device

Offline: nothing is downloaded. The tokenizer of the tiny models comes from `--tokenizer`, else
the GGUF, else the default model's cache. Exit status 1 when a comparison fails.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from runtime import Engine
from tests.support import tiny_models as fixtures

PROMPTS = fixtures.PROMPTS[:4]


@dataclass
class Row:
    section: str
    case: str
    result: str  # "equal", "DIFFERENT", a throughput, "skipped: ..."
    detail: str = ""
    ok: bool = True


def _hf_greedy(model, ids: list[int], n: int, device: torch.device) -> list[int]:
    x = torch.tensor([ids], device=device)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False)  # fmt: skip
    return out[0, len(ids) :].tolist()


def _hf_model(source: Path, device: torch.device, dtype: torch.dtype, gguf: bool = False):
    from transformers import AutoModelForCausalLM

    kw = {"gguf_file": source.name} if gguf else {}
    folder = source.parent if gguf else source
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, **kw)
    model = model.to(device).eval()
    model.generation_config.eos_token_id = None  # fixed-length greedy runs
    model.generation_config.pad_token_id = 0
    return model


def compare(section: str, case: str, source: Path, device: torch.device, n: int,
            engine_kw: dict, gguf: bool = False) -> Row:  # fmt: skip
    """Greedy tokens of the engine and of transformers for PROMPTS, both on `device`, fp32."""
    hf = _hf_model(source, device, torch.float32, gguf)
    with Engine(source, device=str(device), mem_budget_gb=0.25, **engine_kw) as engine:
        ids = [engine.encode(p) for p in PROMPTS]
        ours = engine.generate(ids, max_new_tokens=n, temperature=0.0, ignore_eos=True)
        graphs = engine.runner.graphs is not None
        replays = engine.stats()["graph_replays"]
    theirs = [_hf_greedy(hf, i, n, device) for i in ids]
    del hf
    same = [r.token_ids == t for r, t in zip(ours, theirs, strict=True)]
    detail = f"{sum(same)}/{len(same)} prompts x {n} tokens; graphs {graphs} ({replays} replays)"
    return Row(section, case, "equal" if all(same) else "DIFFERENT", detail, all(same))


def tiny_rows(device: torch.device, work: Path, quick: bool) -> list[Row]:
    n = 8 if quick else 24
    rows = []
    llama = fixtures.make_tiny_model(work / "tiny-llama")
    for graphs in (True, False):
        kw = {"disable_cuda_graph": not graphs}
        if device.type == "cpu" and graphs:  # the padded static buffers, run eagerly
            kw["cuda_graph_bs"] = [1, 2, 4]
        case = f"tiny Llama, CUDA graphs {'on' if graphs else 'off'}"
        rows.append(compare("tiny", case, llama, device, n, kw))
    for kind in ("deepseek_v2", "deepseek_v3"):
        folder = fixtures.make_tiny_model(work / kind, kind)
        rows.append(compare("tiny", f"tiny {kind} (MLA + MoE)", folder, device, n, {}))
    return rows


def default_rows(device: torch.device, gguf: Path, quick: bool) -> list[Row]:
    n = 8 if quick else 32
    return [compare("default", "SmolLM2-135M (Q4_1 GGUF, fp32)", gguf, device, n, {}, True)]


def _decode_rate(engine: Engine, batch: int, n: int) -> float:
    """Generated tokens per second of `batch` requests decoding `n` tokens after a short
    cached prompt (the prefill step counted: one step in n)."""
    prompts = [f"Story {i}: the lighthouse keeper" for i in range(batch)]
    engine.generate(prompts, max_new_tokens=2, temperature=0.0)  # warm: cached prompts
    _sync(engine)
    start = time.perf_counter()
    out = engine.generate(prompts, max_new_tokens=n, temperature=0.0, ignore_eos=True)
    _sync(engine)
    return sum(len(r.token_ids) for r in out) / (time.perf_counter() - start)


def _prefill_rate(engine: Engine, batch: int, length: int) -> float:
    """Prompt tokens per second of `batch` distinct prompts of `length` tokens (no cache hit)."""
    vocab = engine.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, vocab - 100, (length,), generator=g).tolist() for _ in range(batch)
    ]
    engine.generate(prompts[:1], max_new_tokens=0)  # warm-up
    engine.flush_cache()
    _sync(engine)
    start = time.perf_counter()
    engine.generate(prompts, max_new_tokens=0)
    _sync(engine)
    return batch * length / (time.perf_counter() - start)


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _sync(engine: Engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def bench_rows(device: torch.device, gguf: Path, quick: bool) -> list[Row]:
    batches = (1, 4) if quick else (1, 16, 64)
    n, plen, pbatch = (16, 128, 2) if quick else (128, 1024, 16)
    rows = []
    for kv in ("bf16", "fp8_e4m3"):
        by_mode = {}
        for graphs in (True, False):
            kw = dict(dtype="bfloat16", kv_cache_dtype=kv, disable_cuda_graph=not graphs,
                      mem_budget_gb=0.5 if quick else 8.0)  # fmt: skip
            if device.type == "cpu" and graphs:
                kw["cuda_graph_bs"] = list(batches)
            case = f"KV {kv}, CUDA graphs {'on' if graphs else 'off'}"
            with Engine(gguf, device=str(device), max_running_requests=max(batches), **kw) as e:
                decode = [_decode_rate(e, b, n) for b in batches]
                prefill = _prefill_rate(e, pbatch, plen)
            by_mode[graphs] = decode
            rates = ", ".join(f"b{b} {_rate(r)}" for b, r in zip(batches, decode, strict=True))
            rows.append(Row("bench", case, f"decode tok/s {rates}",
                            f"prefill {_rate(prefill)} tok/s ({pbatch} x {plen})"))  # fmt: skip
        ratio = ", ".join(f"b{b} {g / e:.2f}x" for b, g, e in
                          zip(batches, by_mode[True], by_mode[False], strict=True))  # fmt: skip
        rows.append(Row("bench", f"KV {kv}: graphs / eager", f"decode {ratio}",
                        f"{n} new tokens per request"))  # fmt: skip
    return rows


def fewshot_rows(device: torch.device, gguf: Path, quick: bool) -> list[Row]:
    from benchmarks.engine.shared_prefix import few_shot

    questions, prefix, n = (4, 200, 8) if quick else (64, 1500, 32)
    with Engine(gguf, device=str(device), dtype="bfloat16", mem_budget_gb=2.0) as engine:
        prompts = few_shot(engine.tokenizer, prefix, questions)[0]
        engine.generate(prompts[:1], max_new_tokens=2)  # warm-up (and the prefix cached)
        engine.flush_cache()
        _sync(engine)
        start = time.perf_counter()
        out = engine.generate(prompts, max_new_tokens=n, temperature=0.0, ignore_eos=True)
        _sync(engine)
        ours = sum(len(r.token_ids) for r in out) / (time.perf_counter() - start)
        hit = engine.stats()["cache_hit_rate"]
        tok = engine.tokenizer
    hf = _hf_model(gguf, device, torch.bfloat16, gguf=True)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = tok(prompts, return_tensors="pt", padding=True).to(device)
    with torch.no_grad():
        hf.generate(**{k: v[:1] for k, v in enc.items()}, max_new_tokens=2, do_sample=False)
        _sync_device(device)
        start = time.perf_counter()
        hf.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        _sync_device(device)
    theirs = questions * n / (time.perf_counter() - start)
    detail = f"{questions} questions behind a {prefix}-token prefix, {n} tokens each, bf16"
    return [
        Row("fewshot", "engine, radix cache", f"{_rate(ours)} tok/s", f"{detail}; hit {hit:.0%}"),
        Row(
            "fewshot",
            "transformers generate (batched)",
            f"{_rate(theirs)} tok/s",
            f"engine / transformers = {ours / theirs:.1f}x",
        ),  # fmt: skip
    ]


def _sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def print_table(rows: list[Row], device: torch.device) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"\n## GPU check on {name} (torch {torch.__version__})\n")
    print("| section | case | result | detail |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r.section} | {r.case} | {r.result} | {r.detail} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a dry run)")
    ap.add_argument("--sections", default="tiny,default,bench,fewshot")
    ap.add_argument("--gguf", type=Path, default=None, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--tokenizer", type=Path, default=None, help="SmolLM2's tokenizer folder")
    ap.add_argument("--work", type=Path, default=Path("/tmp/sgl-gpu-check"))
    ap.add_argument("--quick", action="store_true", help="small sizes (the CPU dry run)")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    ap.add_argument(
        "--merge", type=Path, default=None, help="an earlier run's --out: its rows first"
    )
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda but torch.cuda.is_available() is False")
    sections = a.sections.split(",")
    gguf = a.gguf
    if gguf is None and any(s in sections for s in ("default", "bench", "fewshot")):
        from runtime.default_model import default_gguf_path

        gguf = default_gguf_path()  # ModelNotFoundError names the missing package
    fixtures._tokenizer = _tokenizer(a.tokenizer, gguf)
    a.work.mkdir(parents=True, exist_ok=True)
    steps = {"tiny": lambda: tiny_rows(device, a.work, a.quick),
             "default": lambda: default_rows(device, gguf, a.quick),
             "bench": lambda: bench_rows(device, gguf, a.quick),
             "fewshot": lambda: fewshot_rows(device, gguf, a.quick)}  # fmt: skip
    rows = [Row(**r) for r in json.loads(a.merge.read_text())] if a.merge else []
    for section in sections:
        t = time.perf_counter()
        rows += steps[section]()
        print(f"gpu_check: {section} done in {time.perf_counter() - t:.0f} s", flush=True)
    if a.out:
        a.out.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print_table(rows, device)
    return 0 if all(r.ok for r in rows) else 1


def _tokenizer(folder: Path | None, gguf: Path | None):
    """SmolLM2's tokenizer for the tiny models: a folder, else the GGUF's, else None (then the
    test fixtures convert the default model, as in the tests)."""
    if folder is not None:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder))
    if gguf is not None:
        from runtime.models.gguf import load_tokenizer

        return load_tokenizer(gguf)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
