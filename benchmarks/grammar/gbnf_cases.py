"""GBNF grammars of the kinds llama.cpp ships (json, json_arr, c, chess, english, japanese, list,
arithmetic), written here from the dialect's documented semantics, each with sentences it must
accept, texts it must refuse, and an independent oracle (`json.loads`, Python's `ast`, a
regex) for texts generated under the constraint. Used by the GBNF tests and by
`python -m benchmarks.grammar.compare --suite gbnf`."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

_JSON_VALUES = r"""
value   ::= object | array | string | number | literal
literal ::= ("true" | "false" | "null") space
object  ::= "{" space ( member ( "," space member )* )? "}" space
member  ::= string ":" space value
array   ::= "[" space ( value ( "," space value )* )? "]" space
string  ::= "\"" ( plain | "\\" ( ["\\/bfnrt] | "u" hex hex hex hex ) )* "\"" space
plain   ::= [^"\\\x00-\x1F\x7F]
hex     ::= [0-9a-fA-F]
number  ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]{1,3} )? space
# at most one newline and a short indent between tokens
space   ::= | " " | "\n" [ \t]{0,16}
"""

JSON = "root ::= object\n" + _JSON_VALUES

JSON_ARR = (
    "# a JSON array at the top\n"
    'root ::= "[" space ( value ( "," space value )* )? "]" space\n' + _JSON_VALUES
)

C = r"""
# a small C: functions with declarations, statements and expressions
root       ::= (function space)+
function   ::= type " " ident "(" params? ")" space block
params     ::= type " " ident ("," space type " " ident)*
type       ::= ("int" | "void" | "char" | "long" | "double") "*"*
block      ::= "{" space (statement space)* "}"
statement  ::= decl ";" | expr ";" | "return" (" " expr)? ";" | block
             | "if" space "(" expr ")" space statement (space "else" space statement)?
             | "while" space "(" expr ")" space statement
decl       ::= type " " ident (space "=" space expr)?
expr       ::= unary (space binop space unary)*
unary      ::= ("-" | "!" | "*" | "&")? primary
primary    ::= ident | number | ident "(" (expr ("," space expr)*)? ")" | "(" expr ")"
binop      ::= "+" | "-" | "*" | "/" | "==" | "!=" | "<" | ">" | "<=" | ">=" | "&&" | "||" | "="
ident      ::= [a-zA-Z_] [a-zA-Z0-9_]*
number     ::= [0-9]+
space      ::= [ \t\n]*
"""

CHESS = r"""
# numbered rounds of standard algebraic notation
root    ::= round (" " round){0,9}
round   ::= [1-9] [0-9]? ". " move " " move
move    ::= (pawn | piece | castle) check?
pawn    ::= (file "x")? square promote?
piece   ::= [KQRBN] file? rank? "x"? square
castle  ::= "O-O" ("-O")?
promote ::= "=" [QRBN]
check   ::= [+#]
square  ::= file rank
file    ::= [a-h]
rank    ::= [1-8]
"""

ENGLISH = r"""
# sentences of plain English words
root     ::= sentence (" " sentence)*
sentence ::= capital word-rest? (","? " " word)* [.!?]
word     ::= [a-zA-Z]+ ("'" [a-z]+)?
word-rest ::= [a-z]+ ("'" [a-z]+)?
capital  ::= [A-Z]
"""

JAPANESE = r"""
# sentences of kana and kanji, each ending with a full stop
root     ::= sentence+
sentence ::= (kana | kanji)+ ("、" (kana | kanji)+)* "。"
kana     ::= [ぁ-ゖァ-ヺー]
kanji    ::= [\u4e00-\u9fff]
"""

LIST = r"""
# a bulleted list, one item per line
root ::= item+
item ::= "- " [^\n]+ "\n"
"""

ARITHMETIC = r"""
# equations over integers and names, one per line; left recursion on purpose
root    ::= line+
line    ::= sum " = " sum "\n"
sum     ::= product | sum space? [+-] space? product
product ::= atom | product space? [*/] space? atom
atom    ::= integer | name | "(" sum ")"
integer ::= "-"? [0-9]+
name    ::= [a-z] [a-z0-9_]*
space   ::= " "
"""


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _json_array(text: str) -> bool:
    try:
        return isinstance(json.loads(text), list)
    except ValueError:
        return False


def _equations(text: str) -> bool:
    if not text.endswith("\n"):
        return False
    for line in text[:-1].split("\n"):
        sides = line.split(" = ")
        if len(sides) != 2:
            return False
        for side in sides:
            try:
                ast.parse(side, mode="eval")
            except SyntaxError:
                return False
    return True


def _regex(pattern: str) -> Callable[[str], bool]:
    compiled = re.compile(pattern)
    return lambda text: compiled.fullmatch(text) is not None


def _c_like(text: str) -> bool:
    """Balanced braces and parentheses, every function has a body: the shape the grammar
    promises (a necessary condition)."""
    depth = {"(": 0, "{": 0}
    pairs = {")": "(", "}": "{"}
    for ch in text:
        if ch in depth:
            depth[ch] += 1
        elif ch in pairs:
            depth[pairs[ch]] -= 1
            if depth[pairs[ch]] < 0:
                return False
    return depth == {"(": 0, "{": 0} and text.rstrip().endswith("}")


_SENTENCE = r"[A-Z]([a-z]+('[a-z]+)?)?(,? [a-zA-Z]+('[a-z]+)?)*[.!?]"
_SAN = r"(([a-h]x)?[a-h][1-8](=[QRBN])?|[KQRBN][a-h]?[1-8]?x?[a-h][1-8]|O-O(-O)?)[+#]?"


@dataclass(slots=True)
class GbnfCase:
    name: str
    grammar: str
    accept: list[str]
    refuse: list[str]
    oracle: Callable[[str], bool]
    recursive: bool = True
    extra: dict = field(default_factory=dict)


CASES: dict[str, GbnfCase] = {
    c.name: c
    for c in [
        GbnfCase(
            "json",
            JSON,
            ['{"a": 1, "b": [true, null, "x"]}', '{\n  "k": {"n": -0.5e3}}', "{}"],
            ['{"a" 1}', "[1]", '{"a": 01}', '{"a": "\\q"}'],
            _json_object,
        ),
        GbnfCase(
            "json_arr",
            JSON_ARR,
            ['[1, 2, {"x": "y"}]', "[]", '[[], [[]], "é"]'],
            ["{}", "[1,]", "[1 2]"],
            _json_array,
        ),
        GbnfCase(
            "c",
            C,
            [
                "int main() {\n  int x = 1;\n  return x + 2;\n}",
                "void f(int a, char* b) {if (a) {g(b);} else return;}",
            ],
            ["int main() { return 1 }", "main() {}", "int f() { x = ; }"],
            _c_like,
        ),
        GbnfCase(
            "chess",
            CHESS,
            ["1. e4 e5 2. Nf3 Nc6 3. Bb5 a6", "1. d4 Nf6 2. c4 e6 3. Nc3 Bb4+", "12. O-O O-O-O"],
            ["1. e9 e5", "1. e4", "1.e4 e5", "1. Zf3 e5"],
            _regex(rf"[1-9][0-9]?\. {_SAN} {_SAN}( [1-9][0-9]?\. {_SAN} {_SAN}){{0,9}}"),
            recursive=False,
        ),
        GbnfCase(
            "english",
            ENGLISH,
            ["The cat sat on the mat.", "It's late, isn't it? Yes!"],
            ["the cat.", "The cat", "The  cat."],
            _regex(rf"{_SENTENCE}( {_SENTENCE})*"),
            recursive=False,
        ),
        GbnfCase(
            "japanese",
            JAPANESE,
            ["今日は良い天気です。", "こんにちは、世界。カタカナ。"],
            ["hello。", "今日は", "、です。"],
            _regex(r"([ぁ-ゖァ-ヺー\u4e00-\u9fff]+(、[ぁ-ゖァ-ヺー\u4e00-\u9fff]+)*。)+"),
            recursive=False,
        ),
        GbnfCase(
            "list",
            LIST,
            ["- apples\n- pears and plums\n", "- one\n"],
            ["- one", "* one\n", "-one\n"],
            _regex(r"(- [^\n]+\n)+"),
            recursive=False,
        ),
        GbnfCase(
            "arithmetic",
            ARITHMETIC,
            ["x = 1 + 2*y\n", "(a - b) * c = -4 / d\nz = z\n"],
            ["x = \n", "x = 1 +\n", "x = (1\n", "1 + 2\n"],
            _equations,
        ),
    ]
}
