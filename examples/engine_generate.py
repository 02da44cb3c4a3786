"""Use the engine directly: generate, batch, stream, score, constrain, inspect the cache.

Run: .venv/bin/python -m examples.engine_generate
(The first run converts the default model, SmolLM2-135M-Instruct, into
~/.cache/sgl_dsl/models/ or $SGL_DSL_CACHE_DIR/models/; later runs load that copy.)
"""

from __future__ import annotations

import sys

from runtime import Engine


def main() -> None:
    engine = Engine()  # the default model, fp32 on CPU; Engine(model=PATH, ...) for another
    chat = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours of the rainbow."}],
        tokenize=False,
        add_generation_prompt=True,
    )

    # one prompt -> one result
    r = engine.generate(chat, max_new_tokens=32, temperature=0.0)
    print(f"{r.text!r}  ({r.finish_reason}, {r.usage})")

    # a list -> a list in the same order; the shared prefix is computed once
    questions = [f"Q: What is {a} + {b}?\nA:" for a, b in [(1, 2), (3, 4), (10, 5)]]
    for res in engine.generate(questions, max_new_tokens=6, temperature=0.0, stop=["\n"]):
        print(repr(res.text), "cached:", res.usage.cached_tokens)

    # streaming
    for chunk in engine.generate(chat, max_new_tokens=24, temperature=0.7, seed=1, stream=True):
        sys.stdout.write(chunk.text_delta)
    print()

    # log-likelihood of continuations, one batched call sharing the prompt's KV
    print(engine.score("The capital of France is", [" Paris", " Rome"]))

    # constrained decoding: JSON Schema with jump-forward, choices, dtype
    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
    }
    print(engine.generate(chat, json_schema=schema, max_new_tokens=40, temperature=0.0).text)
    print(engine.generate("Is water wet? Answer:", choices=[" yes", " no"]).text)
    print(engine.generate("How many legs has a cat? ", dtype=int, max_new_tokens=4).text)

    stats = engine.stats()
    print({k: stats[k] for k in ("kv_bytes_per_token", "kv_capacity_tokens", "cache_hit_tokens",
                                 "prefill_computed_tokens", "pool_usage")})  # fmt: skip
    engine.shutdown()


if __name__ == "__main__":
    main()
