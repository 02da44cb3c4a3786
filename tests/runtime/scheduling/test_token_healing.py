"""Token healing in the engine (runtime/scheduling/healing.py): the prompt's end backed off to
where the tokenizer would merge it with what follows, the first tokens made to spell it.

The oracle is the tokenizer's own encoding of the unsplit text: greedy generation from a prompt
cut inside a token, healed, gives the tokens greedy generation gives from the text before that
token (the unsplit prompt), and the text after the cut."""

from __future__ import annotations

import re

import httpx
import pytest

from grammar import compile_regex
from grammar.errors import GrammarError
from runtime import Engine
from runtime.scheduling.constrained import constraint_vocabulary
from runtime.scheduling.detokenize import Detokenizer, special_ids
from runtime.scheduling.healing import HealingMatcher, HealingTable, back_off
from runtime.scheduling.request import Request, SamplingParams
from tests.support.tiny_models import smollm_tokenizer


@pytest.fixture(scope="module")
def vocab():
    return constraint_vocabulary(smollm_tokenizer())


@pytest.fixture(scope="module")
def table(vocab):
    return HealingTable.for_vocab(vocab, special_ids(smollm_tokenizer()))


@pytest.fixture(scope="module")
def engine(model_dir):
    with Engine(model_dir, page_size=4, max_total_tokens=4096, grammar_compile_timeout_s=60) as e:
        yield e


def _ids(text: str) -> list[int]:
    return list(smollm_tokenizer()(text).input_ids)


def _bytes(table: HealingTable, ids: list[int]) -> bytes:
    return b"".join(table.token_bytes(i) for i in ids)


# ---- backing off ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "prefix"),
    [
        pytest.param("The URL is http:", b":", id="url-colon"),
        pytest.param("def comp", b" comp", id="identifier"),
        pytest.param("Answer: ", b" ", id="trailing-space"),
        pytest.param("unbeliev", b"v", id="word-before-suffix"),
        pytest.param("x = 1995", None, id="digits-never-merge"),
        pytest.param("a", None, id="one-token-stays"),
    ],
)
def test_back_off_takes_the_tokens_a_merge_would_cross(table, text, prefix):
    ids = _ids(text)
    kept, healing = back_off(ids, table)
    if prefix is None:
        assert healing is None and kept == ids
        return
    assert healing.prefix == prefix
    assert kept == ids[: -healing.backed_off]
    assert _bytes(table, kept) + prefix == text.encode()


def test_back_off_never_crosses_a_special_token(table):
    im_end = smollm_tokenizer().convert_tokens_to_ids("<|im_end|>")
    ids = [*_ids("Hello"), im_end]
    assert back_off(ids, table) == (ids, None)


def test_back_off_starts_on_a_character_boundary(table):
    ids = _ids("日本語の文")
    kept, healing = back_off(ids, table)
    assert healing is not None
    healing.prefix.decode("utf-8")  # whole characters
    assert _bytes(table, kept) + healing.prefix == "日本語の文".encode()


def test_a_prompt_of_ids_ending_inside_a_character_heals_only_whole_characters(table):
    ids = _ids("日本語の文")
    # drop the last id while it leaves the text ending inside a character
    cut = next(n for n in range(len(ids) - 1, 0, -1)
               if not _decodes(_bytes(table, ids[:n])))  # fmt: skip
    kept, healing = back_off(ids[:cut], table)
    assert healing is None or _decodes(healing.prefix)


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# ---- the matcher ---------------------------------------------------------------------------
def _allowed(matcher: HealingMatcher, table: HealingTable) -> set[int]:
    return {i for i in range(table.size) if matcher.is_allowed(i)}


def test_matcher_allows_tokens_that_spell_or_extend_the_prefix(table, vocab):
    m = HealingMatcher(table, b" comp", None)
    allowed = _allowed(m, table)
    spelled = {i for i in allowed if b" comp".startswith(table.token_bytes(i))}
    extending = allowed - spelled
    assert {_ids(" comp")[0], _ids(" c")[0], _ids(" ")[0]} <= spelled
    assert _ids(" compute")[0] in extending
    assert all(table.token_bytes(i).startswith(b" comp") for i in extending)
    assert not set(vocab.eos_token_ids) & allowed  # no EOS while the prefix is unspelled


def test_matcher_walks_the_prefix_then_frees_the_request(table):
    m = HealingMatcher(table, b" http:", None)
    m.advance(_ids(" http")[0])
    assert m.rest == b":" and not m.is_accepting() and not m.unconstrained
    m.advance(_ids("://")[0])
    assert m.rest == b"" and m.unconstrained and m.is_accepting()


