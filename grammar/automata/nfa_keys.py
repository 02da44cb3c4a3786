"""The NFA builder's key pass: a regex tree's nodes as interned structures, and `Deferred`, a
tree node built only when the NFA first reads it.

`Structures.key_tree` visits a tree once (linear in its distinct nodes, a shared DAG included)
and gives every node a small int, equal for equal structures; `struct[k]` holds the structure
as a tuple of ints (and a class's characters), so the NFA builds from it with no parse node
alive. The same pass refuses what cannot be built (flags, lookaround, `{3,2}`) and notes
pieces that match nothing (`dead_end_possible`).

A `Deferred` stands for a subtree that is costly to build and seldom read (an object's name
complement: the keys that are none of its property names, ~70% of a Kubernetes schema's
tree). The pass keys it by what it stands for; `expand` builds and keys its subtree when the
NFA first needs its states, into the same tables, so equal pieces still share keys.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from grammar.automata import interegular_adapter as ip
from grammar.automata.utf8 import char_form
from grammar.errors import GrammarError

_DOT_CLS = type(ip.DOT)
_EMPTY_CLS = type(ip.EMPTY)
_CHAR_GROUP = ip.CharGroup
_CONCAT, _ALT, _REPEAT = ip.Concatenation, ip.Pattern, ip.Repeated


class Deferred:
    """A regex node that stands for `build()` (a node), built when first read.

    What must hold (the lazy NFA relies on it, and refuses an expansion that breaks it):
    - `build()` returns a node (never None) with no piece that matches nothing (no empty
      class, no automaton of the empty language) and nothing the key pass refuses;
    - two Deferred with equal `what` and structurally equal `parts` build the same language
      (the NFA gives them the same states);
    - `weight` estimates the structures `build()` makes (the NFA's small-tree test counts it).
    """

    __slots__ = ("what", "parts", "build", "weight")

    def __init__(
        self, what: Hashable, parts: tuple, build: Callable[[], object], weight: int
    ) -> None:
        self.what = what
        self.parts = parts  # nodes that are part of its identity (keyed structurally)
        self.build = build
        self.weight = weight


class Structures:
    """Interned structures: key -> `struct[key]`, one of ("&", part keys...), ("|", option
    keys...), ("r", base key, min, max), ("c", chars, negated), (".",), ("e",),
    ("d", id(dfa)), ("l", what, part keys...) (a Deferred; `expand` gives what it builds)."""

    def __init__(self) -> None:
        self.interned: dict[tuple, int] = {}
        self.struct: list[tuple] = [()]
        self.dfas: dict[int, object] = {}  # an embedded automaton's key -> the ByteDFA
        self.one_byte: dict[int, int] = {}  # a character class's key -> its byte mask, when
        # every character in it is one byte (0 when not)
        self.deferred: dict[int, Deferred] = {}  # a Deferred's key, until expanded
        self.expanded: dict[int, int] = {}  # a Deferred's key -> its subtree's key
        self.weight = 0  # structures the Deferred keyed so far stand for (their `weight`)
        self.dead_end_possible = False
        self._ids: dict[int, int] = {}  # id(node) -> key, while a tree is keyed
        self._held: list[object] = []  # expanded trees, alive while their ids are remembered

    def key_tree(self, tree: object) -> int:
        """The key of `tree`, every node in it keyed. Node ids are remembered until `forget`:
        the caller holds the tree alive until then."""
        return self._key(tree)

    def expand(self, k: int) -> int:
        """The key of the subtree the Deferred keyed `k` stands for (built on first call; held
        until `forget`, so that later expansions see its shared pieces keyed)."""
        out = self.expanded.get(k)
        if out is None:
            tree = self.deferred[k].build()
            self._held.append(tree)
            out = self.expanded[k] = self._key(tree)
            del self.deferred[k]  # built: its subtree's structures are all that is needed
        return out

    def forget(self) -> None:
        """Drop the node ids (and the expanded trees held for them): the trees may go."""
        self._ids = {}
        self._held = []

    def _key(self, node: object) -> int:
        ids = self._ids
        k = ids.get(id(node))
        if k is not None:
            return k
        tp = type(node)
        if tp is _CONCAT:  # the commonest inner node first
            get = ids.get
            t: tuple = ("&", *[get(id(p)) or self._key(p) for p in node.parts])
        elif tp is _CHAR_GROUP:
            t = ("c", node.chars, node.negated)
            k = self.interned.get(t)
            if k is None:
                k = self.interned[t] = len(self.interned) + 1
                self.struct.append(t)
                self.one_byte[k] = self._class_mask(node.chars, node.negated)
            ids[id(node)] = k
            return k
        elif tp is _ALT:
            if node.added_flags or node.removed_flags:
                raise GrammarError(f"regex flags are not supported: {node.added_flags}")
            get = ids.get
            t = ("|", *[get(id(o)) or self._key(o) for o in node.options])
        elif tp is _REPEAT:
            if node.max is not None and node.max < node.min:
                raise GrammarError(f"bad repetition {{{node.min},{node.max}}}")
            t = ("r", self._key(node.base), node.min, node.max)
        elif tp is Deferred:
            t = ("l", node.what, *[self._key(p) for p in node.parts])
            if t not in self.interned:
                self.deferred[len(self.interned) + 1] = node
                self.weight += node.weight
        elif isinstance(node, _DOT_CLS):
            t = (".",)
        elif isinstance(node, _EMPTY_CLS):
            t = ("e",)
        elif hasattr(node, "dfa") and type(node).__name__ == "DFANode":
            t = ("d", id(node.dfa))
            if _matches_nothing(node.dfa):
                self.dead_end_possible = True  # an automaton of the empty language
            if t not in self.interned:
                self.dfas[len(self.interned) + 1] = node.dfa
        elif isinstance(node, ip.NonCapturing):
            kind = "lookbehind" if node.backwards else "lookahead"
            raise GrammarError(
                f"regex construct not supported: {kind} (?{'<' * node.backwards}...)"
            )
        elif isinstance(node, _CHAR_GROUP | _CONCAT | _ALT | _REPEAT):
            raise GrammarError(f"regex node subclass not supported: {type(node).__name__}")
        else:
            raise GrammarError(f"regex construct not supported: {type(node).__name__}")
        interned = self.interned
        k = interned.get(t)
        if k is None:
            k = interned[t] = len(interned) + 1
            self.struct.append(t)
        ids[id(node)] = k
        return k

    def _class_mask(self, chars: frozenset[str], negated: bool) -> int:
        """The byte mask of an all-ASCII class, else 0; notes a class that matches nothing.
        Without the class's UTF-8 paths where it can tell: a schema's name complements hold
        hundreds of `[^...]` classes, and the NFA builds paths for those a walk reaches."""
        if not negated and chars and max(chars) < "\x80":
            mask = 0
            for c in chars:
                mask |= 1 << ord(c)
            return mask
        if negated and len(chars) < 0x80:  # holds non-ASCII characters: never empty
            return 0
        form = char_form(chars, negated)
        if not form:
            self.dead_end_possible = True  # a character class that matches nothing
        return form[0][0] if len(form) == 1 and not form[0][1] else 0


def _matches_nothing(dfa: object) -> bool:
    """An embedded ByteDFA of the empty language (its start neither accepts nor moves)."""
    return not dfa.table[1].any() and not dfa.accepting[1]
