"""A calculator agent: the model writes an arithmetic expression constrained by a lark grammar
(examples/grammars/arithmetic.lark), lark parses it, we evaluate the tree, the model answers.

Run: .venv/bin/python -m examples.calculator_agent

The constrained step uses `Engine.generate(..., grammar=LARK_TEXT)`. Until the engine takes
`grammar=` (see the CFG notes for the runtime), the example falls back to a small greedy loop
over the same model with `transformers`, masking logits with the compiled grammar's matcher:
the constraint object is the same either way.
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


def constrained_greedy(model_dir: str, prompt: str, max_new_tokens: int = 24) -> str:
    """Greedy decoding with the grammar's token masks, on `transformers` (fallback path)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grammar import TokenVocabulary
    from grammar.cfg import compile_lark

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    matcher = compile_lark(LINE_GRAMMAR, TokenVocabulary.from_tokenizer(tok)).matcher()
    ids = tok(prompt, return_tensors="pt").input_ids
    out: list[int] = []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
        allowed = torch.from_numpy(np.pad(matcher.mask(), (0, logits.shape[0] - len(tok))))
        t = int(torch.where(allowed, logits, -torch.inf).argmax())
        matcher.advance(t)
        if t in matcher.grammar.eos_token_ids:
            break
        out.append(t)
        if matcher.is_dead():
            break
        ids = torch.cat([ids, torch.tensor([[t]])], dim=1)
    return tok.decode(out)


def main() -> None:
    from runtime import Engine
    from runtime.default_model import default_model_dir

    engine = Engine()
    ask = f"{QUESTION}\nWrite one arithmetic expression for the change Tom gets. Expression:"
    prompt = chat(engine.tokenizer, ask)
    try:
        result = engine.generate(prompt, grammar=LINE_GRAMMAR, max_new_tokens=32, temperature=0)
        expression = result.text
    except (TypeError, ValueError, NotImplementedError) as e:  # engine without grammar=
        print(f"(engine has no grammar= yet: {e}; using the transformers fallback)")
        expression = constrained_greedy(str(default_model_dir()), prompt, max_new_tokens=32)
    expression = expression.strip()
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
