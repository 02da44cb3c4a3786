"""The official JSON-Schema-Test-Suite (shared data): no invalid instance accepted on the format
groups and the keyword files this engine compiles, scored as
`python -m benchmarks.correctness.conformance` scores them; plus targeted cases for each
conformance fix (formats, integers spelled 1.0, object values in any member order, `$id` /
`$anchor` references, `contains` counts, `unevaluated*`)."""

from __future__ import annotations

import json

import pytest

from benchmarks.correctness.suites import groups, scored_schema, suite_dir, suite_files
from grammar import UnsupportedSchemaError
from grammar.automata.fsm import node_to_lazy_dfa
from grammar.json_schema.schema import json_schema_to_node, json_schema_to_regex
from tests.support.json_text import compact, serialise
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab
from tests.support.walks import walk

NO_SUITE = f"JSON-Schema-Test-Suite not found at {suite_dir()} (set SGL_SHARED_DIR)"
# keyword files whose fixes these tests cover, beside every optional/format file
KEYWORD_FILES = ("const", "enum", "type", "contains", "minContains", "maxContains", "anchor",
                 "ref.json", "unevaluatedProperties", "unevaluatedItems", "defs",
                 "definitions", "pattern")  # fmt: skip


def _scored_files() -> list[str]:
    files = suite_files("optional/format")
    return files + [
        f for f in suite_files() if any(k in f.rsplit("/", 1)[-1] for k in KEYWORD_FILES)
    ]


@pytest.mark.skipif(not suite_files(), reason=NO_SUITE)
def test_no_invalid_instance_accepted_on_the_official_suite() -> None:
    import grammar

    tok, vocab = deepseek_tokenizer(), deepseek_vocab()
    accepted, compiled, correct = [], 0, 0
    items = groups(_scored_files())
    for path, i, group in items:
        schema = scored_schema(group["schema"], path)
        try:
            g = grammar.compile_json_schema(schema, vocab)
        except grammar.GrammarError:
            continue  # refused: not correct, not unsound
        compiled += 1
        ok = True
        for test in group["tests"]:
            ids = tok.encode(serialise(schema, test["data"]), add_special_tokens=False)
            got = walk(g, ids)
            if got and not test["valid"]:
                accepted.append(f"{path.rsplit('tests/', 1)[-1]}#{i}: {test['description']}")
            ok &= got == test["valid"]
        correct += ok
    assert not accepted, accepted
    assert compiled >= 0.6 * len(items) and correct >= 0.9 * compiled, (compiled, correct)


def _dfa(schema):
    return node_to_lazy_dfa(json_schema_to_node(schema))


class Raw(str):
    """JSON text as written (e.g. a number's spelling), not a value to serialise."""


def _accepts(dfa, value) -> bool:
    text = value if isinstance(value, Raw) else compact(value)
    return dfa.matches(text.encode())


def _check(schema, good: list, bad: list) -> None:
    dfa = _dfa(schema)
    for v in good:
        assert _accepts(dfa, v), v
    for v in bad:
        assert not _accepts(dfa, v), v


def test_time_leap_seconds_only_at_23_59_60_utc() -> None:
    good = ["23:59:60Z", "23:59:60+00:00", "01:29:60+01:30", "15:59:60-08:00", "00:29:60-23:30",
            "05:29:60.5+05:30", "12:00:00Z"]  # fmt: skip
    bad = ["22:59:60Z", "23:58:60Z", "23:59:60+01:00", "23:59:60-00:30", "23:59:60+05:30",
           "24:00:00Z", "12:00:00"]  # fmt: skip
    _check({"type": "string", "format": "time"}, good, bad)
    _check(
        {"type": "string", "format": "date-time"},
        ["1998-12-31T23:59:60Z", "1998-12-31T15:59:60.123-08:00"],
        ["1998-12-31T22:59:60Z", "1998-12-31T23:59:60+01:00"],
    )


def test_email_dot_atoms_quoted_strings_and_address_literals() -> None:
    good = ["joe.bloggs@example.com", "te~st@example.com", "te.s.t@example.com",
            '"joe bloggs"@example.com', '"joe..bloggs"@example.com', '"a\\"b"@example.com',
            "joe@[127.0.0.1]", "joe@[IPv6:::1]", "a/b@example.com"]  # fmt: skip
    bad = [".test@example.com", "test.@example.com", "te..st@example.com", "@example.com",
           "joe@", "joe bloggs@example.com", "joe@[127.0.0.300]", '"a"b"@example.com',
           "joe@invalid=domain.com"]  # fmt: skip
    _check({"type": "string", "format": "email"}, good, bad)


