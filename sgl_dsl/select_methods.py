"""How `select` turns per-token log-probabilities of each choice into one pick.

A method sees `ChoiceScores` (one list of token log-probs per choice, from one batched
`score` call) and returns the index of the chosen choice. Write your own by subclassing
`SelectMethod` (or passing any callable taking `ChoiceScores`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ProgramError


@dataclass(slots=True)
class ChoiceScores:
    choices: list[str]
    token_logprobs: list[list[float]]
    # Log-probs of each choice with no context; set only when the method asks for them.
    unconditional_token_logprobs: list[list[float]] | None = None


class SelectMethod:
    name = "custom"
    # True when the interpreter must also score the choices without the program's context.
    needs_unconditional = False

    def __call__(self, scores: ChoiceScores) -> int:
        raise NotImplementedError


class TokenLengthNormalized(SelectMethod):
    """The highest mean token log-likelihood: long choices are not punished for length."""

    name = "token_length_normalized"

    def __call__(self, scores: ChoiceScores) -> int:
        means = [sum(lp) / max(len(lp), 1) for lp in scores.token_logprobs]
        return _argmax(means)


class Greedy(SelectMethod):
    """What greedy decoding restricted to the choices would pick, token by token."""

    name = "greedy"

    def __call__(self, scores: ChoiceScores) -> int:
        lps = scores.token_logprobs
        candidates = list(range(len(lps)))
        for t in range(max(len(lp) for lp in lps)):
            # only choices that still have a token at step t compete at step t
            active = [i for i in candidates if len(lps[i]) > t]
            if not active:
                break
            best = max(lps[i][t] for i in active)
            candidates = [i for i in active if lps[i][t] >= best - 1e-9]
            if len(candidates) == 1:
                break
        return candidates[0]


class UnconditionalLikelihoodNormalized(SelectMethod):
    """log P(choice | context) - log P(choice): prefers choices the context makes likelier."""

    name = "unconditional_likelihood_normalized"
    needs_unconditional = True

    def __call__(self, scores: ChoiceScores) -> int:
        assert scores.unconditional_token_logprobs is not None
        gains = [
            sum(cond) - sum(uncond)
            for cond, uncond in zip(
                scores.token_logprobs, scores.unconditional_token_logprobs, strict=True
            )
        ]
        return _argmax(gains)


class _CallableMethod(SelectMethod):
    def __init__(self, fn: Callable[[ChoiceScores], int]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", "custom")

    def __call__(self, scores: ChoiceScores) -> int:
        return self.fn(scores)


BUILTIN_METHODS: dict[str, SelectMethod] = {
    m.name: m for m in (TokenLengthNormalized(), Greedy(), UnconditionalLikelihoodNormalized())
}
# SGLang's names: `sgl.token_length_normalized`, `sgl.greedy_token_selection`, ...
token_length_normalized = BUILTIN_METHODS["token_length_normalized"]
greedy_token_selection = BUILTIN_METHODS["greedy"]
unconditional_likelihood_normalized = BUILTIN_METHODS["unconditional_likelihood_normalized"]
_ALIASES = {
    "greedy_token_selection": "greedy",
    # SGLang's own method objects, by class name (sglang.lang.choices)
    "TokenLengthNormalized": "token_length_normalized",
    "GreedyTokenSelection": "greedy",
    "UnconditionalLikelihoodNormalized": "unconditional_likelihood_normalized",
}


def resolve_method(method: Any) -> SelectMethod:
    """A method name, a `SelectMethod`, or a callable -> a `SelectMethod` (None: default)."""
    if method is None:
        return BUILTIN_METHODS["token_length_normalized"]
    if isinstance(method, SelectMethod):
        return method
    if type(method).__name__ in _ALIASES and type(method).__module__.startswith("sglang"):
        return BUILTIN_METHODS[_ALIASES[type(method).__name__]]
    if isinstance(method, str):
        method = _ALIASES.get(method, method)
        if method not in BUILTIN_METHODS:
            raise ProgramError(
                f"unknown select method {method!r}; use one of {sorted(BUILTIN_METHODS)}"
                " or a SelectMethod"
            )
        return BUILTIN_METHODS[method]
    if callable(method):
        return _CallableMethod(method)
    raise ProgramError(f"select method must be a name, SelectMethod or callable, not {method!r}")


def _argmax(values: list[float]) -> int:
    best = max(range(len(values)), key=lambda i: (values[i], -i))
    if math.isnan(values[best]):
        raise ProgramError("select: every choice scored NaN")
    return best
