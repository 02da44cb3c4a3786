"""Programs over a batch: prefix hoisting + radix cache vs cache off vs transformers; and async.

Run: .venv/bin/python -m benchmarks.engine.dsl [--suite all|few-shot|async|healing] [--n 64]
     [--shots 24] [--max-new-tokens 12] [--programs 256]

The same few-shot program (a long shared header of examples, then the input's question, then
one greedy gen that stops at a newline) runs three ways:

  sgl + cache     run_batch on Engine(): the constant prefix is prefilled once, every request
                  finds it in the radix cache and computes only its own tail
  sgl, cache off  run_batch on Engine(enable_radix_cache=False): every request prefills all
  transformers    a hand-written loop over the inputs with the model's own KV cache (greedy,
                  one request at a time, stopping at the newline), as people write it by hand

"prefill tokens" counts prompt tokens whose K/V were computed (prompt minus cached tokens).

The async suite runs `--programs` typed extractions (`gen("person", type=Person)`: a pydantic
model with a bounded int and an Enum) greedy, four ways: the threaded `run_batch` (64 threads)
and `run_batch_async` (one event loop), each on the in-process engine and on a
`python -m runtime.server` through `sgl.RuntimeEndpoint`. Rows: programs per second, the peak
number of threads of this process while the batch ran (a sampler polls every 5 ms; the sampler
itself is not counted; the engine's own threads are, in-process), how many values are `Person`
instances with no error, and how many equal the threaded run's. The prefix cache is flushed
before every timed run; a few programs warm each backend first.

The healing suite (benchmarks/engine/healing.py) cuts prompts mid-token and counts the greedy
outputs equal to the unsplit prompt's, with token healing and without.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
from pydantic import BaseModel, Field

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


# ---- async: typed extractions through run_batch_async vs the threaded run_batch --------------


class Job(enum.Enum):
    BAKER = "baker"
    PILOT = "pilot"
    TEACHER = "teacher"
    NURSE = "nurse"
    OTHER = "other"


class Person(BaseModel):
    name: str
    age: Annotated[int, Field(ge=0, le=120)]
    city: str
    job: Job


NAMES = ["Maria Lopez", "John Carter", "Aiko Tanaka", "Samuel Okoye", "Lena Berg", "Pedro Alves"]
WORK = ["opened a bakery", "flies planes as a pilot", "teaches at a school", "is a nurse"]


def typed_documents(n: int) -> list[str]:
    return [
        f"{NAMES[i % len(NAMES)]}, aged {20 + i % 60}, lives in "
        f"{COUNTRIES[i % len(COUNTRIES)][1]} and {WORK[i % len(WORK)]}."
        for i in range(n)
    ]


@sgl.function
def extract_person(s, document):
    s += sgl.system("Extract the person described in the text as JSON.")
    s += sgl.user(document)
    s += sgl.assistant(sgl.gen("person", type=Person, max_tokens=80))


class ThreadPeak:
    """The most threads this process had while the block ran (the sampler not counted)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, threading.active_count() - 1)
            self._stop.wait(0.005)

    def __enter__(self) -> ThreadPeak:
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join()


def run_typed(backend: Any, docs: list[str], mode: str) -> dict:
    batch = [{"document": d} for d in docs]
    backend.flush_cache()
    start = time.perf_counter()
    with ThreadPeak() as threads:
        if mode == "async":
            states = asyncio.run(
                extract_person.run_batch_async(batch, backend=backend, temperature=0)
            )
        else:
            states = extract_person.run_batch(batch, backend=backend, temperature=0, num_threads=64)
    wall = time.perf_counter() - start
    values = [s["person"] if s.error is None else None for s in states]
    return {
        "wall": wall,
        "threads": threads.peak,
        "valid": sum(isinstance(v, Person) for v in values),
        "values": values,
    }


def start_server(num_threads: int | None) -> tuple[subprocess.Popen, str]:
    """`python -m runtime.server` on the default model, on a free port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "runtime.server", "--port", str(port), "--log-level", "warning"]
    if num_threads:
        cmd += ["--num-threads", str(num_threads)]
    log = tempfile.NamedTemporaryFile(prefix="bench-dsl-", suffix=".log", delete=False)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited: {Path(log.name).read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("server did not start")


def async_suite(programs: int, num_threads: int | None) -> None:
    docs = typed_documents(programs)
    print(f"\ntyped extraction (gen(type=Person)), {programs} programs, greedy, max 80 tokens")
    print(
        f"| {'backend':11s} | {'mode':24s} | {'wall s':>7s} | {'programs/s':>10s} | "
        f"{'peak threads':>12s} | {'typed+valid':>11s} | {'= threaded':>10s} |"
    )
    print(f"|{'-' * 13}|{'-' * 26}|{'-' * 9}|{'-' * 12}|{'-' * 14}|{'-' * 13}|{'-' * 12}|")
    engine_kwargs = {"num_threads": num_threads} if num_threads else {}
    runtime = sgl.Runtime(**engine_kwargs)
    server, url = start_server(num_threads)
    try:
        backends = [("in-process", runtime), ("server", sgl.RuntimeEndpoint(url))]
        for label, backend in backends:
            # warm: the model's code paths and the schema's compile, outside the timing
            extract_person.run_batch([{"document": d} for d in docs[:4]], backend=backend)
            asyncio.run(extract_person.run_batch_async([{"document": docs[0]}], backend=backend))
            base = None
            for mode, name in (("threads", "run_batch (64 threads)"), ("async", "run_batch_async")):
                row = run_typed(backend, docs, mode)
                base = base or row
                same = sum(a == b for a, b in zip(row["values"], base["values"], strict=True))
                print(
                    f"| {label:11s} | {name:24s} | {row['wall']:7.2f} | "
                    f"{programs / row['wall']:10.2f} | {row['threads']:12d} | "
                    f"{row['valid']:>5d}/{programs:<5d} | {same:>4d}/{programs:<5d} |",
                    flush=True,
                )
    finally:
        runtime.shutdown()
        server.terminate()
        server.wait(timeout=60)


def few_shot_suite(args: argparse.Namespace) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["all", "few-shot", "async", "healing"], default="all")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--shots", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--programs", type=int, default=256, help="async suite: batch size")
    parser.add_argument("--num-threads", type=int, default=None, help="engine threads")
    args = parser.parse_args()
    if args.suite in ("all", "few-shot"):
        few_shot_suite(args)
    if args.suite in ("all", "async"):
        async_suite(args.programs, args.num_threads)
    if args.suite in ("all", "healing"):
        from benchmarks.engine.healing import healing_suite

        healing_suite(max_new=args.max_new_tokens)


if __name__ == "__main__":
    main()
