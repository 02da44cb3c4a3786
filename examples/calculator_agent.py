"""A calculator agent: the model writes an arithmetic expression constrained by a lark grammar
(examples/grammars/arithmetic.lark), lark parses it, we evaluate the tree, the model answers.

Run: .venv/bin/python -m examples.calculator_agent

The constrained step is `Engine.generate(..., grammar=LARK_TEXT)`: every token the model
samples keeps the text a prefix of a sentence of the grammar.
"""

from __future__ import annotations

import operator
from pathlib import Path

from lark import Lark, Transformer

GRAMMAR = (Path(__file__).parent / "grammars" / "arithmetic.lark").read_text(encoding="utf-8")
# what the model writes: one expression ended by a newline (so it can stop without EOS)
LINE_GRAMMAR = GRAMMAR.replace("?start: sum", '?start: sum "\\n"')
QUESTION = "A shop sells pens at 3 dollars each. Tom buys 7 pens and pays with a 50 dollar note."


class Evaluate(Transformer):
    """The parse tree of arithmetic.lark to a number."""

    def number(self, items):
        return float(items[0])

    def neg(self, items):
        return -items[0]

    def add(self, items):
        return operator.add(*items)

    def sub(self, items):
        return operator.sub(*items)

    def mul(self, items):
        return operator.mul(*items)

    def div(self, items):
        return operator.truediv(*items)


def evaluate(expression: str) -> float:
    tree = Lark(GRAMMAR, parser="lalr").parse(expression)
    return tree if isinstance(tree, float) else Evaluate().transform(tree)


def chat(tokenizer, user: str, prefix: str = "") -> str:
    messages = [{"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text + prefix


def main() -> None:
    from runtime import Engine

    engine = Engine()
    ask = f"{QUESTION}\nWrite one arithmetic expression for the change Tom gets. Expression:"
    prompt = chat(engine.tokenizer, ask)
    result = engine.generate(prompt, grammar=LINE_GRAMMAR, max_new_tokens=32, temperature=0)
    expression = result.text.strip()
    try:
        value = evaluate(expression)
    except Exception as e:  # the token budget ran out before the expression was complete
        print(f"expression {expression!r} is incomplete ({type(e).__name__}); stopping")
        engine.shutdown()
        return
    print("expression:", expression)
    print("value:     ", value)
    answer = engine.generate(
        chat(engine.tokenizer, f"{QUESTION}\nThe calculator says {value:g}. How much change?"),
        max_new_tokens=40,
        temperature=0,
        stop="\n",
    )
    print("answer:    ", answer.text)
    engine.shutdown()


if __name__ == "__main__":
    main()
