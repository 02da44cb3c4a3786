"""XGrammar's dialects, feature by feature: accept / refuse cases written from its documentation
(docs/defining_structures/ebnf_grammar.md, docs/structural_tag/*.md, the format classes of
python/xgrammar/structural_tag.py), for `--suite dialects` of `benchmarks.grammar.compare` and
the tests in tests/grammar/test_xgrammar_dialects.py.

Each case: a feature name, the kind ("ebnf": grammar text; "structural": a structural tag), the
source, texts it accepts and texts it refuses; `unsupported` names the word our GrammarError
carries for a feature we refuse by name (token-level forms, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class DialectCase:
    feature: str
    kind: str  # "ebnf" | "structural"
    source: object
    accept: tuple[str, ...] = ()
    refuse: tuple[str, ...] = ()
    unsupported: str = ""  # a word of the GrammarError when we refuse the feature by name
    notes: dict = field(default_factory=dict)


# DeepSeek's tool-call tokens: added tokens (ids 128806, 128807, 128808, 128809) the tests'
# tokenizer encodes from their text
BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"


def _st(fmt: dict) -> dict:
    return {"type": "structural_tag", "format": fmt}


def _const(value: str) -> dict:
    return {"type": "const_string", "value": value}


ARGS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}

EBNF_CASES = [
    DialectCase(
        "ebnf: repetition range with spaces",
        "ebnf",
        'root ::= [a-z] {2, 3} ("," [0-9]) {0,2}',
        ("ab", "abc", "ab,1,2"),
        ("a", "abcd", "ab,1,2,3"),
    ),
    DialectCase(
        "ebnf: {n,} and {n}",
        "ebnf",
        'root ::= "a"{2,} "b"{3}',
        ("aabbb", "aaaaabbb"),
        ("abbb", "aabb"),
    ),
    DialectCase(
        "ebnf: [^] and escapes",
        "ebnf",
        'root ::= "<" [^]* ">" [\\u4e00-\\u9fff] "\\x41" "\\e"',
        ("<a\nb>中A\x1b",),
        ("<a>xA\x1b",),
    ),
    DialectCase(
        "ebnf: Regex builtin",
        "ebnf",
        'root ::= "ID-" Regex("[0-9]{5}")',
        ("ID-12345",),
        ("ID-1234", "ID-123456"),
    ),
    DialectCase(
        "ebnf: Regex flags",
        "ebnf",
        'root ::= Regex("hello, world.", flags="is")',
        ("HeLLo, World\n", "hello, world!"),
        ("hello world!",),
    ),
    DialectCase(
        "ebnf: Regex json_string",
        "ebnf",
        'root ::= "\\"" Regex("\\\\S+", json_string=true) "\\""',
        ('"abc"',),
        ('"a"b"', '"a\\b"'),
    ),
    DialectCase(
        "ebnf: Substring",
        "ebnf",
        'root ::= "[" Substring("abc", "de", "fg") "]"',
        ("[]", "[abc]", "[abcde]", "[defg]", "[abcdefg]"),
        ("[ab]", "[cde]", "[abcfg]"),
    ),
    DialectCase(
        "ebnf: TagDispatch loop",
        "ebnf",
        'root ::= TagDispatch(("<tool_call>", call), ("<code>", code))\n'
        'call ::= "{" [^}]* "}" "</tool_call>"\n'
        'code ::= "```" [^`]* "```"',
        (
            'I will call a tool. <tool_call>{"name": "x"}</tool_call> Done.',
            "no tool call at all",
            "<code>```print(1)```<tool_call>{}</tool_call>",
            "trailing <tool_ca",
        ),
        ("<tool_call>no brace", "<code>``"),
    ),
    DialectCase(
        "ebnf: TagDispatch once, excludes",
        "ebnf",
        'root ::= body "</answer>"\n'
        'body ::= TagDispatch(("<t>", t), loop_after_dispatch=false, excludes=("</answer>",))\n'
        't ::= "X"',
        ("hi</answer>", "hi<t>X</answer>"),
        ("hi<t>X more</answer>", "a</answer>b</answer>"),
    ),
    DialectCase(
        "ebnf: lookahead assertion",
        "ebnf",
        'root ::= item ("," item)* ";"\nitem ::= [a-z]+ (= [,;])',
        ("ab,c;",),
        ("ab,;", "ab"),
    ),
    DialectCase(
        "ebnf: rule option capture",
        "ebnf",
        'root ::= item ("," item)*\nitem[capture="number"] ::= [0-9]+',
        ("1,22,333",),
        ("1,,2",),
    ),
    DialectCase(
        "ebnf: left recursion",
        "ebnf",
        'root ::= root "+" n | n\nn ::= [0-9]+',
        ("1+22+3",),
        ("1++2",),
    ),
    DialectCase(
        "ebnf: Token builtin",
        "ebnf",
        "root ::= Token(128806) [a-z]+ Token(128807, 128809)",
        (f"{BEGIN}abc{END}", f"{BEGIN}x{CALL_END}"),
        ("abc", f"{BEGIN}abc", f"{BEGIN}{END}", f"{BEGIN}abc{BEGIN}"),
    ),
    DialectCase(
        "ebnf: ExcludeToken builtin",
        "ebnf",
        "root ::= ExcludeToken(128807)+ Token(128807)",
        (f"hello world{END}", f"{BEGIN}{END}"),
        (END, f"hi{END}x", "hi"),
    ),
    DialectCase(
        "ebnf: TokenTagDispatch",
        "ebnf",
        'root ::= TokenTagDispatch((128806, call), excludes=(128807,))\ncall ::= "{" [a-z]* "}"',
        ("free text", f"text{BEGIN}{{ab}} more{BEGIN}{{}}"),
        (f"{BEGIN}xy", f"a{END}", f"a{BEGIN}{{ab"),
    ),
    DialectCase(
        "ebnf: rule option max_tokens",
        "ebnf",
        "root ::= r\nr[max_tokens=8] ::= [a-z]+",
        unsupported="max_tokens",
    ),
]

STRUCTURAL_CASES = [
    DialectCase(
        "st: optional / plus / star",
        "structural",
        _st(
            {
                "type": "sequence",
                "elements": [
                    {"type": "optional", "content": _const("x")},
                    {"type": "plus", "content": _const("y")},
                    {"type": "star", "content": _const("z")},
                ],
            }
        ),
        ("y", "xyy", "xyzz"),
        ("x", "z", "xxy"),
    ),
    DialectCase(
        "st: repeat min/max",
        "structural",
        _st({"type": "repeat", "min": 2, "max": 3, "content": _const("ab")}),
        ("abab", "ababab"),
        ("ab", "abababab"),
    ),
    DialectCase(
        "st: repeat unbounded",
        "structural",
        _st(
            {
                "type": "repeat",
                "min": 1,
                "max": -1,
                "content": {"type": "regex", "pattern": "[0-9];"},
            }
        ),
        ("1;", "1;2;3;"),
        ("", "1"),
    ),
    DialectCase(
        "st: tag with several ends",
        "structural",
        _st(
            {
                "type": "tag",
                "begin": "<r>",
                "content": {"type": "any_text"},
                "end": ["</r>", "</a>"],
            }
        ),
        ("<r>hi</r>", "<r>hi</a>"),
        ("<r>hi</x>", "<r>a</r>b</r>"),
    ),
    DialectCase(
        "st: any_text max_chars",
        "structural",
        _st(
            {
                "type": "tag",
                "begin": "<a>",
                "content": {"type": "any_text", "max_chars": 3},
                "end": "</a>",
            }
        ),
        ("<a>abc</a>", "<a>ééé</a>"),
        ("<a>abcd</a>",),
    ),
    DialectCase(
        "st: triggered_tags excludes",
        "structural",
        _st(
            {
                "type": "triggered_tags",
                "triggers": ["<f="],
                "tags": [{"type": "tag", "begin": "<f=a>", "content": _const("1"), "end": "</f>"}],
                "excludes": ["STOP"],
            }
        ),
        ("hi <f=a>1</f> bye",),
        ("hi STOP", "<f=b>1</f>"),
    ),
    DialectCase(
        "st: dispatch loop",
        "structural",
        _st({"type": "dispatch", "rules": [["<t>", _const("X")]], "excludes": ["</a>"]}),
        ("hi<t>Xmore<t>X", "hi<t"),
        ("a</a>", "<t>Y"),
    ),
    DialectCase(
        "st: dispatch once",
        "structural",
        _st({"type": "dispatch", "rules": [["<t>", _const("X")]], "loop": False}),
        ("", "hi<t>X"),
        ("hi<t>Xmore",),
    ),
    DialectCase(
        "st: json_schema max_whitespace_cnt",
        "structural",
        _st(
            {
                "type": "json_schema",
                "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                "max_whitespace_cnt": 2,
            }
        ),
        ('{"a":1}', '{ "a" : 1 }'),
        ('{"a":   1}',),
    ),
    DialectCase(
        "st: qwen_xml",
        "structural",
        _st({"type": "json_schema", "json_schema": ARGS, "style": "qwen_xml"}),
        (
            "<parameter=city>Paris</parameter>",
            "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n",
        ),
        (
            "<parameter=days>3</parameter>",
            "<parameter=city>a</parameter><parameter=days>x</parameter>",
        ),
    ),
    DialectCase(
        "st: qwen_xml_parameter (deprecated)",
        "structural",
        _st({"type": "qwen_xml_parameter", "json_schema": ARGS}),
        ("<parameter=city>Paris</parameter>",),
        ("<parameter=city>Paris</parameter><parameter=x>1</parameter>",),
    ),
    DialectCase(
        "st: minimax_xml",
        "structural",
        _st({"type": "json_schema", "json_schema": ARGS, "style": "minimax_xml"}),
        ('<parameter name="city">Paris</parameter><parameter name="days">4</parameter>',),
        ("<parameter=city>Paris</parameter>",),
    ),
    DialectCase(
        "st: deepseek_xml",
        "structural",
        _st({"type": "json_schema", "json_schema": ARGS, "style": "deepseek_xml"}),
        ('<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>',),
        ('<｜DSML｜parameter name="city" string="maybe">Paris</｜DSML｜parameter>',),
    ),
    DialectCase(
        "st: glm_xml",
        "structural",
        _st({"type": "json_schema", "json_schema": ARGS, "style": "glm_xml"}),
        ("<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>",),
        ("<arg_key>town</arg_key><arg_value>Paris</arg_value>",),
    ),
    DialectCase(
        "st: kimi_k3_xml",
        "structural",
        _st({"type": "json_schema", "json_schema": ARGS, "style": "kimi_k3_xml"}),
        (
            '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
            '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>',
        ),
        ('<|open|>argument key="city" type="number"<|sep|>Paris<|close|>argument<|sep|>',),
    ),
    DialectCase(
        "st: grammar with builtins",
        "structural",
        _st(
            {
                "type": "tag",
                "begin": "<g>",
                "content": {
                    "type": "grammar",
                    "grammar": 'root ::= Regex("[a-c]+") Substring("x", "y")',
                },
                "end": "</g>",
            }
        ),
        ("<g>abx</g>", "<g>cxy</g>"),
        ("<g>abyx</g>",),
    ),
    DialectCase(
        "st: cohere_xml",
        "structural",
        _st({"type": "json_schema", "json_schema": ARGS, "style": "cohere_xml"}),
        (
            '<cofl:value name="city" type="raw">Paris</cofl:value>'
            '<cofl:value name="days" type="json">3</cofl:value>',
            '<cofl:value name="city" type="raw">Paris</cofl:value>',
        ),
        (
            '<cofl:value name="city" type="json">Paris</cofl:value>',
            '<cofl:value name="days" type="json">3</cofl:value>',
        ),
    ),
    DialectCase(
        "st: token format",
        "structural",
        _st({"type": "sequence", "elements": [{"type": "token", "token": 128806}, _const("a")]}),
        (f"{BEGIN}a",),
        ("a", f"{END}a"),
    ),
    DialectCase(
        "st: token by its text",
        "structural",
        _st({"type": "sequence", "elements": [_const("a"), {"type": "token", "token": END}]}),
        (f"a{END}",),
        ("a", f"a{BEGIN}"),
    ),
    DialectCase(
        "st: exclude_token",
        "structural",
        _st(
            {
                "type": "sequence",
                "elements": [
                    {"type": "exclude_token", "exclude_tokens": [128807]},
                    {"type": "token", "token": 128807},
                ],
            }
        ),
        (f"x{END}", f"{BEGIN}{END}"),
        (f"{END}{END}", "x"),
    ),
    DialectCase(
        "st: token tag with any_tokens",
        "structural",
        _st(
            {
                "type": "tag",
                "begin": {"type": "token", "token": BEGIN},
                "content": {"type": "any_tokens"},
                "end": {"type": "token", "token": END},
            }
        ),
        (f"{BEGIN}free text{END}", f"{BEGIN}{END}", f"{BEGIN}{CALL}{END}"),
        (f"{BEGIN}a{END}b", f"a{END}", f"{BEGIN}a"),
    ),
    DialectCase(
        "st: any_tokens max_tokens",
        "structural",
        _st(
            {
                "type": "tag",
                "begin": {"type": "token", "token": BEGIN},
                "content": {"type": "any_tokens", "max_tokens": 2},
                "end": {"type": "token", "token": END},
            }
        ),
        (f"{BEGIN}{CALL}{CALL}{END}", f"{BEGIN}{END}"),
        (f"{BEGIN}{CALL}{CALL}{CALL}{END}",),
    ),
    DialectCase(
        "st: token_triggered_tags",
        "structural",
        _st(
            {
                "type": "token_triggered_tags",
                "trigger_tokens": [BEGIN],
                "tags": [
                    {
                        "type": "tag",
                        "begin": {"type": "token", "token": BEGIN},
                        "content": {"type": "json_schema", "json_schema": ARGS},
                        "end": {"type": "token", "token": END},
                    }
                ],
                "exclude_tokens": [CALL_END],
            }
        ),
        ("no call", f'hi {BEGIN}{{"city":"Paris"}}{END} bye'),
        (f"{BEGIN}{{}}{END}", f"a{CALL_END}", f'{BEGIN}{{"city":"Paris"}}'),
    ),
    DialectCase(
        "st: token_dispatch",
        "structural",
        _st(
            {
                "type": "token_dispatch",
                "rules": [[BEGIN, _const("x")], [128808, _const("y")]],
                "exclude_tokens": [128809],
            }
        ),
        ("text", f"hi{BEGIN}x more{CALL}y"),
        (f"{BEGIN}y", f"a{CALL_END}"),
    ),
    DialectCase(
        "st: any_text max_tokens",
        "structural",
        _st({"type": "any_text", "max_tokens": 8}),
        unsupported="max_tokens",
    ),
]

CASES = EBNF_CASES + STRUCTURAL_CASES
