"""The faster paths of the schema -> regex tree phase (json_schema_to_node) must build the
same language as the slower ones they stand in for, and a schema's compile must not pay a
library import that a long-running process pays once."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _modules_imported_compiling(schema_text: str) -> str:
    """The modules a fresh process imports while compiling `schema_text` (a Python literal)."""
    code = (
        "import sys, grammar\n"
        "from grammar.json_schema.schema import json_schema_to_node\n"
        "before = set(sys.modules)\n"
        f"json_schema_to_node({schema_text})\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_an_enum_check_imports_no_module_at_compile_time():
    # the enum values are checked against the rest of the schema by the jsonschema library
    schema = "{'type': 'integer', 'minimum': 2, 'enum': [1, 2, 3]}"
    assert _modules_imported_compiling(schema) == "[]"


# ----- property-name complements: subtries shared between name lists -----
def _partitions_strings(names: list[str]) -> bool:
    """string_except(names) and the names' spellings are disjoint and together every JSON
    string."""
    from grammar.automata import dfa_ops
    from grammar.automata import regex_ast as ra
    from grammar.automata.fsm import node_to_dfa
    from grammar.json_schema.exact.names import name_spellings, string_except
    from grammar.json_schema.scalars import STRING_CHAR_TEXT, STRING_TEXT

    extra = string_except(names, ra.parsed(STRING_CHAR_TEXT))
    spelt = ra.alt([name_spellings(n) for n in names])
    strings, either = node_to_dfa(ra.parsed(STRING_TEXT)), node_to_dfa(ra.alt([extra, spelt]))
    return not (
        dfa_ops.product(node_to_dfa(extra), node_to_dfa(spelt), True).accepting.any()
        or dfa_ops.product(strings, either, False).accepting.any()
        or dfa_ops.product(either, strings, False).accepting.any()
    )


def test_name_lists_sharing_subtries_each_partition_the_strings():
    # built in this order, later lists reuse the subtries of earlier ones ("kind", "pec",
    # "ata", a name that is a prefix of another in one list and not in the next)
    lists = [
        ["apiVersion", "kind", "metadata", "spec"],
        ["kind", "spec", "status", "data"],
        ["metadata", "meta", "kind"],
        ["xkind", "metadat", "spec", "apiVersion", "a"],
        ["meta", "kind", "kind"],
    ]
    assert all(_partitions_strings(names) for names in lists)


# ----- per-schema memos of the builder: the same language as building every copy afresh -----
class _NoMemo(dict):
    """A memo that keeps nothing: every lookup misses, as before the memos."""

    def __setitem__(self, key, value) -> None:
        pass


_MEMO_CASES = {
    "pattern-and-length-twice": {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^x.y", "maxLength": 5},
            "b": {"type": "string", "pattern": "^x.y", "maxLength": 5},
            "c": {"type": "string", "pattern": "^x.y"},
        },
        "required": ["a"],
    },
    "lossy-string-in-two-oneof-branches": {
        "oneOf": [
            {"type": "string", "pattern": "^a.$"},
            {"type": "string", "pattern": "^a.$", "minLength": 2},
            {"type": "integer"},
        ]
    },
    "pattern-properties-under-dependencies": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
        "patternProperties": {"^x": {"type": "integer"}, "y$": {"type": "null"}},
        "additionalProperties": False,
        "dependencies": {"a": ["b"]},
    },
    "same-patterns-other-names": {
        "type": "object",
        "properties": {
            "p": {
                "properties": {"xa": {"type": "string"}},
                "patternProperties": {"^x": {"type": "integer"}},
                "additionalProperties": False,
            },
            "q": {
                "properties": {"xb": {"type": "string"}},
                "patternProperties": {"^x": {"type": "integer"}},
                "additionalProperties": False,
            },
        },
    },
    "oneof-scalars-disjoint-by-automata": {
        "oneOf": [
            {"type": "string", "pattern": "^a", "maxLength": 3},
            {"type": "string", "pattern": "^b"},
            {"type": "string", "pattern": "^a", "minLength": 4},
        ]
    },
    "oneof-objects-discriminated-by-member-patterns": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"k": {"type": "string", "pattern": "^a"}, "v": {"type": "integer"}},
                "required": ["k"],
            },
            {
                "type": "object",
                "properties": {"k": {"type": "string", "pattern": "^b"}, "v": {"type": "string"}},
                "required": ["k"],
            },
        ]
    },
    "tree-with-a-shared-leaf-definition": {
        "$defs": {
            "n": {
                "type": "object",
                "properties": {
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 2},
                    "meta": {"$ref": "#/$defs/m"},
                },
                "additionalProperties": False,
            },
            "m": {
                "type": "object",
                "properties": {"a": {"type": "null"}},
                "additionalProperties": False,
            },
        },
        "$ref": "#/$defs/n",
    },
    "mutual-recursion-entered-at-two-places": {
        "$defs": {
            "a": {
                "type": "object",
                "properties": {"b": {"$ref": "#/$defs/b"}},
                "additionalProperties": False,
            },
            "b": {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/a"}, "x": {"type": "null"}},
                "additionalProperties": False,
            },
        },
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/a"}, "q": {"$ref": "#/$defs/b"}},
        "additionalProperties": False,
    },
    "oneof-discriminated-by-const-and-enum": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "a"}, "n": {"type": "integer", "minimum": 2}},
                "required": ["kind"],
            },
            {"type": "object", "properties": {"kind": {"enum": ["b", 1.0]}}, "required": ["kind"]},
            {
                "type": "object",
                "properties": {"kind": {"enum": ["c", 1, True]}, "n": {"type": "null"}},
                "required": ["kind", "n"],
            },
        ]
    },
    "enum-of-one-and-true-under-integer": {"type": "integer", "enum": [1, True, 1.0, "x"]},
    "recursive-pattern-properties": {
        "type": "object",
        "patternProperties": {"^k.": {"$ref": "#"}},
        "additionalProperties": False,
    },
    "enum-by-ref-in-oneof-cases": {
        "$defs": {"e": {"enum": ["p", "q", 1, 2.5]}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/e"}, "b": {"$ref": "#/$defs/e", "type": "string"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
    },
}


def _language_or_error(schema: dict, memo: bool):
    from grammar.automata.fsm import node_to_dfa
    from grammar.errors import GrammarError
    from grammar.json_schema import schema as js

    init = js.SchemaBuilder.__init__

    def no_memos(self, *args) -> None:
        init(self, *args)
        self._finite, self.string_memo, self.key_region_memo = _NoMemo(), _NoMemo(), _NoMemo()
        self._dfas = self._values = self._accepted = _NoMemo()

    js.SchemaBuilder.__init__ = init if memo else no_memos
    try:
        return node_to_dfa(js.json_schema_to_node(schema))
    except GrammarError as e:
        return type(e).__name__
    finally:
        js.SchemaBuilder.__init__ = init


@pytest.mark.parametrize("name", sorted(_MEMO_CASES))
def test_memoised_builder_compiles_the_same_language(name):
    from grammar.automata import dfa_ops

    with_memo = _language_or_error(_MEMO_CASES[name], True)
    without = _language_or_error(_MEMO_CASES[name], False)
    if isinstance(without, str) or isinstance(with_memo, str):
        assert with_memo == without
        return
    assert not dfa_ops.product(with_memo, without, False).accepting.any()
    assert not dfa_ops.product(without, with_memo, False).accepting.any()


def test_a_memoised_string_still_records_its_narrowing():
    # `.` is narrowed to unescaped characters (note_loss): a oneOf branch holding it must be
    # seen as inexact every time, or subtracting it would be unsound
    from grammar.automata.pattern import losses
    from grammar.json_schema import objects, scalars
    from grammar.json_schema.schema import SchemaBuilder

    b = SchemaBuilder({}, "", 3, 5)
    s = {"type": "string", "pattern": "^a.b$", "maxLength": 4}
    n0 = losses()
    first = scalars.string_value(b, s, "#/a")
    n1 = losses()
    again = scalars.string_value(b, dict(s), "#/b")
    n2 = losses()
    assert again is first and n1 > n0 and n2 - n1 == n1 - n0
    o = {"patternProperties": {"^x.": {"type": "integer"}}, "additionalProperties": False}
    objects.object_value(b, o, "#/o")
    n3 = losses()
    objects.object_value(b, dict(o), "#/p")
    assert losses() - n3 == n3 - n2 > 0


def test_basic_plane_escapes_of_ascii_sets_match_the_digit_construction():
    # _bmp_except's shortcut for codes below U+0100 against the general digit-by-digit one
    import random

    from grammar.automata import dfa_ops
    from grammar.automata.fsm import node_to_dfa
    from grammar.json_schema.exact import names

    rng = random.Random(7)
    sets = [frozenset({0}), frozenset({0xFF}), frozenset(range(0x100)), frozenset({0x41, 0x61})]
    sets += [frozenset(rng.sample(range(0x100), rng.randint(1, 8))) for _ in range(12)]
    for codes in sets:
        fast, general = node_to_dfa(names._bmp_except(codes)), node_to_dfa(names._bmp_digits(codes))
        assert not dfa_ops.product(fast, general, False).accepting.any(), sorted(codes)
        assert not dfa_ops.product(general, fast, False).accepting.any(), sorted(codes)


def test_a_length_bounded_pattern_imports_no_module_at_compile_time():
    # the length product's np.unique would import numpy.ma on its first call
    schema = "{'type': 'string', 'pattern': '^a.c', 'maxLength': 9}"
    assert _modules_imported_compiling(schema) == "[]"


def _reference_string_except(names: list[str], string_char):
    """The complement of the names' trie, written plainly (one recursive pass, nothing
    shared between calls): what names.string_except must build node for node."""
    from grammar.automata import regex_ast as ra
    from grammar.json_schema.exact.names import char_except, char_spellings

    trie: dict = {}
    for name in names:
        node = trie
        for ch in name:
            node = node.setdefault(ch, {})
        node[""] = {}
    rest = ra.repeat(string_char, 0, None)

    def complement(node: dict):
        children = [c for c in node if c]
        options = [ra.seq(char_except(frozenset(children)), rest)]
        if "" not in node:
            options.append(ra.EMPTY)
        options += [ra.seq(char_spellings(c), complement(node[c])) for c in children]
        return ra.alt(options)

    return ra.seq(ra.char('"'), complement(trie), ra.char('"'))


def test_name_complements_are_the_plain_trie_complement_node_for_node():
    from grammar.automata import regex_ast as ra
    from grammar.json_schema.exact import names
    from grammar.json_schema.scalars import STRING_CHAR_TEXT

    string_char = ra.parsed(STRING_CHAR_TEXT)
    lists = [
        ["apiVersion", "kind", "metadata"],
        ["kind", "kinds", "kin"],
        ["a\x01b", 'q"', "x\\y", "\U0001f600z", "\ud800", "é"],
        ["", "spec", "spec2"],
        ["metadata", "status", "apiVersion", "data"],
    ]
    names._BUILT.clear()
    names._SUBTRIES.clear()
    for n in lists:  # built in turn, later lists reuse the earlier ones' pieces
        assert names.string_except(n, string_char) == _reference_string_except(n, string_char)


def test_reachable_refs_match_a_plain_walk():
    # RefReach reuses closures already built; a plain walk follows every reference anew
    from grammar.json_schema.refs.local import pointer_target
    from grammar.json_schema.refs.reach import RefReach

    def plain(root, schema) -> set[str]:
        found, todo, walked = set(), [schema], set()
        while todo:
            x = todo.pop()
            if isinstance(x, dict):
                if isinstance(x.get("$ref"), str) and x["$ref"] not in found:
                    found.add(x["$ref"])
                    try:
                        target = pointer_target(root, x["$ref"])
                    except LookupError:
                        target = None
                    if id(target) not in walked:
                        walked.add(id(target))
                        todo.append(target)
                todo.extend(x.values())
            elif isinstance(x, list):
                todo.extend(x)
        return found

    root = {
        "$defs": {
            "a": {"properties": {"b": {"$ref": "#/$defs/b"}, "c": {"$ref": "#/$defs/c"}}},
            "b": {"items": {"$ref": "#/$defs/a"}},
            "c": {"anyOf": [{"$ref": "#/$defs/d"}, {"$ref": "#/$defs/missing"}]},
            "d": {"type": "string"},
            "e": {"not": {"$ref": "#/$defs/c"}},
            "f": {"$ref": "#"},
        },
        "properties": {"x": {"$ref": "#/$defs/e"}, "y": {"$ref": "#/$defs/b"}},
    }
    reach = RefReach(root)
    subs = [root, *root["$defs"].values(), *root["properties"].values()]
    for sub in [*subs, *reversed(subs)]:  # in both orders: closures built early or late
        assert reach.of(sub) == plain(root, sub)


def test_prebuild_leaves_no_shared_automaton_for_a_compile_to_build():
    code = (
        "from grammar.json_schema import schema\n"
        "from grammar.json_schema.scalars import _ANY_DFAS, _LEAVES\n"
        "schema.prebuild()\n"
        "before = (len(_ANY_DFAS), len(_LEAVES))\n"
        "for s in ({'type': 'object', 'properties': {'a': {'type': 'integer'}}},\n"
        "          {'type': 'array', 'items': {'type': ['string', 'number']}},\n"
        "          {'$schema': 'http://json-schema.org/draft-04/schema#', 'type': 'integer'},\n"
        "          {'$schema': 'http://json-schema.org/draft-07/schema#', 'items': {}}):\n"
        "    schema.json_schema_to_node(s)\n"
        "print(before == (len(_ANY_DFAS), len(_LEAVES)), before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "True", out.stdout