def test_hostname_label_and_total_lengths_and_reserved_labels() -> None:
    label63 = "a" * 63
    good = ["www.example.com", f"{label63}.com", "a--b.com", ".".join(["a" * 30] * 8),
            ".".join([label63] * 3)]  # fmt: skip
    bad = ["", ".", "-a.com", "a-.com", f"{label63}a.com", ".".join(["a" * 63] * 5),
           "xn--X", "xn--9n2bp8q.xn--9t4b11yi5a", "XN--aa---o47jg78q", "ab--c.com"]  # fmt: skip
    _check({"type": "string", "format": "hostname"}, good, bad)
    assert all(len(h) <= 253 for h in good)
    # under a maxLength the total is counted: any number of labels, each still <= 63
    many = ".".join(["ab"] * 40)
    _check({"type": "string", "format": "hostname", "maxLength": 255}, good, [*bad, many])
    _check({"type": "string", "format": "hostname", "maxLength": 200}, [many, f"{label63}.c"],
           [f"{label63}a.c", "xn--X", ".".join(["abc"] * 60)])  # fmt: skip
    _check({"type": "string", "format": "hostname", "maxLength": 10}, ["a.b.c"], ["a" * 11])


def test_email_lengths_under_a_max_length() -> None:
    s = {"type": "string", "format": "email", "maxLength": 1024}
    _check(s, ["x@y.com", '"a b"@x.org'], [".x@y.com", "a" * 251 + "@b.c"])  # 254 at most
    _check({**s, "maxLength": 12}, ["abc@def.com"], ["abcd@efgh.com", "a@[1.2.3.4]"])


def test_integers_may_be_spelled_with_a_zero_fraction_from_draft_6() -> None:
    _check({"type": "integer"}, [1, 1.0, Raw("1.00"), -3.0], [1.5, Raw("1e2"), Raw("1.")])
    _check({"type": "integer", "minimum": 2, "multipleOf": 3}, [3, 3.0, Raw("6.000")], [4.0, 0.0])
    _check({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}, [1], [1.0])


def test_object_values_match_in_any_member_order() -> None:
    value = {"a": 1, "b": {"c": [1, 2], "d": None}, "e": "x"}
    schema = {"const": value}
    dfa = _dfa(schema)
    assert _accepts(dfa, value)
    assert dfa.matches(b'{"e":"x","b":{"d":null,"c":[1,2]},"a":1.0}')
    assert not dfa.matches(b'{"e":"x","b":{"d":null,"c":[2,1]},"a":1}')
    assert not dfa.matches(b'{"e":"x","a":1}')
    assert not dfa.matches(b'{"a":1,"a":1,"b":{"c":[1,2],"d":null},"e":"x"}')
    big = {f"k{i}": i for i in range(11)}
    with pytest.raises(UnsupportedSchemaError) as e:
        json_schema_to_node({"properties": {"x": {"enum": [big]}}})
    assert (e.value.keyword, e.value.pointer) == ("enum", "#/properties/x/enum")


def test_refs_through_ids_anchors_and_relative_uris() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "http://example.com/root.json",
        "$defs": {
            "A": {"$anchor": "foo", "type": "integer"},
            "B": {"$id": "other.json", "$defs": {"X": {"type": "string"}}, "$ref": "#/$defs/X"},
        },
        "properties": {
            "a": {"$ref": "#foo"},
            "b": {"$ref": "other.json"},
            "c": {"$ref": "http://example.com/other.json#/$defs/X"},
        },  # fmt: skip
    }
    _check(schema, [{"a": 1, "b": "x", "c": "y"}], [{"a": "1"}, {"b": 1}, {"c": 2}])
    # draft 7 names a place with "$id": "#name"
    _check({"definitions": {"x": {"$id": "#int", "type": "integer"}}, "$ref": "#int"}, [3], ["3"])
    for ref in ("#nope", "other.json", "http://localhost:1234/x.json"):
        with pytest.raises(UnsupportedSchemaError) as e:
            json_schema_to_node({"$ref": ref})
        assert e.value.keyword == "$ref"
    with pytest.raises(UnsupportedSchemaError) as e:  # its meaning depends on the draft
        json_schema_to_node({"allOf": [{"$id": "http://x/", "$ref": "y.json"}]})
    assert (e.value.keyword, e.value.pointer) == ("$id", "#/allOf/0")


