"""llguidance's lark dialect, feature by feature: accept / refuse cases written from its
documentation (docs/syntax.md, docs/json_schema.md), for `--suite dialects` of
`benchmarks.grammar.compare` and tests/grammar/cfg/test_llguidance_lark.py.

Same shape as `dialect_cases.DialectCase`, kind "lark" (grammar text for `compile_lark`);
`unsupported` names the word our GrammarError carries for a feature we refuse by name.
"""

from __future__ import annotations

from benchmarks.grammar.dialect_cases import DialectCase

# DeepSeek's tool-call tokens (ids 128806, 128807, 128808; added tokens: the tests' tokenizer
# encodes their text as the one token)
BEGIN, END, OTHER = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>"
_CITY = '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}'


def _lark(
    feature: str, source: str, accept=(), refuse=(), unsupported: str = "", notes=None
) -> DialectCase:
    return DialectCase(
        f"lark: {feature}", "lark", source, tuple(accept), tuple(refuse), unsupported, notes or {}
    )


LLGUIDANCE_CASES = [
    _lark("{M,N} repetition", 'start: "a"{2,3} "b"{2} "c"{1,}', ["aabbc", "aaabbccc"],
          ["abbc", "aaaabbc", "aab"]),
    _lark("// comments and - in names", 'start: my-rule  // a comment\nmy-rule: "x" MY-T\n'
          'MY-T: /[0-9]+/', ["x1", "x42"], ["x", "1"]),
    _lark("%json inline schema", f"start: \"call \" %json {_CITY}",
          ['call {"city":"Paris"}', 'call { "city": "Paris" }'], ['call {}', 'call {"city":1}']),
    _lark("%json with text or call", f"start: TEXT | fun_call\nTEXT: /[^{{](.|\\n)*/\n"
          f"fun_call: %json {_CITY}", ["no call here", '{"city":"Oslo"}'], ['{"x":1}']),
    _lark("%json x-guidance compact", 'start: %json {"x-guidance": {"whitespace_flexible": '
          'false}, "type": "array", "items": {"type": "integer"}}', ["[1,2]"], ["[1, 2]"]),
    _lark("%json recursive schema", 'start: %json {"$defs": {"n": {"type": "object", '
          '"properties": {"k": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, '
          '"required": ["k"]}}, "$ref": "#/$defs/n"}',
          ['{"k":[{"k":[]}]}', '{"k":[{"k":[{"k":[{"k":[]}]}]}]}'], ['{"k":[{}]}', '{"k":1}']),
    _lark("%llguidance options", '%llguidance {}\nstart: "a"', ["a"], ["b"]),
    _lark("ignore_once", '%llguidance { "ignore_once": true }\n%ignore /[ \\t]{1,8}/\n'
          'start: "A" "!"', ["A!", "A  !"], ["A          !"]),
    _lark("ignore not initial", '%llguidance {}\n%ignore " "\nstart: "a" "b"', ["ab", "a b"],
          [" ab"]),
    _lark("special token by name", f"start: {BEGIN} /[a-z]+/ {END}",
          [f"{BEGIN}abc{END}"], ["abc", f"{BEGIN}abc", f"{BEGIN}abc{END}x"]),
    _lark("special token by id", 'start: "a" <[128806]>', [f"a{BEGIN}"], ["a", f"a{END}"]),
    _lark("special token ranges", 'start: "a" <[128806-128807,128810]>',
          [f"a{BEGIN}", f"a{END}"], [f"a{OTHER}", "a"]),
    _lark("special token negated", 'start: "a" <[^128806]>', [f"a{END}", "a,"],
          [f"a{BEGIN}", "a"]),
    _lark("special token wildcard", f"start: {BEGIN} <[*]>{{2}}",
          [f"{BEGIN}{END}{OTHER}", f"{BEGIN}{END}{END}"], [f"{BEGIN}{END}"]),
    _lark("& and ~ in terminals", "start: ASCII_LINES\n"
          "ASCII_LINES: /[a-zA-Z \\n]*/ & ~/(?s:.*)\\n\\n(?s:.*)/", ["ab\ncd", "x"],
          ["ab\n\ncd"]),
    _lark("~ negation alone", 'start: "<" NOT_AAA ">"\nNOT_AAA: /[a-z]*/ & ~/(?s:.*)aaa(?s:.*)/',
          ["<aab>", "<>"], ["<baaab>"]),
    _lark("[capture] attribute", 'start: foo\nfoo[capture]: "x" | "y"', ["x", "y"], ["z"]),
    _lark("[lazy] attribute", 'start: with_lazy "!"\nwith_lazy[lazy]: /.*<end>/',
          ["foo<end>!"], ["foo<end>bar<end>!"]),
    _lark("[suffix] attribute", 'start: with_suffix\nwith_suffix[suffix="<end>"]: /.*/',
          ["foo<end>"], ["foo", "foo<end>bar<end>"]),
    _lark("[stop] attribute", 'start: s "!"\ns[stop="<end>"]: /.*/', ["foo<end>!"],
          ["foo!", "foo<end>bar<end>!"],
          notes={"stop": "the marker stays in the text (XGrammar); llguidance takes it back"}),
    _lark("[max_tokens] attribute", 'start: s\ns[max_tokens=5]: /.*/', unsupported="max_tokens"),
    _lark("[temperature] attribute", 'start: s\ns[temperature=0.7]: /.*/',
          unsupported="temperature"),
    _lark("%regex substring_words", 'start: %regex { "substring_words": "foo bar. baz" }',
          ["foo bar", "bar.", "foo bar. baz"], ["fo", "ar.", "foobar"]),
    _lark("%regex substring_chunks", 'start: %regex { "substring_chunks": ["abc", "de", "fg"] }',
          ["abcde", "defg", "de"], ["ab", "cde"]),
    _lark("%regex substring_chars", 'start: %regex { "substring_chars": "ab c" }',
          ["b c", "ab"], ["ac"]),
    _lark("not LALR (Earley)", '%llguidance {}\nstart: a | b\na: "x" "y"\nb: "x" "y"',
          ["xy"], ["x"]),
    _lark("tool calls with lazy", 'start: ( f_foo | f_bar )* f_end\nf_end: TEXT\n'
          'TEXT: /(.|\\n)*/\nf_foo_hd[lazy]: TEXT "<function"\n'
          'f_foo: f_foo_hd "=foo>" %json { "type": "object" } "</function>"\n'
          'f_bar_hd[lazy]: TEXT "<function"\nf_bar: f_bar_hd "=bar>" /[0-9]+/ "</function>"',
          ["hi <function=bar>12</function> bye", 'x<function=foo>{"a":1}</function>'],
          ["<function=baz>1</function>", "<function=bar>x</function>"]),
    _lark("nested %lark", 'start: "x" %lark { start: A+\nA: "a" }', ["xa", "xaa"], ["x", "xb"]),
    _lark("grammar reference", "start: @sub", unsupported="grammar reference @sub"),
]  # fmt: skip
