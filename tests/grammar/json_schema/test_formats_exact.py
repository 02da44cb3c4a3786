"""The exact formats (json-pointer, relative-json-pointer, duration, uri-template, iri,
iri-reference, uri's IP-literal hosts) from their RFC grammars: each case through Python's `re`
on the value regex and on the JSON-content regex, and through a compiled constraint (a token
walk, or the DFA for JSON spellings written by hand); the duration, uri-template and URI / IRI
regexes against independent readings of their grammars on every short string. Property
escapes in patterns: test_pattern_escapes.py."""

from __future__ import annotations

import functools
import ipaddress
import itertools
import json
import random
import re
import string

import pytest

import grammar
from grammar import UnsupportedSchemaError
from grammar.automata.fsm import node_to_lazy_dfa
from grammar.json_schema.formats import FORMAT_REGEXES, FORMAT_VALUE_REGEXES
from grammar.json_schema.schema import json_schema_to_node
from tests.support.json_text import compact
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab
from tests.support.walks import walk


def _cases(fmt: str, valid: list[str], invalid: list[str]) -> list:
    return [pytest.param(fmt, v, True, id=f"{fmt}-ok-{v!r}") for v in valid] + [
        pytest.param(fmt, v, False, id=f"{fmt}-bad-{v!r}") for v in invalid
    ]


# fmt: off
CASES = [
    *_cases(
        "json-pointer",
        ["", "/", "//", "/a~0b~1c", "/~01", "/a b", '/"', "/\\", "/\n\t\x00\x1f", "/\u2028",
         "/😀", "/-", "/0/-/a"],
        ["/~", "/~2", "/~a", "a", "#/a", "~0", "/a~", "/~~0", " /a"],
    ),
    *_cases(
        "relative-json-pointer",
        ["0", "0#", "10/a", "0/", "3//", "1/a~1b", "120/foo/bar"],
        # 0+1/a: index manipulation of the later draft, left out (valid there only)
        ["00", "01", "-1", "+1", "#", "0#/a", "0##", "1 ", "0/~", "", "0+1/a", "\u0663"],
    ),
    *_cases(
        "duration",
        ["P1Y", "P1M", "P1W", "PT1S", "PT1M", "P1DT1H", "P1Y2M3DT4H5M6S", "P0000D", "PT1H2M",
         "P1M2D", "PT36H"],
        # p1d: lower-case designators, left out
        ["PT1H1S", "P1Y1D", "P", "PT", "P1YT", "P1W1D", "P1.5D", "p1d", "P1DT", "PT1M1H",
         "P1H", "P1S", "P1D1Y", "P1WT1H", "P-1D", "P1D ", "PT0,5S"],
    ),
    *_cases(
        "uri-template",
        ["", "{a}", "{+a}", "{#a,b}", "{=a}", "{|a}", "{,a}", "{a:9999}", "{a*}", "{a.b.c}", "{.a}",
         "{%7Ea}", "{a_1}", "a'b", "a%2Fb", "x{a}y{b}z", "\u00a0", "\ue000", "\U0010fffd"],
        ["{a:10000}", "{a:0}", "{a:01}", "{a:1*}", "{a*:1}", "{a.}", "{.}", "{a..b}", "{%7}",
         "{a b}", "{a-b}", "{}", "{{a}}", "}", "{", "{a,}", "{,+a}", "{+}", "a%2", 'a"b',
         "a<b", "a\\b", "a^b", "a`b", "a|b", "a b", "\ufdd0", "\U000e0001", "\x7f", "\u0085",
         "%"],
    ),
    *_cases(
        "iri",
        ["http://ƒøø.ßår/?∂éœ=πîx#πîüx", "http://[::1]", "http://[v1.x]", "http://[V1.x:y]",
         "a:?\ue000", "a:?\U0010fffd", "a:\u00a0", "a:\U000e1000", "http://ex.com:8080",
         "urn:a:b", "file:/etc", "a:", "http://-.~_!$&'()*+,;=:%40:80%2f@ex.com",
         "http://[1::2:3.4.5.6]"],
        ["http://[v1.]", "http://[vg.x]", "http://[::1%25eth0]", "a:\ue000", "a:#\ue000",
         "a:\U000f0000", "a:?\U0010fffe", "a:\ufdd0", "a:\u0080", "a:b c", "ab", "/a",
         "a:\U000e0fff", "http://ex.com:x", "http://[::1", "http://[1::2::3]", "a:%g0",
         "http://[::ffff:01.2.3.4]", "1a:b", "a:\n"],
    ),
    *_cases(
        "iri-reference",
        ["", "//ƒøø", "âππ", "#ƒ", "?q=\ue000", "a:b", "./a:b", "//[::1]:1/x", "//u@h"],
        ["a\ue000", "1:b", "#a#b", "\\a", "[::1]", "//a@b@c", "a b", "//h:p"],
    ),
    *_cases(
        "uri",
        ["ldap://[2001:db8::7]/c=GB?objectClass?one", "http://[::ffff:1.2.3.4]",
         "http://[v7.a]", "http://[::1]:80", "http://087.10.0.1/"],
        ["http://[::ffff:01.2.3.4]", "http://[1:2:3:4:5:6:7:8:9]", "http://[::1]x",
         "a:\u00a0", "http://ƒ", "http:/[::1]"],
    ),
    *_cases("uri-reference", ["//[::1]/a", "//[v1.a]"], ["[::1]", "/[", "a/[::1]"]),
]
# fmt: on


