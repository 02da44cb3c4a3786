"""`grammar.prebuild`: the format automata every schema shares are built once, ahead of the
first compile that needs them, and the engine's constraint hooks run it at start."""

from __future__ import annotations

import pickle
import threading

import pytest

import grammar
from grammar.json_schema import formats
from grammar.json_schema.formats import FORMAT_REGEXES, UNSUPPORTED_FORMATS
from runtime.scheduling.compile_pool import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S
from runtime.scheduling.constrained import ConstraintHooks
from tests.support.json_text import serialise
from tests.support.tokenizers import deepseek_vocab, smollm2_tokenizer

SUPPORTED = sorted(f for f in FORMAT_REGEXES if f not in UNSUPPORTED_FORMATS)
EXAMPLES = {
    "date": "2024-02-29",
    "date-time": "2024-02-29T12:30:00Z",
    "duration": "P1DT2H",
    "email": "ada@example.org",
    "hostname": "example.org",
    "ipv4": "192.168.0.1",
    "ipv6": "::1",
    "iri": "https://é.example/ü",
    "iri-reference": "ü/x",
    "json-pointer": "/a/0",
    "relative-json-pointer": "1/a",
    "time": "12:30:00+01:00",
    "uri": "https://example.org/a?b#c",
    "uri-reference": "../a",
    "uri-template": "/users/{id}",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
}


def _schema_with_every_format() -> dict:
    props = {f"p{i}": {"type": "string", "format": f} for i, f in enumerate(SUPPORTED)}
    return {"type": "object", "properties": props, "required": sorted(props)}


def _refuse_building(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a format automaton was built after prebuild")

    monkeypatch.setattr(formats, "node_to_dfa", refuse)


def _counting_builds(monkeypatch: pytest.MonkeyPatch) -> list:
    built: list = []
    real = formats.node_to_dfa

    def counting(node):
        built.append(node)
        return real(node)

    monkeypatch.setattr(formats, "node_to_dfa", counting)
    return built


def test_after_prebuild_no_compile_builds_a_format_automaton(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    formats.forget_built()  # as in a fresh process
    grammar.prebuild()
    _refuse_building(monkeypatch)
    grammar.clear_caches()  # compiled constraints go; the shared format automata stay
    schema = _schema_with_every_format()
    g = grammar.compile_json_schema(schema, deepseek_vocab())
    values = {f"p{i}": EXAMPLES[f] for i, f in enumerate(SUPPORTED)}
    assert g.dfa.matches(serialise(schema, values).encode())
    values["p0"] = "2023-02-29"  # no such day
    assert not g.dfa.matches(serialise(schema, values).encode())


def test_without_prebuild_the_first_compile_builds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # the check above could pass with nothing shared: without prebuild a compile does build
    formats.forget_built()
    built = _counting_builds(monkeypatch)
    grammar.clear_caches()
    grammar.compile_json_schema(_schema_with_every_format(), deepseek_vocab())
    assert len(built) >= len(SUPPORTED) - 1  # date-time's pieces may be shared with date/time


def test_a_later_process_reads_the_prebuilt_formats_from_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    # the first prebuild builds them and keeps them in the native cache folder; a process
    # after it reads the same automata from there and builds none
    monkeypatch.setenv("SGL_NATIVE_CACHE", str(tmp_path))
    formats.forget_built()
    built = _counting_builds(monkeypatch)
    grammar.prebuild()
    (kept,) = tmp_path.glob("formats-*.pickle")
    assert len(built) >= len(SUPPORTED) - 1
    first = {f: pickle.dumps(formats.format_node(f, None)) for f in SUPPORTED}
    formats.forget_built()
    _refuse_building(monkeypatch)
    grammar.prebuild()
    assert {f: pickle.dumps(formats.format_node(f, None)) for f in SUPPORTED} == first
    grammar.clear_caches()
    schema = _schema_with_every_format()
    g = grammar.compile_json_schema(schema, deepseek_vocab())
    values = {f"p{i}": EXAMPLES[f] for i, f in enumerate(SUPPORTED)}
    assert g.dfa.matches(serialise(schema, values).encode())
    assert kept.exists()


def test_an_unreadable_cache_file_is_built_again(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SGL_NATIVE_CACHE", str(tmp_path))
    formats.forget_built()
    grammar.prebuild()
    (kept,) = tmp_path.glob("formats-*.pickle")
    kept.write_bytes(b"not a pickle")
    formats.forget_built()
    built = _counting_builds(monkeypatch)
    grammar.prebuild()
    assert len(built) >= len(SUPPORTED) - 1
    assert pickle.loads(kept.read_bytes()).keys() == set(SUPPORTED)  # written again


def _hooks() -> ConstraintHooks:
    tokenizer = smollm2_tokenizer()
    return ConstraintHooks(tokenizer, [tokenizer.eos_token_id])


def test_constraint_hooks_prebuild_on_their_grammar_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    called = threading.Event()
    seen: list = []

    def fake_prebuild(vocab=None):
        seen.append((vocab, threading.current_thread().name))
        called.set()

    monkeypatch.setattr(grammar, "prebuild", fake_prebuild)
    monkeypatch.delenv("SGL_GRAMMAR_PREBUILD", raising=False)
    hooks = _hooks()
    try:
        assert called.wait(60)
        vocab, thread = seen[0]
        assert vocab is hooks.vocab()  # the vocabulary requests will use, built once
        assert thread.startswith("sgl-grammar")
    finally:
        hooks.shutdown()


def test_constraint_hooks_skip_prebuild_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []
    monkeypatch.setattr(grammar, "prebuild", lambda vocab=None: seen.append(vocab))
    monkeypatch.setenv("SGL_GRAMMAR_PREBUILD", "0")
    hooks = _hooks()
    hooks._pool.submit(lambda: None).result(60)  # anything queued before this has run
    hooks.shutdown()
    assert seen == []


def test_constraint_hooks_take_their_settings_not_an_engine(monkeypatch) -> None:
    monkeypatch.setenv("SGL_GRAMMAR_PREBUILD", "0")
    tokenizer = smollm2_tokenizer()
    hooks = ConstraintHooks(
        tokenizer, [tokenizer.eos_token_id], json_schema_mode="exact", compile_timeout_s=3.5,
        compile_memory_mb=700,
    )  # fmt: skip
    try:
        assert (hooks.json_schema_mode, hooks.eos_ids) == ("exact", {tokenizer.eos_token_id})
        assert (hooks.compiles.timeout_s, hooks.compiles.memory_mb) == (3.5, 700)
        assert len(hooks.vocab()) == len(tokenizer)  # the vocabulary read from that tokenizer
    finally:
        hooks.shutdown()
    defaults = ConstraintHooks(tokenizer, [])
    try:
        assert defaults.json_schema_mode == "strict"
        assert (defaults.compiles.timeout_s, defaults.compiles.memory_mb) == (
            DEFAULT_TIMEOUT_S, DEFAULT_MEMORY_MB,
        )  # fmt: skip
    finally:
        defaults.shutdown()