def test_contains_with_min_and_max_counts() -> None:
    s = {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}
    _check(s, [[1], [2, 1, 3]], [[], [2, 3], ["1"]])
    _check({**s, "minContains": 2, "maxContains": 3}, [[1, 1], [1, 2, 1, 1]], [[1], [1, 1, 1, 1]])
    _check({**s, "minContains": 0, "maxContains": 1}, [[], [2], [1, 2]], [[1, 1]])
    _check({**s, "maxItems": 2}, [[1], [1, 5]], [[5, 5], [1, 1, 1]])  # a product with the items
    _check({"prefixItems": [{"type": "string"}], "contains": {"type": "integer"}},
           [["a", 1]], [["a"], [1]])  # fmt: skip
    # draft 7 knows no minContains: it is ignored
    d7 = {"$schema": "http://json-schema.org/draft-07/schema#", "contains": {"const": 1},
          "minContains": 3}  # fmt: skip
    _check(d7, [[1]], [[2]])
    # maxContains needs the negation of `contains`
    with pytest.raises(UnsupportedSchemaError) as e:
        json_schema_to_node({"contains": {"pattern": "^a"}, "maxContains": 1})
    assert (e.value.keyword, e.value.pointer) == ("maxContains", "#/maxContains")
    assert json_schema_to_regex(s)  # a plain `items` array keeps a regex text form


def test_unevaluated_properties_and_items() -> None:
    s = {"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}], "type": "object",
         "unevaluatedProperties": False}  # fmt: skip
    _check(s, [{"a": 1, "b": 2}, {}], [{"c": 1}, {"a": 1, "c": 1}])
    s = {"type": "object", "patternProperties": {"^x": {}},
         "unevaluatedProperties": {"type": "integer"}}  # fmt: skip
    _check(s, [{"x1": "s", "y": 1}], [{"y": "s"}])
    _check({"type": "array", "prefixItems": [{"type": "string"}], "unevaluatedItems": False},
           [["a"], []], [["a", 1]])  # fmt: skip
    _check({"anyOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False},
           [{}, {"a": 1}], [{"b": 1}])  # fmt: skip
    for schema, key in [
        ({"contains": {}, "unevaluatedItems": False}, "unevaluatedItems"),
    ]:  # fmt: skip
        with pytest.raises(UnsupportedSchemaError) as e:
            json_schema_to_node(schema)
        assert (e.value.keyword, e.value.pointer) == (key, f"#/{key}")


def test_not_of_number_values_and_merged_multiples() -> None:
    _check({"type": "integer", "not": {"const": 2}}, [1, 3, 20], [2, 2.0, Raw("2.00")])
    _check({"allOf": [{"multipleOf": 2}, {"multipleOf": 3}], "type": "integer"}, [6, 12], [2, 3, 4])
    _check({"allOf": [{"multipleOf": 0.5}, {"multipleOf": 1.5}]}, [1.5, 3], [0.5, 1])


def test_not_of_bounds_and_of_integer() -> None:
    _check({"not": {"minimum": 2, "exclusiveMaximum": 5}}, [1, 5, 5.0], [2, 4.9, "x"])
    not_int = {"not": {"type": "integer"}}
    _check(not_int, [1.5, -0.25, "x", True], [1, 1.0, Raw("1e2")])
    _check({**not_int, "anyOf": [{"enum": [1, 1.5]}]}, [1.5], [1, 1.0])
    with pytest.raises(UnsupportedSchemaError):  # draft 4: 1.0 is a non-integer number
        json_schema_to_node({"$schema": "http://json-schema.org/draft-04/schema#", **not_int})


def test_dynamic_refs_with_one_anchor_are_plain_refs() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": {"s": {"$dynamicAnchor": "items", "type": "string"}},
        "items": {"$dynamicRef": "#items"},
    }
    _check(schema, [["a"], []], [[1]])
    two = {**schema, "$defs": {**schema["$defs"], "t": {"$dynamicAnchor": "items"}}}
    with pytest.raises(UnsupportedSchemaError) as e:  # two of one name in one resource
        json_schema_to_node(two)
    assert (e.value.keyword, e.value.pointer) == ("$dynamicAnchor", "#/$defs/t/$dynamicAnchor")


def test_scorer_lists_the_peers() -> None:
    if not suite_files():
        pytest.skip(NO_SUITE)
    from benchmarks.correctness.conformance import peer_rows

    rows = peer_rows()
    assert any("llguidance" in r for r in rows) and not any("this project" in r for r in rows)
    assert json.loads(json.dumps(rows)) == rows