@pytest.mark.parametrize(("fmt", "value", "ok"), CASES)
def test_value_regex(fmt: str, value: str, ok: bool) -> None:
    assert (re.fullmatch(FORMAT_VALUE_REGEXES[fmt], value) is not None) is ok


@pytest.mark.parametrize(("fmt", "value", "ok"), CASES)
def test_json_content_regex(fmt: str, value: str, ok: bool) -> None:
    content = json.dumps(value, ensure_ascii=False)[1:-1]
    assert (re.fullmatch(FORMAT_REGEXES[fmt], content) is not None) is ok


@functools.cache
def _compiled(fmt: str) -> grammar.CompiledGrammar:
    return grammar.compile_json_schema({"type": "string", "format": fmt}, deepseek_vocab())


@pytest.mark.parametrize(("fmt", "value", "ok"), CASES)
def test_compiled_constraint_walk(fmt: str, value: str, ok: bool) -> None:
    ids = deepseek_tokenizer().encode(compact(value), add_special_tokens=False)
    assert walk(_compiled(fmt), ids) is ok


@functools.cache
def _dfa(schema_text: str):
    return node_to_lazy_dfa(json_schema_to_node(json.loads(schema_text)))


def _matches(schema: dict, text: str) -> bool:
    return _dfa(json.dumps(schema)).matches(text.encode())


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        pytest.param(r'"/a\u000a"', True, id="newline-as-u-escape"),
        pytest.param(r'"/a\u000A\n\r"', True, id="control-escapes-upper-hex"),
        pytest.param(r'"/\u0022\""', True, id="quote-both-escapes"),
        pytest.param(r'"/\u005c\u005C\\"', True, id="backslash-all-escapes"),
        pytest.param('"/a\n"', False, id="raw-newline-is-not-json"),
        pytest.param(r'"/\u007e"', False, id="escaped-tilde-alone"),
        pytest.param(r'"/~\u0032"', False, id="escaped-2-after-tilde"),
        # escapes of characters JSON need not escape: left out (valid, not generated)
        pytest.param(r'"/\u0061"', False, id="escaped-letter-left-out"),
        pytest.param(r'"\/"', False, id="escaped-slash-left-out"),
    ],
)
def test_json_pointer_json_spellings(text: str, ok: bool) -> None:
    assert _matches({"type": "string", "format": "json-pointer"}, text) is ok


@pytest.mark.parametrize(
    ("fmt", "max_length", "value", "ok"),
    [
        pytest.param("json-pointer", 4, "/\n~0", True, id="pointer-escapes-count-once"),
        pytest.param("json-pointer", 4, "/ab~0", False, id="pointer-too-long"),
        pytest.param("iri", 4, "a:ƒø", True, id="iri-characters-not-bytes"),
        pytest.param("iri", 4, "a:ƒøø", False, id="iri-too-long"),
        pytest.param("duration", 3, "P1D", True, id="duration-short"),
        pytest.param("uri-template", 4, "{ab}", True, id="template-short"),
    ],
)
def test_formats_under_max_length(fmt: str, max_length: int, value: str, ok: bool) -> None:
    schema = {"type": "string", "format": fmt, "maxLength": max_length}
    assert _matches(schema, compact(value)) is ok


