"""Structural tags (XGrammar's format tree and SGLang's structures / triggers) as token
constraints, walked token by token with the DeepSeek tokenizer."""

from __future__ import annotations

import json

import pytest

from grammar import CompiledEBNF, CompiledGrammar, GrammarError, compile_structural_tag
from grammar.structural import spec as spec_module
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}


def _tag(name: str, schema: dict) -> dict:
    return {
        "type": "tag",
        "begin": f"<function={name}>",
        "content": {"type": "json_schema", "json_schema": schema},
        "end": "</function>",
    }


def _triggered(**flags) -> dict:
    return {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<function="],
            "tags": [_tag("weather", WEATHER), _tag("time", TIME)],
            **flags,
        },
    }


def _accepts(g, text: str) -> bool:
    m = g.matcher()
    for t in deepseek_tokenizer().encode(text, add_special_tokens=False):
        if not m.is_allowed(t):
            return False
        m.advance(t)
    return m.is_accepting()


CALL = '<function=weather>{"city":"Paris","days":3}</function>'
CALL2 = '<function=time>{"zone":"UTC"}</function>'


def test_free_text_then_calls_are_constrained_exactly() -> None:
    g = compile_structural_tag(_triggered(), deepseek_vocab())
    for good in ["", "Just text, no tools.", f"Sure. {CALL} Done.", f"{CALL}{CALL2}", CALL]:
        assert _accepts(g, good), good
    for bad in [
        '<function=wind>{"city":"Paris"}</function>',  # undeclared tool
        '<function=weather>{"days":3}</function>',  # missing required
        '<function=weather>{"city":"Paris","x":1}</function>',  # undeclared property (strict)
        '<function=time>{"zone":"PST"}</function>',  # not in the enum
        '<function=weather>{"city":"Paris"}',  # end string missing
        "a <function= b",  # a trigger must open a tag
    ]:
        assert not _accepts(g, bad), bad


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, [True, True, True, True, True, True, True]),
        ({"stop_after_first": True}, [True, True, True, True, False, False, False]),
        ({"at_least_one": True}, [False, False, True, False, True, True, False]),
        (
            {"at_least_one": True, "stop_after_first": True},
            [False, False, True, False, False, False, False],
        ),
    ],
)
def test_at_least_one_and_stop_after_first_as_xgrammar_documents(flags, expected) -> None:
    g = compile_structural_tag(_triggered(**flags), deepseek_vocab())
    texts = ["", "hi", CALL, f"hi {CALL}", f"{CALL} bye", f"{CALL}{CALL2}", f"x{CALL}y{CALL2}z"]
    assert [_accepts(g, t) for t in texts] == expected


def test_trigger_split_across_tokens_and_partial_triggers_in_free_text() -> None:
    vocab = deepseek_vocab()
    tok = deepseek_tokenizer()
    g = compile_structural_tag(_triggered(), vocab)
    m = g.matcher()
    # the trigger arrives in pieces; until it is whole the text is free
    for piece in ["Look: <", "func", "tion"]:
        for t in tok.encode(piece, add_special_tokens=False):
            m.advance(t)
    assert m.is_accepting()  # "<function" is not the trigger yet: free text may end here
    m.advance(tok.encode("=", add_special_tokens=False)[0])
    assert not m.is_accepting()  # inside a tag now: its name and arguments must follow
    assert not m.is_allowed(tok.encode("x", add_special_tokens=False)[0])
    assert _accepts(g, "a < b and <func tion> are fine")


def test_a_trigger_that_is_a_prefix_of_another() -> None:
    spec = {
        "type": "triggered_tags",
        "triggers": ["<tool", "<tool_call>"],
        "tags": [
            {"type": "tag", "begin": "<tool>", "content": {"type": "const_string", "value": "A"},
             "end": "</tool>"},
            {"type": "tag", "begin": "<tool_call>",
             "content": {"type": "regex", "pattern": "[0-9]+"}, "end": "</tool_call>"},
        ],
    }  # fmt: skip
    g = compile_structural_tag(spec, deepseek_vocab())
    for good in ["x <tool>A</tool> y", "<tool_call>42</tool_call>", "tools are <too"]:
        assert _accepts(g, good), good
    for bad in ["<tool>B</tool>", "<tool_call>A</tool_call>", "<toolbox>"]:
        assert not _accepts(g, bad), bad


def test_end_string_and_begin_are_forced_for_jump_forward() -> None:
    spec = {
        "type": "triggered_tags",
        "triggers": ["<function="],
        "tags": [_tag("weather", WEATHER)],
    }
    g = compile_structural_tag(spec, deepseek_vocab())
    m = g.matcher()
    m.advance_bytes(b"ok <function=")
    assert m.forced_text() == 'weather>{"city":"'
    m.advance_bytes(b'weather>{"city":"Rome"')
    m.advance_bytes(b"}")
    assert m.forced_text() == "</function>"


