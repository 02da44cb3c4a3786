"""Check, as a user would, that a server obeys every structured-output field clients send.

Run: .venv/bin/python -m benchmarks.serving.structured_output [--url URL (a running server)]
     [--model PATH (when starting one; the default model when omitted)] [--max-tokens 48]

Each row is one request shape (OpenAI's `response_format` and `logit_bias`, vLLM's `guided_*`
and `structured_outputs`, SGLang's `/generate` fields, ours), sent through the `openai` client
(`/v1`) or httpx (`/generate`). Its output is checked against the field with `jsonschema`, `re`
(prefix matches for outputs cut by max_tokens), the choices, the tag structure or the biased
token. "obeyed" is the verdict; a 4xx is "refused", an output that does not obey is "IGNORED".
The checkers are also the ones tests/server/test_structured_output.py uses.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonschema
import regex as partial_re

Check = Callable[[str, str], None]  # (text, finish_reason) -> None, raising when disobeyed

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "n"],
}
REGEX = r"(red|blue|green)-[0-9]{2,4}"
CHOICES = ["alpha", "beta", "gamma"]
# a GBNF grammar (several rules, alternation, a class, a bounded repeat) and the same language
# as a Python regex, to check outputs with `re`
GBNF = 'root ::= greeting " " name\ngreeting ::= "hi" | "hello"\nname ::= [A-Z] [a-z]{1,3}\n'
GBNF_AS_REGEX = r"(hi|hello) [A-Z][a-z]{1,3}"
LARK = 'start: ("hi" | "hello") " " /[A-Z][a-z]{1,3}/'
# a tag's content: short, so that tags fit in a few tokens (a number could run to 17 digits)
TAG_SCHEMA = {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}
# the trigger is one token of SmolLM2's vocabulary (id 4350): a +100 bias on it makes free
# text fire it at once, and (the JSON mask forbidding it inside the tag) again after each end.
# No proper prefix of it is also a suffix, so no occurrence can overlap the next.
TRIGGER = "call"
TAG_BIAS = {"4350": 100}
BIASED_TOKEN = 42561  # "qq"
SGLANG_TAG = {
    "structures": [{"begin": "call(", "schema": TAG_SCHEMA, "end": ")"}],
    "triggers": [TRIGGER],
}
XGRAMMAR_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": [TRIGGER],
        "tags": [
            {
                "type": "tag",
                "begin": "call(",
                "content": {"type": "json_schema", "json_schema": TAG_SCHEMA},
                "end": ")",
            }
        ],
    },
}


# ---- checkers ------------------------------------------------------------------------------
def obeys_schema(schema: dict[str, Any]) -> Check:
    def check(text: str, finish: str) -> None:
        if finish == "stop":
            jsonschema.validate(json.loads(text), schema)
        else:  # cut by max_tokens
            assert text.startswith("{"), text

    return check


def is_object(text: str, finish: str) -> None:
    if finish == "stop":
        assert isinstance(json.loads(text), dict), text
    else:
        assert text.startswith("{"), text


def matches(pattern: str) -> Check:
    def check(text: str, finish: str) -> None:
        if finish == "stop":
            assert re.fullmatch(pattern, text), text
        else:  # cut by max_tokens: a prefix of a match
            assert partial_re.fullmatch(pattern, text, partial=True), text

    return check


def one_of(choices: list[str]) -> Check:
    def check(text: str, finish: str) -> None:
        assert text in choices if finish == "stop" else any(c.startswith(text) for c in choices)

    return check


def tagged(begin: str, end: str, schema: dict[str, Any], trigger: str = TRIGGER) -> Check:
    """Free text in which each trigger starts `begin` + a JSON value valid for `schema` +
    `end`; at least one tag (the bias fires the trigger); only the last may be cut short."""

    def check(text: str, finish: str) -> None:
        at, tags = 0, 0
        while (start := text.find(trigger, at)) >= 0:
            rest = text[start:]
            try:
                assert rest.startswith(begin), rest
                value, stop = json.JSONDecoder().raw_decode(text, start + len(begin))
                assert text.startswith(end, stop), text[stop:]
            except (AssertionError, ValueError):
                if finish == "length" and len(rest) < len(begin) + 12:
                    break  # the last tag, cut by max_tokens
                raise
            jsonschema.validate(value, schema)
            at, tags = stop + len(end), tags + 1
        assert tags >= 1, text

    return check


TAG_CHECK = tagged("call(", ")", TAG_SCHEMA)


# ---- the request shapes --------------------------------------------------------------------
@dataclass(slots=True)
class Shape:
    name: str  # who sends it, and the field
    endpoint: str  # "chat", "completions" or "generate"
    fields: dict[str, Any]
    check: Check | None = None  # None: check the output ids (logit_bias rows)
    ids_check: Callable[[list[int]], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _all_biased(ids: list[int]) -> None:
    assert ids and all(t == BIASED_TOKEN for t in ids), ids


V1 = [
    ("OpenAI response_format json_schema",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}},
     obeys_schema(SCHEMA)),
    ("OpenAI response_format json_object", {"response_format": {"type": "json_object"}},
     is_object),
    ("vLLM guided_json", {"guided_json": SCHEMA}, obeys_schema(SCHEMA)),
    ("vLLM guided_regex", {"guided_regex": REGEX}, matches(REGEX)),
    ("vLLM guided_choice", {"guided_choice": CHOICES}, one_of(CHOICES)),
    ("vLLM guided_grammar (GBNF)", {"guided_grammar": GBNF}, matches(GBNF_AS_REGEX)),
    ("vLLM structured_outputs.json", {"structured_outputs": {"json": SCHEMA}},
     obeys_schema(SCHEMA)),
    ("vLLM structured_outputs.regex", {"structured_outputs": {"regex": REGEX}}, matches(REGEX)),
    ("vLLM structured_outputs.choice", {"structured_outputs": {"choice": CHOICES}},
     one_of(CHOICES)),
    ("vLLM structured_outputs.grammar", {"structured_outputs": {"grammar": GBNF}},
     matches(GBNF_AS_REGEX)),
    ("vLLM structured_outputs.json_object", {"structured_outputs": {"json_object": True}},
     is_object),
    ("vLLM structured_outputs.structural_tag",
     {"structured_outputs": {"structural_tag": json.dumps(XGRAMMAR_TAG)},
      "logit_bias": TAG_BIAS}, TAG_CHECK),
    ("SGLang response_format structural_tag",
     {"response_format": {"type": "structural_tag", **SGLANG_TAG}, "logit_bias": TAG_BIAS},
     TAG_CHECK),
    ("XGrammar response_format structural_tag",
     {"response_format": XGRAMMAR_TAG, "logit_bias": TAG_BIAS}, TAG_CHECK),
    ("ours regex", {"regex": REGEX}, matches(REGEX)),
    ("ours ebnf", {"ebnf": GBNF}, matches(GBNF_AS_REGEX)),
    ("ours json_schema", {"json_schema": SCHEMA}, obeys_schema(SCHEMA)),
]  # fmt: skip
NATIVE = [
    ("SGLang json_schema", {"json_schema": json.dumps(SCHEMA)}, obeys_schema(SCHEMA)),
    ("SGLang regex", {"regex": REGEX}, matches(REGEX)),
    ("SGLang ebnf (GBNF)", {"ebnf": GBNF}, matches(GBNF_AS_REGEX)),
    ("SGLang structural_tag",
     {"structural_tag": json.dumps(SGLANG_TAG), "logit_bias": TAG_BIAS}, TAG_CHECK),
    ("XGrammar structural_tag", {"structural_tag": XGRAMMAR_TAG, "logit_bias": TAG_BIAS},
     TAG_CHECK),
    ("ours lark", {"lark": LARK}, matches(GBNF_AS_REGEX)),
]  # fmt: skip


def shapes() -> list[Shape]:
    out = []
    for endpoint in ("chat", "completions"):
        out += [Shape(f"{name} ({endpoint})", endpoint, f, c) for name, f, c in V1]
    out += [Shape(f"{name} (/generate)", "generate", f, c) for name, f, c in NATIVE]
    bias = {"logit_bias": {str(BIASED_TOKEN): 100}}
    out += [
        Shape(f"OpenAI logit_bias +100 ({e})", e, bias, ids_check=_all_biased)
        for e in ("chat", "completions", "generate")
    ]
    return out


# ---- sending them --------------------------------------------------------------------------
def _send(url: str, shape: Shape, max_tokens: int) -> tuple[int, str, str, list[int]]:
    """(status, text, finish_reason, output ids (generate only; [] elsewhere))."""
    greedy = {"temperature": 0}
    if shape.endpoint == "generate":
        params = {"max_new_tokens": max_tokens, **greedy, **shape.fields}
        if shape.ids_check is not None:
            params["ignore_eos"] = True
        r = httpx.post(
            f"{url}/generate", json={"text": "Answer:", "sampling_params": params}, timeout=300
        )
        if r.status_code != 200:
            return r.status_code, r.text, "", []
        body = r.json()
        return 200, body["text"], body["meta_info"]["finish_reason"]["type"], body["output_ids"]
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    typed = {k: v for k, v in shape.fields.items() if k in ("response_format", "logit_bias")}
    extra = {k: v for k, v in shape.fields.items() if k not in typed}
    if shape.ids_check is not None:
        extra["ignore_eos"] = True
    try:
        if shape.endpoint == "chat":
            out = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Answer."}],
                max_tokens=max_tokens, extra_body=extra, **greedy, **typed,
            )  # fmt: skip
            choice = out.choices[0]
            text, finish = choice.message.content or "", choice.finish_reason
        else:
            out = client.completions.create(
                model=model, prompt="Answer:", max_tokens=max_tokens,
                extra_body={**extra, **typed}, **greedy,
            )  # fmt: skip
            text, finish = out.choices[0].text, out.choices[0].finish_reason
    except openai.APIStatusError as exc:
        return exc.status_code, str(exc), "", []
    return 200, text, finish, []


def verdict(url: str, shape: Shape, max_tokens: int) -> tuple[str, str, str]:
    status, text, finish, ids = _send(url, shape, max_tokens)
    if status != 200:
        return f"refused ({status})", "", text[:60]
    try:
        if shape.ids_check is not None:
            if shape.endpoint == "generate":
                shape.ids_check(ids)
            else:  # the token's text, max_tokens times
                from transformers import AutoTokenizer

                from runtime.default_model import ensure_default_model

                tok = AutoTokenizer.from_pretrained(str(ensure_default_model()))
                assert text == tok.decode([BIASED_TOKEN] * max_tokens), text
        else:
            assert shape.check is not None
            shape.check(text, finish)
    except (AssertionError, ValueError, jsonschema.ValidationError):
        return "IGNORED", finish, text[:60]
    return "obeyed", finish, text[:60]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None, help="a running server (else one is started)")
    p.add_argument("--model", default=None, help="model folder (default model when omitted)")
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args()
    proc = None
    if args.url is None:
        from benchmarks.serving.server import start_server

        args.max_queue, args.max_running, args.num_threads = 64, 8, None
        proc = start_server(args)
    try:
        rows = [(s.name, *verdict(args.url, s, args.max_tokens)) for s in shapes()]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    width = max(len(r[0]) for r in rows)
    print(f"{'request shape':<{width}}  {'verdict':<13} {'finish':<7} output")
    for name, v, finish, text in rows:
        print(f"{name:<{width}}  {v:<13} {finish or '-':<7} {text!r}")
    obeyed = sum(r[1] == "obeyed" for r in rows)
    print(f"\n{obeyed} of {len(rows)} obeyed; {len(rows) - obeyed} refused or ignored")
    sys.exit(0 if obeyed == len(rows) else 1)


if __name__ == "__main__":
    main()