def test_format_with_a_pattern_is_the_product() -> None:
    schema = {"type": "string", "format": "duration", "pattern": "^P[0-9]+D$"}
    assert _matches(schema, '"P12D"')
    assert not _matches(schema, '"P1Y"')
    assert not _matches(schema, '"P1"')


def test_one_of_subtracts_an_exact_format() -> None:
    schema = {
        "oneOf": [
            {"type": "string", "format": "json-pointer"},
            {"type": "string", "pattern": "^/a"},
        ]
    }
    assert _matches(schema, '"/b"')  # a pointer only
    assert _matches(schema, '"/a~"')  # the pattern only
    assert not _matches(schema, '"/a"')  # both


@pytest.mark.parametrize("fmt", ["duration", "relative-json-pointer", "hostname", "time"])
def test_one_of_refuses_to_subtract_a_format_that_leaves_strings_out(fmt: str) -> None:
    schema = {"oneOf": [{"type": "string", "format": fmt}, {"type": "string", "pattern": "^p"}]}
    with pytest.raises(UnsupportedSchemaError, match="oneOf"):
        json_schema_to_node(schema)


def _duration_by_units(text: str) -> bool:
    """RFC 3339 Appendix A said another way: after "P", digit runs each ending in a unit; the
    date units a contiguous run of "YMD" or a lone "W", then optionally "T" and a non-empty
    contiguous run of "HMS"."""
    units = re.findall(r"[0-9]+([YMWDHS])|(T)|(.)", text[1:])
    if not text.startswith("P") or any(u[2] for u in units):
        return False
    letters = "".join(u[0] or u[1] for u in units)
    date, t, time = letters.partition("T")
    if "T" in time or (t and not time) or not (date or time):
        return False
    if date == "W":
        return not t
    return date in "YMD" and time in "HMS"


def test_duration_against_its_units_on_every_short_string() -> None:
    rx = re.compile(FORMAT_VALUE_REGEXES["duration"])
    for n in range(7):
        for tail in itertools.product("TYMWDHS1", repeat=n):
            text = "P" + "".join(tail)
            assert (rx.fullmatch(text) is not None) is _duration_by_units(text), text


def _varname_ok(name: str) -> bool:
    parts = name.split(".")
    return all(re.fullmatch(r"([A-Za-z0-9_]|%[0-9A-Fa-f]{2})+", p) for p in parts)


def _template_by_scanning(text: str) -> bool:
    """RFC 6570 read as a scan: literals outside braces (no space, quote, <>\\^`{|}, a "%"
    only before two hex digits), each "{...}" an optional operator and comma-separated
    varspecs, a varspec a dotted name with a ":1".."9999" prefix or a "*" explode."""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "{":
            end = text.find("}", i)
            if end < 0:
                return False
            body = text[i + 1 : end]
            if body[:1] and body[0] in "+#./;?&=,!@|":
                body = body[1:]
            for spec in body.split(","):
                name, colon, prefix = spec.partition(":")
                if colon and not re.fullmatch(r"[1-9][0-9]{0,3}", prefix):
                    return False
                if not colon and name.endswith("*"):
                    name = name[:-1]
                if not _varname_ok(name):
                    return False
            i = end + 1
        elif c == "%":
            if not re.fullmatch(r"[0-9A-Fa-f]{2}", text[i + 1 : i + 3]):
                return False
            i += 3
        elif c in ' "<>\\^`{|}' or ord(c) <= 0x20 or ord(c) == 0x7F:
            return False
        else:
            i += 1
    return True


def test_uri_template_against_a_scan_on_every_short_string() -> None:
    rx = re.compile(FORMAT_VALUE_REGEXES["uri-template"])
    for n in range(6):
        for chars in itertools.product("{}a.,:1*+%F", repeat=n):
            text = "".join(chars)
            assert (rx.fullmatch(text) is not None) is _template_by_scanning(text), text