def test_any_text_stops_at_the_end_string_and_eos_ends_it() -> None:
    vocab = deepseek_vocab()
    eos = vocab.eos_token_ids[0]
    tag = {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": "</a>"}
    g = compile_structural_tag({"type": "structural_tag", "format": tag}, vocab)
    assert _accepts(g, "<a>x</a</a>")
    assert not _accepts(g, "<a>x</a>y</a>")
    seq = {
        "type": "sequence",
        "elements": [{"type": "const_string", "value": "A"}, {"type": "any_text"}],
    }
    g = compile_structural_tag(seq, vocab)
    m = g.matcher()
    m.advance_bytes(b"A")
    assert m.is_allowed(eos)
    m.advance_bytes(b"bc")
    assert m.is_allowed(eos)


def test_tags_with_separator() -> None:
    spec = {
        "type": "tags_with_separator",
        "tags": [_tag("weather", WEATHER), _tag("time", TIME)],
        "separator": ",",
    }
    g = compile_structural_tag(spec, deepseek_vocab())
    for good in ["", CALL, f"{CALL},{CALL2}", f"{CALL2},{CALL2},{CALL}"]:
        assert _accepts(g, good), good
    for bad in [f"{CALL},", f"x{CALL}", f"{CALL} {CALL2}"]:
        assert not _accepts(g, bad), bad
    g = compile_structural_tag({**spec, "at_least_one": True}, deepseek_vocab())
    assert not _accepts(g, "")


def test_sglang_structures_and_triggers() -> None:
    spec = {
        "structures": [
            {"begin": "<function=weather>", "schema": WEATHER, "end": "</function>"},
            {"begin": "<function=time>", "schema": TIME, "end": "</function>"},
        ],
        "triggers": ["<function="],
    }
    g = compile_structural_tag(json.dumps(spec), deepseek_vocab())
    assert _accepts(g, f"Let me look. {CALL}")
    assert not _accepts(g, '<function=weather>{"city":1}</function>')


def test_nested_formats_regex_or_and_a_recursive_ebnf_grammar() -> None:
    nested = {
        "type": "sequence",
        "elements": [
            {"type": "or", "elements": [
                {"type": "const_string", "value": "yes"},
                {"type": "regex", "pattern": "n[o]+"},
            ]},
            {"type": "const_string", "value": ": "},
            {"type": "grammar",
             "grammar": 'root ::= "(" root ")" | "x"\n'},
        ],
    }  # fmt: skip
    g = compile_structural_tag(nested, deepseek_vocab())
    assert isinstance(g, CompiledEBNF)  # the nested grammar is recursive
    for good in ["yes: x", "nooo: ((x))"]:
        assert _accepts(g, good), good
    for bad in ["yes: ((x)", "n: x", "maybe: x"]:
        assert not _accepts(g, bad), bad
    regular = {**nested, "elements": nested["elements"][:2]}
    assert isinstance(compile_structural_tag(regular, deepseek_vocab()), CompiledGrammar)


def test_tools_share_their_compiled_schemas_between_specs() -> None:
    a = compile_structural_tag(_triggered(), deepseek_vocab())
    reader = spec_module.SpecReader("strict", None)
    first = reader.format(_tag("weather", WEATHER), "f")
    second = spec_module.SpecReader("strict", None).format(_tag("other", WEATHER), "f")
    assert first.items[1].node is second.items[1].node  # the same tree, built once
    assert a is compile_structural_tag(_triggered(), deepseek_vocab())


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"type": "structural_tag", "format": {"type": "nope"}}, "format.type"),
        (
            {"type": "triggered_tags", "triggers": ["<x"], "tags": [_tag("w", WEATHER)]},
            "format.tags[0].begin",
        ),
        (
            {"type": "json_schema", "json_schema": WEATHER, "style": "yaml_xml"},
            "format.style",
        ),
        ({"type": "any_text", "max_tokens": 5}, "format.max_tokens"),
        ({"type": "grammar", "grammar": "root ::= missing"}, "format.grammar"),
        ({"type": "tag", "begin": "<a>", "content": {"type": "any_text"}}, "format.end"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(spec: dict, path: str) -> None:
    with pytest.raises(GrammarError) as err:
        compile_structural_tag(spec, deepseek_vocab())
    assert path in str(err.value)


def test_tool_call_benchmark_accepts_no_invalid_call(capsys) -> None:
    """The structural-tags benchmark on 3 tools: every valid call walks, no invalid one does,
    in the triggered_tags rows and in the built-in tags' rows (qwen3_coder, gpt-oss)."""
    from benchmarks.grammar.structural import structural_suite
    from tests.support.schema_bench import bench_files

    if not bench_files():
        pytest.skip("JSONSchemaBench sample not found")
    structural_suite(deepseek_tokenizer(), ["ours"], sizes=(3,))
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 3")]
    assert len(rows) == 3, rows
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[-2].startswith("0 of ") and cells[-1].startswith("0 of "), row


def _const_tag(begin: str, value: str, end: str = "</f>") -> dict:
    return {"type": "tag", "begin": begin, "content": {"type": "const_string", "value": value},
            "end": end}  # fmt: skip


@pytest.mark.parametrize("shape", ["triggered_tags", "tags_with_separator"])
def test_tags_sharing_their_begins_keep_each_begin_with_its_own_content(shape) -> None:
    """The begins are written once as a trie (`spec.any_tag`): a begin that is a prefix of
    another, two tags with the same begin, and begins that differ only at the end still each
    take only their own content."""
    tags = [
        _const_tag("<f=a>", "A"),
        _const_tag("<f=ab>", "AB"),
        _const_tag("<f=ab>", "ab2"),
        _const_tag("<f=abc>", "ABC"),
        _const_tag("<f=b>", "B"),
    ]
    fmt = {"type": shape, "tags": tags}
    if shape == "triggered_tags":
        fmt["triggers"] = ["<f="]
    else:
        fmt["separator"] = ","
    g = compile_structural_tag({"type": "structural_tag", "format": fmt}, deepseek_vocab())
    pairs = [(t["begin"], t["content"]["value"]) for t in tags]
    for begin, value in pairs:
        assert _accepts(g, f"{begin}{value}</f>"), (begin, value)
    for begin, _ in pairs:
        for _, value in pairs:
            if (begin, value) not in pairs:
                assert not _accepts(g, f"{begin}{value}</f>"), (begin, value)
    assert not _accepts(g, "<f=a>A</g>")  # the shared end is still required


def test_tags_with_different_ends_keep_their_own_end() -> None:
    tags = [_const_tag("<f=a>", "x", "</a>"), _const_tag("<f=b>", "x", "</b>")]
    fmt = {"type": "triggered_tags", "triggers": ["<f="], "tags": tags}
    g = compile_structural_tag({"type": "structural_tag", "format": fmt}, deepseek_vocab())
    assert _accepts(g, "<f=a>x</a>") and _accepts(g, "<f=b>x</b>")
    assert not _accepts(g, "<f=a>x</b>") and not _accepts(g, "<f=b>x</a>")


def test_forced_text_masks_equal_the_full_walk() -> None:
    """Inside forced text (a gpt-oss call's opening after the name, JSON keys, the end) the
    mask comes from the text's prefixes (`forced_masks`); it equals the token index's own walk
    at every state of calls to two tools, and the shortcut answers at many of them."""

    from runtime.server.tools.call_tags import builtin_structural_tag

    tools = [
        {"type": "function", "function": {"name": n, "parameters": s}}
        for n, s in (("get_weather", WEATHER), ("get_time", TIME))
    ]
    g = compile_structural_tag(builtin_structural_tag("gpt-oss", tools), deepseek_vocab())
    assert g.index.shortcut is not None
    text = (
        "Let me check. <|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris", "days": 3}<|call|> and <|channel|>commentary '
        'to=functions.get_time <|constrain|>json<|message|>{"zone":"UTC"}<|call|> done'
    )
    _walk_checking_shortcut(g, text)


