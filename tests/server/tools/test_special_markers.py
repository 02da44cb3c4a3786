"""Call and reasoning markers that are special tokens of the tokenizer (Mistral's `[TOOL_CALLS]`,
Llama 3's `<|python_tag|>`, `<think>` / `</think>` where a tokenizer has them as specials):
decoding without special tokens would drop them from the text the parsers read. A tiny random
Qwen2 model with SmolLM2's tokenizer plus these markers as added special tokens (no download):
the detokenizer spells them for requests that keep them, the constraint vocabulary has them as
their text (a strict call's trigger matches the special token), chat answers parse them
(streamed and not) with no raw tag in `content`; plus `/generate`'s reasoning fields and a
streamed call cut by max_tokens."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import httpx
import jsonschema
import pytest

from tests.support.server_process import SMALL_ENGINE, ServerProcess, shared_server
from tests.support.tool_servers import TEMPLATES

MARKERS = ["[TOOL_CALLS]", "<|python_tag|>", "<think>", "</think>"]
ZONE = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": ZONE}}
USER = [{"role": "user", "content": "The time in Oslo?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
_folder: Path | None = None


def marker_tokenizer():
    """SmolLM2's tokenizer with the markers as added special tokens."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from runtime.default_model import ensure_default_model

    tok = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    tok.add_tokens([AddedToken(m, special=True, normalized=False) for m in MARKERS],
                   special_tokens=True)  # fmt: skip
    return tok


def model_dir() -> Path:
    global _folder
    if _folder is None:
        from tests.support.tiny_models import make_tiny_model

        tok = marker_tokenizer()
        folder = Path(tempfile.mkdtemp(prefix="sgl-markers-"))
        make_tiny_model(folder, kind="qwen2", vocab_size=len(tok))
        tok.save_pretrained(folder)
        _folder = folder
    return _folder


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir()))


def _id(tok, marker: str) -> int:
    return tok.convert_tokens_to_ids(marker)


# ---- the detokenizer and the constraint vocabulary --------------------------------------------
def test_markers_are_special_tokens_that_plain_decoding_drops(tok):
    ids = tok("a[TOOL_CALLS] b<|python_tag|>", add_special_tokens=False).input_ids
    assert _id(tok, "[TOOL_CALLS]") in ids and _id(tok, "<|python_tag|>") in ids
    assert "[TOOL_CALLS]" not in tok.decode(ids, skip_special_tokens=True)


def test_detokenizer_spells_the_markers_a_request_keeps(tok):
    from runtime.scheduling.detokenize import Detokenizer

    d = Detokenizer(tok, [tok.eos_token_id])
    assert set(d.markers.values()) == set(MARKERS)  # only these specials, not <|im_end|> &c.
    ids = tok("Hi[TOOL_CALLS] [1]<|python_tag|>x<|im_end|>", add_special_tokens=False).input_ids
    everything = frozenset(d.markers)
    assert d.decode(ids) == tok.decode(ids, skip_special_tokens=True)
    assert d.decode(ids, everything) == "Hi[TOOL_CALLS] [1]<|python_tag|>x"
    only_calls = frozenset([_id(tok, "[TOOL_CALLS]")])
    assert d.decode(ids, only_calls) == "Hi[TOOL_CALLS] [1]x"


def test_constraint_vocabulary_has_the_markers_as_their_text(tok):
    from runtime.scheduling.constrained import constraint_vocabulary

    vocab = constraint_vocabulary(tok)
    for m in MARKERS:
        assert vocab.token_bytes(_id(tok, m)) == m.encode()
    assert vocab.token_bytes(tok.convert_tokens_to_ids("<|im_end|>")) is None  # still special
    assert vocab.token_bytes(tok.eos_token_id) is None


@pytest.fixture(scope="module")
def engine():
    from runtime.engine import Engine

    with Engine(model_dir(), page_size=4, max_total_tokens=4096, num_threads=1) as e:
        yield e


def test_a_constraint_matches_a_marker_on_its_special_token(engine, tok):
    tc = _id(tok, "[TOOL_CALLS]")
    out = engine.generate("Hi", regex=r"\[TOOL_CALLS\] \[1\]", max_new_tokens=12, temperature=0)
    assert out.text == "[TOOL_CALLS] [1]"
    assert tc in out.token_ids  # jump-forward wrote the marker as the tokenizer encodes it
    # without jump-forward the model picks it: the vocabulary lets the special token match
    out = engine.generate("Hi", regex=r"\[TOOL_CALLS\] \[1\]", max_new_tokens=12,
                          temperature=0, jump_forward=False, logit_bias={tc: 100})  # fmt: skip
    assert out.token_ids[0] == tc and out.text == "[TOOL_CALLS] [1]"


def test_unconstrained_text_spells_only_the_kept_markers(engine, tok):
    tc = _id(tok, "[TOOL_CALLS]")
    kw = dict(max_new_tokens=2, temperature=0, logit_bias={tc: 100})
    plain = engine.generate("Hi", **kw)
    assert plain.token_ids == [tc, tc] and plain.text == ""  # as skip_special_tokens does
    kept = engine.generate("Hi", keep_markers=("[TOOL_CALLS]",), **kw)
    assert kept.text == "[TOOL_CALLS][TOOL_CALLS]"


