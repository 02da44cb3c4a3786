"""JSON extraction with jump-forward vs masks only vs unconstrained, on SmolLM2.

Run: .venv/bin/python -m benchmarks.engine.constrained [--quick] [--n 32] [--threads N]

Three tasks (a character profile with nested fields and enums, a city record from a paragraph,
a tool call with 4 arguments), N requests each, greedy, compact JSON, all requests of a task in
one batched `generate` call. Modes: (a) json_schema with jump-forward, (b) json_schema with
masks only (jump_forward=False), (c) no constraint, same max tokens (the prompt still asks for
JSON). "steps" is the sum of usage.decode_steps (forward passes after the prompt prefill; a
jump's extend counts one); "valid" parses with json and validates with jsonschema. Grammar
compile time is reported per schema (first compile; later requests hit the cache).
"""

from __future__ import annotations

import argparse
import json
import time

import jsonschema
import torch

from runtime import Engine

CHARACTER = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "class": {"enum": ["warrior", "mage", "rogue", "cleric", "ranger"]},
        "level": {"type": "integer", "minimum": 1, "maximum": 20},
        "alignment": {"enum": ["lawful good", "neutral good", "true neutral", "chaotic evil"]},
        "stats": {
            "type": "object",
            "properties": {
                k: {"type": "integer", "minimum": 1, "maximum": 20}
                for k in ("strength", "dexterity", "intelligence", "wisdom")
            },
            "required": ["strength", "dexterity", "intelligence", "wisdom"],
            "additionalProperties": False,
        },
        "home": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "region": {"enum": ["north", "south", "east", "west"]}},
            "required": ["city", "region"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "class", "level", "alignment", "stats", "home"],
    "additionalProperties": False,
}  # fmt: skip

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24},
        "population": {"type": "integer", "minimum": 0},
        "founded": {"type": "integer", "minimum": 0, "maximum": 2100},
        "is_capital": {"type": "boolean"},
        "continent": {"enum": ["Africa", "Asia", "Europe", "North America", "South America",
                               "Oceania"]},
    },
    "required": ["city", "country", "population", "founded", "is_capital", "continent"],
    "additionalProperties": False,
}  # fmt: skip

TOOL = {
    "type": "object",
    "properties": {
        "tool": {"const": "book_flight"},
        "arguments": {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "date": {"type": "string", "format": "date"},
                "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["origin", "destination", "date", "passengers"],
            "additionalProperties": False,
        },
    },
    "required": ["tool", "arguments"],
    "additionalProperties": False,
}

CITIES = [
    ("Lyon", "France", 522000, 43), ("Osaka", "Japan", 2750000, 645), ("Porto", "Portugal",
    232000, 868), ("Krakow", "Poland", 800000, 1038), ("Cusco", "Peru", 430000, 1100),
    ("Quebec", "Canada", 550000, 1608), ("Mombasa", "Kenya", 1200000, 900), ("Graz", "Austria",
    290000, 1128),
]  # fmt: skip
CLASSES = ["brave", "wise", "sneaky", "holy", "wild", "old", "young", "cursed"]
AIRPORTS = ["JFK", "LAX", "CDG", "LHR", "NRT", "SFO", "BOS", "MAD"]


def prompts(tok, task: str, n: int) -> list[str]:
    out = []
    for i in range(n):
        if task == "character":
            ask = (f"Create a {CLASSES[i % 8]} fantasy character #{i} as JSON with keys name, "
                   "class, level, alignment, stats (strength, dexterity, intelligence, wisdom) "
                   "and home (city, region).")  # fmt: skip
        elif task == "city":
            c, country, pop, year = CITIES[i % len(CITIES)]
            ask = (f"{c} is a city in {country}. About {pop + i} people live there. It was "
                   f"founded in {year}. Extract a JSON record with keys city, country, "
                   "population, founded, is_capital, continent.")  # fmt: skip
        else:
            a, b = AIRPORTS[i % 8], AIRPORTS[(i + 3) % 8]
            ask = (f"Book a flight from {a} to {b} on 2025-0{1 + i % 9}-1{i % 10} for "
                   f"{1 + i % 4} people. Reply with a JSON tool call: "
                   '{"tool": "book_flight", "arguments": {...}}.')  # fmt: skip
        out.append(tok.apply_chat_template([{"role": "user", "content": ask}], tokenize=False,
                                           add_generation_prompt=True))  # fmt: skip
    return out


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 requests per task")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n = 8 if args.quick else args.n
    engine = Engine()
    tok = engine.tokenizer
    tasks = {"character": CHARACTER, "city": CITY, "tool call": TOOL}
    rows, compile_times = [], {}
    for task, schema in tasks.items():
        ps = prompts(tok, task.split()[0], n)
        warm = engine.generate(ps[0], json_schema=schema, max_new_tokens=1)  # compile + cache
        compile_times[task] = warm.usage.compile_time_s
        engine.generate(ps, max_new_tokens=0)  # prompts cached: every mode starts from the same
        modes = (("(a) jump-forward", dict(json_schema=schema, jump_forward=True)),
                 ("(b) masks only", dict(json_schema=schema, jump_forward=False)),
                 ("(c) unconstrained", {}))  # fmt: skip
        for mode, kw in modes:
            t = time.perf_counter()
            results = engine.generate(ps, max_new_tokens=args.max_new_tokens, temperature=0.0,
                                      **kw)  # fmt: skip
            wall = time.perf_counter() - t
            text = [r.text for r in results]
            rows.append((task, mode, wall, sum(r.usage.decode_steps for r in results),
                         sum(r.usage.completion_tokens for r in results),
                         sum(valid(x, schema) for x in text) / len(text)))  # fmt: skip
    head = ("task", "mode", "wall s", "decode steps", "out tokens", "valid", "vs (b) time",
            "steps / (b)")  # fmt: skip
    lines = []
    for task, mode, wall, steps, toks, ok in rows:
        b = next(r for r in rows if r[0] == task and r[1].startswith("(b)"))
        lines.append((task, mode, f"{wall:.1f}", str(steps), str(toks), f"{100 * ok:.0f}%",
                      f"{b[2] / wall:.2f}x", f"{steps / b[3]:.2f}"))  # fmt: skip
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |")
    print("\ngrammar compile (first time): " + ", ".join(
        f"{k} {v * 1000:.0f} ms" for k, v in compile_times.items()) + f"; {n} requests per task, "
        f"threads={torch.get_num_threads()}")  # fmt: skip
    engine.shutdown()


if __name__ == "__main__":
    main()
