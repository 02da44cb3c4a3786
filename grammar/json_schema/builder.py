"""What the schema builder offers the helpers that build each kind of value.

`schema.SchemaBuilder` holds one compile's settings and memos and runs the recursion
(`value` -> `normalise` -> `from_norm` -> `single` -> `typed`). The helpers are plain functions
taking that builder as their first argument, `b`: `scalars` (strings, numbers, any value),
`arrays`, `objects`, `oneof` (exclusivity), `normalise` (`$ref`, `allOf`, `not`, `if`) and
`exact/`. They import this Protocol, not `schema`, so no helper module imports the module that
imports it: the recursion runs through `b`, and the module graph stays a tree.
"""

from __future__ import annotations

from typing import Any, Protocol

from grammar.automata.fsm import DEFAULT_MAX_STATES
from grammar.json_schema.refs.reach import RefReach

Node = object | None  # a regex node (grammar.automata.regex_ast); None matches nothing


class Builder(Protocol):
    # ----- settings of this compile -----
    root: dict | bool  # the whole schema (local `$ref`s resolve against it)
    ws: object  # whitespace between structural tokens, as a regex node
    ws_text: str  # the same, as regex text
    comma: object  # `,` with whitespace around it
    colon: object  # `:` with whitespace around it
    separators: tuple  # x-guidance's (item, key) separator regexes; () for "," and ":"
    string_char: object  # one character of a JSON string (a regex node)
    any_string: object  # any JSON string
    max_depth: int  # times a recursive `$ref` is expanded
    ref_overrides_siblings: bool  # drafts 3-7: a `$ref` hides its sibling keywords
    integral_floats: bool  # draft 6 on: 1.0 is an integer
    float64_numbers: bool  # strict mode: numbers carry at most a float64's digits
    plain_integers: bool  # integers without a zero fraction (PLAIN_INTEGERS_MARK)
    # ----- state of the recursion -----
    ref_stack: list[str]  # the `$ref`s being expanded, outermost first
    reach: RefReach  # which `$ref`s a subschema may expand
    n_alternatives: int  # anyOf / oneOf branches built so far (bounded)
    lossy_nodes: dict[int, bool]  # id(merged branch) -> its automaton leaves strings out
    # ----- memos (built once per compile) -----
    any_memo: dict[int, object]  # any JSON value, by nesting depth
    string_memo: dict[tuple, tuple[Node, int]]  # string nodes, by their keywords
    key_region_memo: dict[tuple, tuple[list, int]]  # see objects.key_regions

    @property
    def number_text(self) -> str:
        """The regex of an unconstrained number."""
        ...

    def value(self, schema: Any, ptr: str) -> Node:
        """The language of a subschema at JSON pointer `ptr`."""
        ...

    def normalise(self, schema: Any, ptr: str) -> dict | bool:
        """The schema as one conjunction of keywords (alternatives kept in `_alts`)."""
        ...

    def resolve_ref(self, ref: str, ptr: str) -> Any: ...

    def from_norm(self, norm: dict | bool, ptr: str) -> Node:
        """The language of a normalised schema."""
        ...

    def finite_values(self, schema: Any, ptr: str, depth: int = 0) -> list | None: ...

    def literal_of(self, schema: Any, value: Any, ptr: str = "#", check: Any = None) -> Node: ...

    def accepts(self, schema: Any, value: Any) -> bool:
        """Whether `value` is an instance of `schema` (the jsonschema library decides)."""
        ...

    def types_of(self, s: dict, depth: int = 0) -> set[str]: ...

    def count_alternative(self, kind: str, ptr: str) -> None: ...

    def dfa(self, node: object, max_states: int = DEFAULT_MAX_STATES) -> Any:
        """The automaton of `node`, once per node in a compile."""
        ...

    def wrap(self, open_: str, inner: Node, close: str) -> Node:
        """`inner` between two brackets, whitespace inside them."""
        ...