def test_matcher_refuses_a_token_off_the_prefix_and_keeps_its_state(table):
    m = HealingMatcher(table, b":", None)
    with pytest.raises(GrammarError, match="healed prefix"):
        m.advance(_ids("hello")[0])
    assert m.rest == b":"


def test_the_constraint_applies_to_the_text_after_the_prefix(table, vocab):
    inner = compile_regex(r"//[a-z]+", vocab).matcher()
    m = HealingMatcher(table, b":", inner)
    allowed = _allowed(m, table)
    assert _ids("://")[0] in allowed and _ids(":")[0] in allowed
    for i in allowed:
        rest = table.token_bytes(i)[1:]
        assert re.fullmatch(rb"(//?[a-z]*)?", rest), table.token_bytes(i)
    refused = {int(i) for i in table.starting_with(b":")} - allowed
    assert refused and not any(re.fullmatch(rb"(//?[a-z]*)?", table.token_bytes(i)[1:])
                               for i in refused)  # fmt: skip
    m.advance(_ids("://")[0])
    assert not m.is_accepting()  # "//" so far: the regex wants a letter
    assert inner.is_allowed(_ids("example")[0])


class _LeadingSpaceDropper:
    """A tokenizer that, as SentencePiece's do, drops the space a text starts with."""

    pieces = {0: "A", 1: " hello", 2: " world"}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = "".join(self.pieces[i] for i in ids)
        return text[1:] if text.startswith(" ") else text


@pytest.mark.parametrize(
    ("heal", "out", "text"),
    [
        pytest.param(" ", [1, 2], "hello world", id="prefix-a-space"),
        pytest.param(" hel", [1, 2], "lo world", id="prefix-in-a-word"),
        pytest.param(" hello", [1], "", id="only-the-prefix"),
        pytest.param(" hello w", [1], "", id="prefix-not-spelled-yet"),
    ],
)
def test_text_leaves_out_the_prefix_whatever_decoding_does_at_the_start(heal, out, text):
    detok = Detokenizer(_LeadingSpaceDropper(), [])
    req = Request([0], SamplingParams())
    req.output_ids, req.heal_text = out, heal
    assert detok.text(req) == text