def test_forced_text_masks_of_xml_calls_equal_the_full_walk() -> None:
    """Qwen3-Coder's XML calls: forced texts such as `</parameter>\n<parameter=` + a name
    differ after a point no token reaches, and share one mask (`forced_masks` keys it by the
    text cut there); at every state of calls to two tools with overlapping parameter names
    the shortcut's mask equals the token index's own walk."""

    from runtime.server.tools.call_tags import builtin_structural_tag
    from runtime.server.tools.formats import FORMATS

    tools = [
        {"type": "function", "function": {"name": n, "parameters": s}}
        for n, s in (("get_weather", WEATHER), ("get_time", TIME))
    ]
    g = compile_structural_tag(builtin_structural_tag("qwen3_coder", tools), deepseek_vocab())
    assert g.index.shortcut is not None
    fmt = FORMATS["qwen3_coder"]
    text = (
        "Let me check. " + fmt.render([("get_weather", {"city": "Paris", "days": 3})])
        + " and " + fmt.render([("get_time", {"zone": "UTC"})])
        + " then " + fmt.render([("get_weather", {"city": "Rome", "days": 12})])
    )  # fmt: skip
    _walk_checking_shortcut(g, text)


def _walk_checking_shortcut(g, text: str) -> None:
    """Walk `text`'s DeepSeek tokens through `g`: wherever the index's shortcut answers a
    state, its mask equals the index's own walk; the text is accepted, with 10+ answers."""
    import numpy as np

    answered = 0
    m = g.matcher()
    for t in deepseek_tokenizer().encode(text, add_special_tokens=False):
        words = g.index.shortcut(m.state)
        if words is not None:
            answered += 1
            full = g.index._computed(m.state, 0)
            assert np.array_equal(words.view(np.uint32), full.view(np.uint32)), m.state
        assert m.is_allowed(t)
        m.advance(t)
    assert m.is_accepting() and answered >= 10


