"""One agent step: choose a tool with `select`, fill its argument with a constrained gen, run it.

Run: .venv/bin/python -m examples.tool_agent
"""

from __future__ import annotations

import ast
import operator

import sgl_dsl as sgl

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def calculator(expression: str) -> str:
    """Evaluate + - * / over numbers, safely (no eval)."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"not arithmetic: {expression!r}")

    return str(ev(ast.parse(expression.strip(), mode="eval").body))


def search(query: str) -> str:
    return f"(no web access in this example; you searched for {query!r})"


TOOLS = {"calculator": calculator, "search": search}
ARITHMETIC = r"[0-9]+( ?[-+*/] ?[0-9]+){1,3}"


@sgl.function
def agent_step(s, request):
    s += sgl.system("You pick a tool for the request: calculator or search.")
    s += sgl.user(request)
    with s.assistant():
        s += "Tool: " + sgl.select("tool", list(TOOLS)) + "\nInput: "
        if s["tool"] == "calculator":
            s += sgl.gen("input", regex=ARITHMETIC, max_tokens=16)
        else:
            s += sgl.gen("input", max_tokens=16, stop="\n")
    s += sgl.user("Tool result: " + TOOLS[s["tool"]](s["input"]))
    s += sgl.assistant(sgl.gen("answer", max_tokens=40, stop="\n"))


def main() -> None:
    sgl.set_default_backend(sgl.Runtime())
    state = agent_step.run(request="What is 17 times 23?", temperature=0)
    print("tool: ", state["tool"])
    print("input:", state["input"])
    print(state.messages()[-2]["content"])
    print("answer:", state["answer"])


if __name__ == "__main__":
    main()