# ---- the engine ----------------------------------------------------------------------------
def _split_cases(engine: Engine, table: HealingTable, prompts: list[str], n: int):
    """(unsplit result, m, split text, its head ids) per output token m of each prompt's
    unsplit greedy output (first half) that can be cut where healing backs off to exactly
    the tokens before it (the prompt and the m output tokens before it), at its first such
    cut."""
    for prompt in prompts:
        unsplit = engine.generate(prompt, max_new_tokens=n, temperature=0)
        for m, tok in enumerate(unsplit.token_ids[: n // 2]):
            head = list(unsplit.prompt_token_ids) + unsplit.token_ids[:m]
            piece = table.token_bytes(tok) or b""
            for cut in range(1, len(piece)):
                try:
                    split = (_bytes(table, head) + piece[:cut]).decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if back_off(_ids(split), table)[0] == head:
                    yield unsplit, m, split, head
                    break


def _clean(text: str) -> str:
    """The text before a character a token cut in two (decoded as U+FFFD)."""
    return text.split("\ufffd")[0]


def test_healed_greedy_output_is_the_unsplit_prompts(engine, table):
    n = 8
    prompts = ["The URL is", "def compute(x):\n    return", "Once upon a time"]
    checked = 0
    for unsplit, m, split, head in _split_cases(engine, table, prompts, n):
        healed = engine.generate(split, max_new_tokens=n - m, temperature=0, token_healing=True)
        assert healed.prompt_token_ids == head
        assert healed.token_ids == unsplit.token_ids[m:]
        # the text is what the unsplit output has after the cut
        whole = _bytes(table, list(unsplit.prompt_token_ids) + unsplit.token_ids)
        after_cut = _clean(whole.decode("utf-8", "replace")[len(split) :])
        got = _clean(healed.text)
        assert after_cut.startswith(got) or got.startswith(after_cut)
        checked += 1
    assert checked >= 3


def test_healing_is_off_unless_asked(engine):
    plain = engine.generate("The URL is http:", max_new_tokens=2, temperature=0)
    assert plain.prompt_token_ids == _ids("The URL is http:")


def test_healed_text_leaves_the_prefix_out(engine, table):
    r = engine.generate("The URL is http:", max_new_tokens=4, temperature=0, token_healing=True)
    assert r.prompt_token_ids == _ids("The URL is http")
    first = table.token_bytes(r.token_ids[0])
    assert first.startswith(b":")
    assert r.text == _bytes(table, r.token_ids)[1:].decode("utf-8", "replace")
    assert len(r.token_ids) == 4  # max_new_tokens counts the token that spelled the prefix


@pytest.mark.parametrize(
    ("kw", "check"),
    [
        pytest.param({"regex": r"//(example|test)\.com"}, r"//(example|test)\.com", id="regex"),
        pytest.param(
            {"regex": r"//example\.com/[a-z]{2}"},
            r"//example\.com/[a-z]{2}",
            id="regex-jump-forward",
        ),  # fmt: skip
        pytest.param({"choices": ["//a.org", "//b.net"]}, r"//a\.org|//b\.net", id="choices"),
        pytest.param({"ebnf": 'root ::= "//" [a-z] [a-z] ".io"'}, r"//[a-z]{2}\.io", id="ebnf"),
    ],
)
def test_healing_composes_with_constraints(engine, table, kw, check):
    r = engine.generate(
        "The URL is http:", max_new_tokens=24, temperature=0, token_healing=True, **kw
    )
    assert r.finish_reason == "stop", r
    assert re.fullmatch(check, r.text), r.text
    assert table.token_bytes(r.token_ids[0]).startswith(b":")
    assert r.prompt_token_ids == _ids("The URL is http")


def test_json_schema_after_a_healed_prefix(engine):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = engine.generate(
        "The answer is:", max_new_tokens=24, temperature=0, token_healing=True, json_schema=schema
    )
    assert r.finish_reason == "stop"
    assert re.fullmatch(r'\{"n":\s*-?\d+\}', r.text), r.text


def test_streamed_chunks_add_up_to_the_healed_text(engine):
    kw = dict(max_new_tokens=6, temperature=0, token_healing=True)
    whole = engine.generate("def comp", **kw)
    chunks = list(engine.generate("def comp", stream=True, **kw))
    assert "".join(c.text_delta for c in chunks) == whole.text
    assert chunks[-1].result.text == whole.text


def test_stop_strings_do_not_see_the_prefix(engine):
    r = engine.generate(
        "The URL is http:", max_new_tokens=4, temperature=0, token_healing=True, stop=[":"]
    )
    assert ":" not in r.text
    assert len(r.token_ids) > 1 or r.finish_reason == "length"


def test_a_bad_token_healing_value_names_it(engine):
    with pytest.raises(ValueError, match="token_healing"):
        engine.generate("def comp", max_new_tokens=2, token_healing="yes")


def test_prefill_only_requests_are_not_healed(engine):
    r = engine.generate("def comp", max_new_tokens=0, token_healing=True)
    assert r.prompt_token_ids == _ids("def comp") and r.token_ids == []


# ---- the server's /generate ----------------------------------------------------------------
def test_generate_endpoint_heals_when_asked(server):
    body = {
        "text": "The URL is http:",
        "sampling_params": {"max_new_tokens": 3, "temperature": 0, "token_healing": True},
    }
    healed = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
    body["sampling_params"]["token_healing"] = False
    plain = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
    assert healed["meta_info"]["prompt_tokens"] == plain["meta_info"]["prompt_tokens"] - 1
    assert httpx.get(f"{server.url}/get_model_info", timeout=30).json()["token_healing"] is True


def test_generate_endpoint_refuses_a_bad_token_healing(server):
    body = {"text": "x", "sampling_params": {"token_healing": "on"}}
    reply = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert reply.status_code == 400 and "token_healing" in reply.text


def test_speculative_decoding_keeps_the_healed_output(engine, model_dir):
    spec = Engine(model_dir, page_size=4, max_total_tokens=4096, grammar_compile_timeout_s=60,
                  speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)  # fmt: skip
    try:
        # every proposal verified (this checks the healed masks on drafts, not when drafting pays)
        spec.scheduler.call(lambda: setattr(spec.scheduler.speculation, "cost_aware", False))
        prompt = "x = compute(x)\nx = compute(x)\nx = compute(x)\nx = comp"
        verified = 0
        for kw in ({}, {"regex": r"ute\(x\)\n(x = compute\(x\)\n){2}"}):
            want = engine.generate(prompt, max_new_tokens=24, temperature=0, token_healing=True,
                                   **kw)  # fmt: skip
            got = spec.generate(prompt, max_new_tokens=24, temperature=0, token_healing=True, **kw)
            assert got.token_ids == want.token_ids and got.text == want.text
            verified += got.usage.spec_verify_ct
        assert verified > 0  # drafts were proposed and verified
    finally:
        spec.shutdown()
