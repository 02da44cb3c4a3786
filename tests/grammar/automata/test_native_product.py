"""The product constructions in C (`native_dfa.product_rows`, csrc/product.c) against the Python
walk they replace: the same automata (state for state, class for class) for intersections,
differences and the key regions of patternProperties, and the same budget error."""

from __future__ import annotations

import numpy as np
import pytest

from grammar import GrammarError
from grammar.automata import dfa_ops, native_dfa
from grammar.automata.fsm import ByteDFA, regex_to_dfa

PATTERNS = [
    r"[a-z]{1,8}",
    r"(ab|cd)*e?",
    r'[^"\\]{0,5}',
    r"a[0-9]+b",
    r"é+|x{2,3}",
    r"[a-c]*",
    r"(foo|bar)[0-9]{0,2}",
]


def _c_available() -> bool:
    return native_dfa.product_rows(
        [np.zeros((2, 1), np.int32)], np.zeros((1, 1), np.int32), [True], [1], 4
    ) is not None  # fmt: skip


def _same(x: ByteDFA, y: ByteDFA) -> bool:
    return (
        np.array_equal(x.table, y.table)
        and np.array_equal(x.byte_to_class, y.byte_to_class)
        and np.array_equal(np.asarray(x.accepting), np.asarray(y.accepting))
    )


def _both(monkeypatch: pytest.MonkeyPatch, build):  # noqa: ANN001, ANN202
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "1")
    c = build()
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "0")
    return c, build()


@pytest.fixture(scope="module")
def dfas() -> list[ByteDFA]:
    return [regex_to_dfa(p) for p in PATTERNS]


@pytest.mark.parametrize("keep", [True, False], ids=["and", "minus"])
def test_products_equal_the_python_walk(keep: bool, dfas, monkeypatch) -> None:  # noqa: ANN001
    if not _c_available():
        pytest.skip("the C walk is off (SGL_GRAMMAR_NATIVE=0) or has no compiler")
    for a in dfas:
        for b in dfas:
            c, py = _both(monkeypatch, lambda a=a, b=b: dfa_ops.product(a, b, keep))
            assert _same(c, py)


def test_key_regions_equal_the_python_walk(dfas, monkeypatch) -> None:  # noqa: ANN001
    if not _c_available():
        pytest.skip("the C walk is off (SGL_GRAMMAR_NATIVE=0) or has no compiler")
    for k, keys in enumerate(dfas):
        parts = dfas[:k] + dfas[k + 1 : k + 4]
        c, py = _both(
            monkeypatch, lambda keys=keys, parts=parts: dfa_ops.split_regions(keys, parts)
        )
        assert [sig for _, sig in c] == [sig for _, sig in py]
        assert all(_same(x, y) for (x, _), (y, _) in zip(c, py, strict=True))


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_product_past_its_budget_raises_naming_it(native: str, dfas, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", native)
    with pytest.raises(GrammarError, match=r"product automaton exceeds its budget \(3\)"):
        dfa_ops.product(dfas[0], dfas[1], False, max_states=3)
    assert dfa_ops.product(dfas[0], dfas[1], True).accepting.any()


def test_class_groups_equal_the_per_byte_grouping():
    """`_class_groups` (bytes keyed by their stacked class columns) gives the groups, in the
    order, of the per-byte key tuples it replaced, for one, two and many automata."""
    dfas = [regex_to_dfa(p) for p in PATTERNS]
    for parts in (dfas[:1], dfas[1:3], dfas * 4):
        want = dfa_ops._byte_groups(*(d.byte_to_class.item for d in parts))
        assert dfa_ops._class_groups(*parts) == want