_SPLIT = re.compile(r"(([^:/?#]+):)?(//([^/?#]*))?([^?#]*)(\?([^#]*))?(#(.*))?", re.S)
_UNRESERVED_SUB = re.escape(string.ascii_letters + string.digits + "-._~!$&'()*+,;=")


# RFC 3987's ucschar and iprivate, as it lists them
_UCSCHAR = (
    "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"
    + "".join(f"{chr(p << 16)}-{chr(p << 16 | 0xFFFD)}" for p in range(1, 14))
    + "\U000e1000-\U000efffd"
)
_IPRIVATE = "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd"


def _run(more: str = "", ucs: str = "") -> str:
    """A regex of any run of unreserved / sub-delims characters, %XX triplets, `more` and
    the code-point ranges `ucs`."""
    return rf"(%[0-9A-Fa-f]{{2}}|[{_UNRESERVED_SUB}{re.escape(more)}{ucs}])*"


def _host_ok(host: str, ucs: str) -> bool:
    if not host.startswith("["):
        return re.fullmatch(_run(ucs=ucs), host) is not None
    inner = host[1:-1]
    if re.fullmatch(rf"[vV][0-9A-Fa-f]+\.[{_UNRESERVED_SUB}:]+", inner):
        return True
    try:  # ipaddress takes zone ids ("%eth0"), which RFC 3986 does not
        return "%" not in inner and bool(ipaddress.IPv6Address(inner))
    except ValueError:
        return False


def _uri_by_parts(text: str, absolute: bool, iri: bool) -> bool:
    """RFC 3986 read through its Appendix B split into scheme, authority, path, query and
    fragment, each part then checked alone (the IPv6 literal by Python's ipaddress); for an
    IRI (RFC 3987) with ucschar in every part but the scheme and port, iprivate in queries."""
    ucs = _UCSCHAR if iri else ""
    scheme, auth, path, query, frag = _SPLIT.fullmatch(text).group(2, 4, 5, 7, 9)
    if scheme is None and (absolute or ":" in path.split("/")[0]):
        return False  # no scheme, or a relative path whose first segment reads as one
    if scheme is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", scheme):
        return False
    if auth is not None:
        userinfo, _, hostport = auth.rpartition("@")
        if not re.fullmatch(_run(":", ucs), userinfo):
            return False
        if hostport.startswith("["):
            host, bracket, rest = hostport.partition("]")
            if not bracket or (rest and not rest.startswith(":")):
                return False
            host, port = host + bracket, rest[1:]
        else:
            host, _, port = hostport.partition(":")
        if not re.fullmatch("[0-9]*", port) or not _host_ok(host, ucs):
            return False
    query_ucs = ucs + _IPRIVATE if iri else ""
    parts = [(path, ":@/", ucs), (query, ":@/?", query_ucs), (frag, ":@/?", ucs)]
    return all(p is None or re.fullmatch(_run(more, u), p) for p, more, u in parts)


@pytest.mark.parametrize(
    ("fmt", "absolute", "iri"),
    [("uri", True, False), ("uri-reference", False, False), ("iri", True, True),
     ("iri-reference", False, True)],
)  # fmt: skip
def test_uri_against_its_parts_on_short_and_random_strings(
    fmt: str, absolute: bool, iri: bool
) -> None:
    rx = re.compile(FORMAT_VALUE_REGEXES[fmt])
    r = random.Random(3)
    alphabet = "a:/?#@[]1%.vF \u00e9\ue000\U000f0000\ufdd0\U000e0001\x85"
    texts = ["".join(c) for n in range(6) for c in itertools.product("a:/?#@[]1%.", repeat=n)]
    texts += ["".join(r.choices(alphabet, k=r.randint(0, 14))) for _ in range(50000)]
    texts += [f"a://[{''.join(r.choices('0123456789abcdef:.v', k=r.randint(0, 16)))}]:8/x"
              for _ in range(20000)]  # fmt: skip
    for text in texts:
        assert (rx.fullmatch(text) is not None) is _uri_by_parts(text, absolute, iri), text
