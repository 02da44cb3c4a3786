"""Stream an answer as it is decoded.

Run: .venv/bin/python -m examples.streaming
"""

from __future__ import annotations

import sys

import sgl_dsl as sgl


@sgl.function
def explain(s, topic):
    s += sgl.system("You explain things simply.")
    s += sgl.user("Explain " + topic + " in three sentences.")
    s += sgl.assistant(sgl.gen("answer", max_tokens=96))


def main() -> None:
    sgl.set_default_backend(sgl.Runtime())
    state = explain.run(topic="why the sky is blue", stream=True, temperature=0)
    for piece in state.text_iter("answer"):
        sys.stdout.write(piece)
        sys.stdout.flush()
    print()
    print(state.get_meta_info("answer"))


if __name__ == "__main__":
    main()