def test_llama3_strict_call_opens_on_the_python_tag_token(engine, tok):
    from runtime.server.protocol import Tool
    from runtime.server.tools.plan import tool_answer_spec
    from runtime.server.tools.registry import get_parser

    parser = get_parser("llama3")
    tools = [Tool.model_validate(TIME)]
    spec = tool_answer_spec(parser, tools, "auto", False, "strict", None)
    tag = _id(tok, "<|python_tag|>")
    out = engine.generate("Hi", **spec.constraint, max_new_tokens=40, temperature=0,
                          logit_bias={tag: 100}, keep_markers=parser.markers)  # fmt: skip
    assert out.token_ids[0] == tag and out.text.startswith("<|python_tag|>{")
    content, calls = parser.parse(out.text, tools)
    assert content is None and len(calls) == 1
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), ZONE)


# ---- through the server: Mistral's format, qwen3 reasoning -----------------------------------
@pytest.fixture(scope="module")
def server():
    template = str(TEMPLATES / "mistral.jinja")
    srv = ServerProcess(model_dir(), *SMALL_ENGINE, "--chat-template", template,
                        "--reasoning-parser", "qwen3")  # fmt: skip
    yield srv
    srv.stop()


def _model(client) -> str:
    return client.models.list().data[0].id


def _ask(client, tok, **kw):
    bias = {str(_id(tok, "[TOOL_CALLS]")): 100}  # the model writes the marker token first
    return client.chat.completions.create(
        model=_model(client), messages=USER, tools=[TIME], max_tokens=40, temperature=0,
        logit_bias=bias, parallel_tool_calls=False, extra_body=NO_THINKING, **kw)  # fmt: skip


def test_a_strict_call_triggered_by_the_special_token_parses(client, tok):
    out = _ask(client, tok, logprobs=True)
    choice = out.choices[0]
    assert choice.logprobs.content[0].token == "[TOOL_CALLS]"  # the special token, not pieces
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), ZONE)


def test_a_streamed_call_triggered_by_the_special_token(client, tok):
    content, args, names, reasons = "", {}, [], []
    for chunk in _ask(client, tok, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            if d.function.name:
                names.append(d.function.name)
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
        reasons.append(chunk.choices[0].finish_reason)
    assert "[TOOL_CALLS]" not in content and not content.strip()
    assert names == ["get_time"] and reasons[-1] == "tool_calls"
    jsonschema.validate(json.loads(args[0]), ZONE)


def test_reasoning_markers_as_special_tokens_stay_out_of_content(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    out = client.chat.completions.create(
        model=_model(client), messages=USER, response_format=fmt, max_tokens=30, temperature=0,
        extra_body={"max_reasoning_tokens": 3})  # fmt: skip
    message = out.choices[0].message
    assert message.reasoning_content is not None  # `<think>` opened, `</think>` forced
    assert "<think>" not in message.content and "</think>" not in message.content
    jsonschema.validate(json.loads(message.content), schema)


def test_a_streamed_call_cut_by_max_tokens_ends_with_length(client):
    kw = dict(model=_model(client), messages=USER, tools=[TIME], tool_choice="required",
              temperature=0, max_tokens=15, extra_body=NO_THINKING)  # fmt: skip
    names, args, reasons = [], "", []
    for chunk in client.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            names += [d.function.name] if d.function.name else []
            args += d.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert names == ["get_time"]  # the call's start was sent as it was decoded
    with pytest.raises(ValueError):
        json.loads(args)  # its arguments stop where max_tokens cut them
    assert reasons[-1] == "length" and "tool_calls" not in reasons
    out = client.chat.completions.create(**kw)
    assert out.choices[0].finish_reason == "length"
    assert not out.choices[0].message.tool_calls  # the unfinished call is not a call


# ---- /generate: raw text unless asked; SGLang's require_reasoning and max_thinking_tokens -----
def _generate(server, **body):
    r = httpx.post(f"{server.url}/generate", json={"text": "Say yes.<think>\n", **body},
                   timeout=120)  # fmt: skip
    return r


def test_generate_keeps_the_raw_text_and_separates_when_asked(server):
    params = {"regex": "(yes|no)", "max_new_tokens": 20, "temperature": 0}
    plain = _generate(server, sampling_params=params).json()
    assert re.fullmatch("(yes|no)", plain["text"])  # the constraint from the first token
    body = dict(sampling_params=params, require_reasoning=True, max_thinking_tokens=3)
    raw = _generate(server, **body).json()
    assert re.fullmatch(r"[\s\S]*</think>(yes|no)", raw["text"])  # the marker kept
    assert "reasoning_text" not in raw
    apart = _generate(server, **body, separate_reasoning=True).json()
    assert re.fullmatch("(yes|no)", apart["text"]) and apart["reasoning_text"] is not None
    assert raw["text"] == apart["reasoning_text"] + "</think>" + apart["text"]
    events = httpx.post(
        f"{server.url}/generate",
        timeout=120,
        json={"text": "Say yes.<think>\n", **body, "separate_reasoning": True, "stream": True},
    )
    last = [json.loads(x[6:]) for x in events.text.splitlines() if x.startswith("data: {")][-1]
    assert last["text"] == apart["text"] and last["reasoning_text"] == apart["reasoning_text"]


def test_generate_reasoning_fields_need_a_reasoning_parser():
    srv = shared_server()  # started without --reasoning-parser
    for field, value in (("separate_reasoning", True), ("require_reasoning", True)):
        r = httpx.post(f"{srv.url}/generate", json={"text": "Hi", field: value}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field
