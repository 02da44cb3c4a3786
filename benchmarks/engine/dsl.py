"""Few-shot program over a batch: prefix hoisting + radix cache vs cache off vs transformers.

Run: .venv/bin/python -m benchmarks.engine.dsl [--n 64] [--shots 24] [--max-new-tokens 12]

The same few-shot program (a long shared header of examples, then the input's question, then
one greedy gen that stops at a newline) runs three ways:

  sgl + cache     run_batch on Engine(): the constant prefix is prefilled once, every request
                  finds it in the radix cache and computes only its own tail
  sgl, cache off  run_batch on Engine(enable_radix_cache=False): every request prefills all
  transformers    a hand-written loop over the inputs with the model's own KV cache (greedy,
                  one request at a time, stopping at the newline), as people write it by hand

"prefill tokens" counts prompt tokens whose K/V were computed (prompt minus cached tokens).
"""

from __future__ import annotations

import argparse
import time

import sgl_dsl as sgl

COUNTRIES = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Germany", "Berlin"),
    ("Spain", "Madrid"),
    ("Canada", "Ottawa"),
    ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Chile", "Santiago"),
    ("Greece", "Athens"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Poland", "Warsaw"),
    ("Austria", "Vienna"),
    ("Ireland", "Dublin"),
    ("Portugal", "Lisbon"),
    ("Cuba", "Havana"),
    ("Thailand", "Bangkok"),
    ("Iran", "Tehran"),
    ("Iraq", "Baghdad"),
    ("China", "Beijing"),
    ("Russia", "Moscow"),
    ("India", "New Delhi"),
    ("Mexico", "Mexico City"),
    ("Argentina", "Buenos Aires"),
    ("Turkey", "Ankara"),
    ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"),
    ("Hungary", "Budapest"),
    ("Belgium", "Brussels"),
    ("Netherlands", "Amsterdam"),
    ("Switzerland", "Bern"),
    ("Vietnam", "Hanoi"),
    ("Nigeria", "Abuja"),
    ("Ghana", "Accra"),
    ("Morocco", "Rabat"),
    ("Colombia", "Bogota"),
    ("Venezuela", "Caracas"),
    ("Ukraine", "Kyiv"),
]
TEMPLATES = [
    "What is the capital of {}?",
    "Name the capital city of {}.",
    "Which city is the capital of {}?",
]


def few_shot_header(shots: int) -> str:
    lines = ["Answer each question with the name of a city.\n"]
    for country, capital in COUNTRIES[:shots]:
        lines.append(f"Question: What is the capital of {country}?\nAnswer: {capital}\n")
    return "\n".join(lines) + "\n"


def make_program(header: str) -> sgl.SglFunction:
    @sgl.function
    def few_shot(s, question):
        s += header
        s += "Question: " + question + "\nAnswer:" + sgl.gen("answer", stop="\n")

    return few_shot


def make_inputs(n: int) -> list[str]:
    return [
        TEMPLATES[i % len(TEMPLATES)].format(COUNTRIES[(i * 7) % len(COUNTRIES)][0])
        for i in range(n)
    ]


def run_sgl(header: str, questions: list[str], max_new: int, **engine_kwargs) -> dict:
    backend = sgl.Runtime(**engine_kwargs)
    program = make_program(header)
    try:
        # warm the model's code paths on an unrelated prompt, outside the timing
        backend.generate("Hello", {"max_tokens": 2, "temperature": 0})
        backend.engine.flush_cache()
        start = time.perf_counter()
        states = program.run_batch(
            [{"question": q} for q in questions],
            backend=backend,
            temperature=0,
            max_new_tokens=max_new,
        )
        wall = time.perf_counter() - start
        for state in states:
            if state.error is not None:
                raise state.error
        metas = [state.get_meta_info("answer") for state in states]
        prefill = sum(m["prompt_tokens"] - m["cached_tokens"] for m in metas)
        if engine_kwargs.get("enable_radix_cache", True):
            prefill += len(backend.tokenizer(program.prefix(backend)).input_ids)
        return {
            "wall": wall,
            "prefill": prefill,
            "outputs": [state["answer"] for state in states],
        }
    finally:
        backend.shutdown()


def run_transformers(header: str, questions: list[str], max_new: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from runtime.default_model import ensure_default_model

    folder = ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    outputs, prefill = [], 0
    start = time.perf_counter()
    with torch.inference_mode():
        for q in questions:
            prompt = header + "Question: " + q + "\nAnswer:"
            ids = torch.tensor([tokenizer(prompt).input_ids])
            prefill += ids.shape[1]
            out = model(input_ids=ids, use_cache=True)
            past, generated = out.past_key_values, []
            for _ in range(max_new):
                # greedy: the most likely next token, fed back with the cache
                token = int(out.logits[0, -1].argmax())
                if token == eos:
                    break
                generated.append(token)
                if "\n" in tokenizer.decode(generated):
                    break
                out = model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
            outputs.append(tokenizer.decode(generated).split("\n")[0])
    return {"wall": time.perf_counter() - start, "prefill": prefill, "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--shots", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()

    header = few_shot_header(args.shots)
    questions = make_inputs(args.n)
    print(
        f"few-shot program, {args.n} inputs, {args.shots} shots, greedy, "
        f"max {args.max_new_tokens} new tokens"
    )
    print(
        f"| {'setup':30s} | {'wall s':>8s} | {'prefill tokens':>14s} | "
        f"{'vs cache':>8s} | {'same outputs':>12s} |"
    )
    print(f"|{'-' * 32}|{'-' * 10}|{'-' * 16}|{'-' * 10}|{'-' * 14}|", flush=True)
    runs = [
        ("sgl + hoisting + radix cache", lambda: run_sgl(header, questions, args.max_new_tokens)),
        (
            "sgl, cache off",
            lambda: run_sgl(header, questions, args.max_new_tokens, enable_radix_cache=False),
        ),
    ]
    if not args.skip_transformers:
        runs.append(
            ("transformers loop", lambda: run_transformers(header, questions, args.max_new_tokens))
        )
    base = None
    for name, run in runs:
        row = run()  # each row prints as soon as it is measured
        base = base or row
        same = sum(
            a.strip() == b.strip() for a, b in zip(row["outputs"], base["outputs"], strict=True)
        )
        print(
            f"| {name:30s} | {row['wall']:8.2f} | {row['prefill']:14d} | "
            f"{row['wall'] / base['wall']:7.2f}x | {same:>5d}/{len(questions):<6d} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
