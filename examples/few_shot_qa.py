"""Few-shot question answering over a batch: the shared examples are prefilled once.

Run: .venv/bin/python -m examples.few_shot_qa
"""

from __future__ import annotations

import sgl_dsl as sgl

EXAMPLES = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
]
QUESTIONS = [
    "What is the capital of Germany?",
    "What is the capital of Spain?",
    "What is the capital of England?",
    "What is the capital of Russia?",
]


@sgl.function
def few_shot_qa(s, question):
    s += "Answer each question with one word.\n\n"
    for q, a in EXAMPLES:
        s += "Q: " + q + "\nA: " + a + "\n\n"
    # "A:" without a trailing space: the model writes " Paris" as one token, as in the examples
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=8, stop="\n")


def main() -> None:
    sgl.set_default_backend(sgl.Runtime())
    states = few_shot_qa.run_batch(
        [{"question": q} for q in QUESTIONS], temperature=0, progress_bar=True
    )
    for q, state in zip(QUESTIONS, states, strict=True):
        meta = state.get_meta_info("answer")
        print(
            f"{q:40s} -> {state['answer'].strip():12s} "
            f"(prompt {meta['prompt_tokens']}, cached {meta['cached_tokens']})"
        )


if __name__ == "__main__":
    main()