def test_narrow_state_masks_equal_the_full_walk() -> None:
    """Outside forced text, a state that fewer than `NARROW` bytes leave (a number's digits,
    the separators after a value) takes its mask from one C walk (`ForcedMasks._narrow`): it
    equals the index's own walk, EOS included where the tag may end (after the last number);
    a state more bytes leave (string contents) is left to the index."""
    import numpy as np

    from grammar.structural.forced_masks import NARROW

    schema = {
        "type": "object",
        "properties": {"q": {"type": "string"}, "n": {"type": "number"}},
        "required": ["q", "n"],
    }
    spec = {
        "type": "sequence",
        "elements": [
            {"type": "json_schema", "json_schema": schema},
            {"type": "const_string", "value": " n="},
            {"type": "json_schema", "json_schema": {"type": "integer"}},
        ],
    }
    vocab = deepseek_vocab()
    g = compile_structural_tag(spec, vocab)
    shortcut, dfa = g.index.shortcut, g.dfa
    narrow = wide = 0
    m = g.matcher()
    text = '{"q":"a b c","n":-12.5e3} n=4096'
    for t in deepseek_tokenizer().encode(text, add_special_tokens=False):
        s = m.state
        words = shortcut(s)
        if dfa.forced_byte(s) < 0:
            few = dfa.live_bytes(s) < NARROW
            assert (words is not None) == (few and shortcut._trie is not None), s
            narrow += words is not None
            wide += not few
        if words is not None:
            full = g.index._computed(s, 0)
            assert np.array_equal(words.view(np.uint32), full.view(np.uint32)), s
        m.advance(t)
    assert m.is_accepting() and wide >= 1
    end = shortcut(m.state)
    if shortcut._trie is not None:
        assert narrow >= 5 and end is not None
        eos = vocab.eos_token_ids[0]
        assert (int(end.view(np.uint32)[eos >> 5]) >> (eos & 31)) & 1
        full = g.index._computed(m.state, 0)
        assert np.array_equal(end.view(np.uint32), full.view(np.uint32))


def test_trigger_state_masks_borrowed_from_free_text_equal_the_full_walk() -> None:
    """Free text that has begun a trigger going on with a space (as gpt-oss's `<|channel|>
    commentary to=`): the tokens that start with a space (many) part that state from free text
    at their first byte, so its mask is borrowed from free text with only the " t" tokens
    walked (`ForcedMasks._borrowed`); " to=g" dies there (no tool g) and lives in free text.
    At every state along the trigger, and in free text after a broken one, the shortcut's mask
    equals the index's own walk."""
    import numpy as np

    from grammar import TokenVocabulary

    words = ["the", "a", "tool", "to", "to=", "to=f", "to=g", "tx", "t", "<", "ab"]
    toks = [bytes([b]) for b in range(256)]
    letters = "abcdefghijklmnopqrsuvwxyz"  # (no "t": the space tokens most of them part)
    toks += [b" " + w.encode() for w in words + [x + y for x in letters for y in letters]]
    toks += [b"ab to=fn>", b"ab to=g", None]
    vocab = TokenVocabulary(toks, [len(toks) - 1])
    tag = {"begin": "ab to=fn>", "content": {"type": "const_string", "value": "x"}, "end": "</>"}
    spec = {"type": "triggered_tags", "triggers": ["ab to="], "tags": [{"type": "tag", **tag}]}
    g = compile_structural_tag(spec, vocab)
    shortcut = g.index.shortcut
    borrowed = 0
    for text in ("ab to=fn>x</>", "ab tools ab to"):
        m = g.matcher()
        for b in text.encode():
            m.advance_bytes(bytes([b]))
            s = m.state
            words_ = shortcut(s)
            if words_ is None:
                continue
            borrowed += g.dfa.forced_byte(s) < 0 and g.dfa.live_bytes(s) >= 64
            full = g.index._computed(s, 0)
            assert np.array_equal(words_.view(np.uint32), full.view(np.uint32)), (text, s)
    assert borrowed >= (2 if shortcut._trie is not None else 0)
