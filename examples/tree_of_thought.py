"""A small tree of thought: fork several lines of reasoning, then judge them together.

Run: .venv/bin/python -m examples.tree_of_thought
"""

from __future__ import annotations

import sgl_dsl as sgl


@sgl.function
def tree_of_thought(s, question, branches=3):
    s += sgl.system("You think step by step.")
    s += sgl.user(question)
    forks = s.fork(branches)  # the shared prefix is cached once; the forks decode together
    for i, f in enumerate(forks):
        f += sgl.assistant("Idea " + str(i + 1) + ": " + sgl.gen("idea", max_tokens=40, stop="\n"))
    forks.join()  # s["idea"] is now the list of every fork's idea, in fork order
    s += sgl.user(
        "Ideas:\n"
        + "\n".join(f"{i + 1}. {t}" for i, t in enumerate(s["idea"]))
        + "\nWhich idea is best? Answer with its number."
    )
    s += sgl.assistant(sgl.select("best", [str(i + 1) for i in range(branches)]))


def main() -> None:
    sgl.set_default_backend(sgl.Runtime())
    state = tree_of_thought.run(
        question="How can a city reduce traffic jams?", temperature=0.8, max_new_tokens=40
    )
    for i, idea in enumerate(state["idea"]):
        print(f"idea {i + 1}: {idea}")
    print("best:", state["best"])


if __name__ == "__main__":
    main()
