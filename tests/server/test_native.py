"""Native endpoints (/generate, /score, /get_model_info, /apply_chat_template), /metrics, and
pages freed when a client walks away mid-stream."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.support.server_process import engine_stats, wait_until_idle

NOISE = {"temperature": 0, "ignore_eos": True}


def _generate(server, **body):
    r = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_text_and_input_ids_agree(server):
    by_text = _generate(server, text="The cat sat", sampling_params={"max_new_tokens": 5, **NOISE})
    ids = httpx.post(
        f"{server.url}/generate",
        json={"text": "The cat sat", "sampling_params": {"max_new_tokens": 0}},
    ).json()["meta_info"]["prompt_tokens"]
    assert ids == by_text["meta_info"]["prompt_tokens"]
    assert len(by_text["output_ids"]) == 5
    assert by_text["meta_info"]["finish_reason"]["type"] == "length"


def test_generate_batch_keeps_order(server):
    out = _generate(server, text=["a b c", "d e"], sampling_params={"max_new_tokens": 2, **NOISE})
    singles = [
        _generate(server, text=t, sampling_params={"max_new_tokens": 2, **NOISE})
        for t in ("a b c", "d e")
    ]
    assert [o["text"] for o in out] == [s["text"] for s in singles]


def test_prefill_only_commits_the_prefix_to_the_cache(server):
    prefix = "A shared document about radix trees and paged attention. " * 4
    first = _generate(server, text=prefix, sampling_params={"max_new_tokens": 0})
    assert first["text"] == "" and first["meta_info"]["completion_tokens"] == 0
    after = _generate(server, text=prefix + "Question?", sampling_params={"max_new_tokens": 1})
    assert after["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] - 16


def test_generate_stream_pieces_make_the_text(server):
    params = {"max_new_tokens": 9, **NOISE}
    whole = _generate(server, text="Stream me", sampling_params=params)
    body = {"text": "Stream me", "sampling_params": params, "stream": True}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert "".join(e["delta"] for e in parsed) == whole["text"] == parsed[-1]["text"]
    assert parsed[-1]["meta_info"]["completion_tokens"] == 9


def test_generate_logprobs(server):
    out = _generate(
        server,
        text="x",
        sampling_params={"max_new_tokens": 3, **NOISE},
        return_logprob=True,
        top_logprobs_num=2,
    )
    assert len(out["meta_info"]["output_token_logprobs"]) == 3
    assert all(len(t) == 2 for t in out["meta_info"]["output_top_logprobs"])


def test_score_is_per_token_and_matches_generation_logprobs(server):
    gen = _generate(
        server,
        text="Once upon",
        sampling_params={"max_new_tokens": 3, **NOISE},
        return_logprob=True,
    )
    r = httpx.post(
        f"{server.url}/score",
        json={"prompt": "Once upon", "continuations": [gen["output_ids"], " a time", "x"]},
    )
    assert r.status_code == 200, r.text
    scores = r.json()
    assert len(scores["token_logprobs"][0]) == 3
    # SGLang's triples: [logprob, token id, text]
    generated = [t[0] for t in gen["meta_info"]["output_token_logprobs"]]
    assert scores["token_logprobs"][0] == pytest.approx(generated, abs=1e-3)
    assert [t[1] for t in gen["meta_info"]["output_token_logprobs"]] == gen["output_ids"]
    assert scores["logprobs"][2] == pytest.approx(sum(scores["token_logprobs"][2]))


def test_model_info_and_template_render(server):
    info = httpx.get(f"{server.url}/get_model_info").json()
    assert info["has_chat_template"] and info["context_length"] == 4096 and info["radix_cache"]
    msgs = [{"role": "user", "content": "hi"}]
    r = httpx.post(
        f"{server.url}/apply_chat_template", json={"messages": msgs, "add_generation_prompt": True}
    )
    assert r.json()["text"].endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def _metrics(server) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_count_requests_tokens_and_cache(server):
    _generate(server, text="metrics one", sampling_params={"max_new_tokens": 4, **NOISE})
    before = _metrics(server)
    _generate(server, text="metrics one", sampling_params={"max_new_tokens": 4, **NOISE})
    after = _metrics(server)
    key = 'sgl_requests_total{endpoint="/generate",status="200"}'
    assert after[key] == before[key] + 1
    assert after["sgl_generation_tokens_total"] == before["sgl_generation_tokens_total"] + 4
    assert after["sgl_cached_prompt_tokens_total"] >= before["sgl_cached_prompt_tokens_total"]
    assert 0 < after["sgl_cache_hit_rate"] <= 1
    for name in (
        "sgl_queue_length",
        "sgl_running_requests",
        "sgl_in_flight_requests",
        "sgl_request_duration_seconds_count",
        "sgl_rejected_busy_total",
    ):
        assert name in after
    assert "# TYPE sgl_requests_total counter" in httpx.get(f"{server.url}/metrics").text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/generate"])
def test_disconnect_mid_stream_aborts_and_frees_pages(server, path):
    wait_until_idle(server.url)
    aborts = engine_stats(server.url)["client_aborts"]
    if path == "/generate":
        body = {
            "text": "never ending",
            "stream": True,
            "sampling_params": {"max_new_tokens": 3000, **NOISE},
        }
    else:
        body = {
            "messages": [{"role": "user", "content": "never ending"}],
            "stream": True,
            "max_tokens": 3000,
            "temperature": 0,
            "ignore_eos": True,
        }
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(6):  # a few tokens in: the request is running
            next(lines)
        running = engine_stats(server.url)
        assert running["running"] == 1
        assert running["pool_used_tokens"] > running["cached_tokens"]
    # the connection is closed: the engine drops the request long before 3000 tokens
    idle = wait_until_idle(server.url, timeout=20)
    assert idle["generated_tokens"] - running["generated_tokens"] < 2000
    deadline = time.monotonic() + 5
    while engine_stats(server.url)["client_aborts"] == aborts and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine_stats(server.url)["client_aborts"] == aborts + 1


SELECT_GRAMMAR = 'start: "SELECT " ("id" | "name") " FROM " ("users" | "orders")'


@pytest.mark.parametrize("field", ["grammar", "lark"])
def test_generate_grammar_field_constrains_the_output(server, field):
    import lark

    out = _generate(
        server,
        text="Query:",
        sampling_params={"max_new_tokens": 30, "temperature": 1, "seed": 2, field: SELECT_GRAMMAR},
    )
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    lark.Lark(SELECT_GRAMMAR, parser="lalr").parse(out["text"])


def test_generate_bad_grammar_is_a_400_naming_the_rule(server):
    r = httpx.post(
        f"{server.url}/generate",
        json={"text": "q", "sampling_params": {"max_new_tokens": 4, "grammar": "start: nope"}},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert "nope" in r.json()["error"]["message"]
