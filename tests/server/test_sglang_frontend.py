"""SGLang's own frontend (`sglang==0.5.23` from PyPI, `sglang.RuntimeEndpoint`) against
`python -m runtime.server`: its test programs, and the native API exactly as it calls it.

The programs are examples/sglang_programs.py with `import sglang as sgl`; the checks are
structural (a random tiny model); the heavy run on the default model runs one program of each
kind and prints its answers.
"""

from __future__ import annotations

import json

import httpx
import pytest

from examples.sglang_programs import PROGRAMS
from tests.support.dsl_backends import DEFAULT_MODEL_BUDGET, ON_THE_DEFAULT_MODEL

sgl = pytest.importorskip("sglang", reason="SGLang's frontend is not installed")

# SGLang's frontend runs `num_api_spec_tokens` programs only on API backends: on any
# RuntimeEndpoint (SGLang's own server too) it fails in the client, before any request
SGLANG_CLIENT_ONLY = {"completion_speculative": "RuntimeEndpoint has no is_chat_model"}


@pytest.fixture
def frontend(server):
    sgl.set_default_backend(sgl.RuntimeEndpoint(server.url))
    yield sgl
    sgl.set_default_backend(None)


def _generate(server, **body):
    reply = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.filterwarnings("ignore:Error in stream_executor")
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_sglang_program_against_our_server(name, frontend):
    if name in SGLANG_CLIENT_ONLY:
        with pytest.raises(KeyError):  # the client's worker thread died on AttributeError
            PROGRAMS[name](frontend)
        pytest.xfail(f"SGLang's frontend: {SGLANG_CLIENT_ONLY[name]}")
    PROGRAMS[name](frontend)


def test_frontend_helpers(frontend, server):
    assert frontend.get_server_info()["model_path"]
    frontend.flush_cache()  # POST /flush_cache; raises unless 200
    endpoint = frontend.global_config.default_backend
    assert endpoint.get_model_name() == endpoint.model_info["model_path"]


def test_generate_takes_sglang_sampling_params(server):
    body = {
        "text": "Once upon a time",
        "sampling_params": {
            "max_new_tokens": 4,
            "min_new_tokens": 0,
            "n": 1,
            "stop": [],
            "stop_token_ids": [],
            "stop_regex": [],
            "temperature": 0,
            "top_p": 1.0,
            "top_k": -1,
            "min_p": 0.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "repetition_penalty": 1.0,
            "ignore_eos": True,
            "skip_special_tokens": True,
            "spaces_between_special_tokens": True,
            "no_stop_trim": False,
            "regex": None,
            "json_schema": None,
            "ebnf": None,
            "logit_bias": None,
            "custom_params": None,
            "stream_interval": None,
            "sampling_seed": 3,
        },
        "rid": "req-1",
        "lora_path": None,
        "session_id": None,
    }
    out = _generate(server, **body)
    meta = out["meta_info"]
    assert meta["id"] == "req-1" and meta["completion_tokens"] == 4
    assert meta["finish_reason"] == {"type": "length", "matched": None, "length": 4}
    assert {"prompt_tokens", "cached_tokens"} <= set(meta)


def test_unknown_and_unsupported_fields_are_400(server):
    for params, named in (
        ({"max_new_tokens": 2, "tempreature": 0}, "tempreature"),
        ({"max_new_tokens": 2, "beam_width": 4}, "beam_width"),
    ):
        r = httpx.post(f"{server.url}/generate", json={"text": "x", "sampling_params": params})
        assert r.status_code == 400 and named in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/generate", json={"text": "x", "image_data": "a.png"})
    assert r.status_code == 400 and "text-only" in r.json()["error"]["message"]


def test_n_stop_regex_no_stop_trim(server):
    outs = _generate(
        server, text="Hello", sampling_params={"max_new_tokens": 3, "n": 3, "temperature": 1}
    )
    assert isinstance(outs, list) and len(outs) == 3
    assert all(o["meta_info"]["completion_tokens"] == 3 for o in outs)
    sampling = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
    plain = _generate(server, text="Hello", sampling_params=sampling)["text"]
    sampling["stop_regex"] = [r"[\s\S]{5}", "zzzz"]  # any 5 characters: right after the start
    out = _generate(server, text="Hello", sampling_params=sampling)
    reason = out["meta_info"]["finish_reason"]
    assert reason == {"type": "stop", "matched": plain[:5]} and out["text"] == ""
    assert out["meta_info"]["completion_tokens"] < 40
    kept = _generate(server, text="Hello", sampling_params={**sampling, "no_stop_trim": True})
    assert kept["text"] == plain[:5]
    body = {"text": "Hello", "sampling_params": sampling, "stream": True}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as r:
        events = [json.loads(x[5:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert events[-1]["meta_info"]["finish_reason"]["matched"] == plain[:5]


def test_logprobs_as_select_asks_for_them(server):
    prompt = _generate(server, text="The sky is", sampling_params={"max_new_tokens": 0})
    n_prompt = prompt["meta_info"]["prompt_tokens"]
    outs = _generate(
        server,
        text=["The sky is blue", "The sky is green"],
        sampling_params={"max_new_tokens": 0, "temperature": 0},
        return_logprob=True,
        return_text_in_logprobs=True,
        logprob_start_len=n_prompt - 2,
    )
    for out in outs:
        inputs = out["meta_info"]["input_token_logprobs"]
        assert len(inputs) == out["meta_info"]["prompt_tokens"] - (n_prompt - 2)
        assert all(isinstance(lp, float) and isinstance(t, int) and isinstance(x, str)
                   for lp, t, x in inputs)  # fmt: skip
        assert out["meta_info"]["output_token_logprobs"] == []
    out = _generate(
        server,
        input_ids=[[1, 2, 3, 4]],
        sampling_params={"max_new_tokens": 2, "temperature": 0},
        return_logprob=True,
        top_logprobs_num=2,
        logprob_start_len=0,
    )[0]
    meta = out["meta_info"]
    assert meta["input_token_logprobs"][0] == [None, 1, None]
    assert [len(t) for t in meta["output_top_logprobs"]] == [2, 2]
    assert [t[1] for t in meta["output_token_logprobs"]] == out["output_ids"]


def test_stream_as_sglang_streams(server):
    body = {"text": "Once", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}
    whole = _generate(server, **body)
    with httpx.stream("POST", f"{server.url}/generate", json={**body, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[5:]) for line in lines[:-1]]
    assert all("meta_info" in e for e in events)
    assert events[-1]["text"] == whole["text"]
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))


def test_concate_and_append_request_accepts_unknown_rids(server):
    r = httpx.post(
        f"{server.url}/concate_and_append_request",
        json={"src_rids": ["never-seen-1", "never-seen-2"], "dst_rid": "parent"},
    )
    assert r.status_code == 200 and r.json()["success"] is True


@pytest.mark.heavy
def test_sglang_programs_on_the_default_model(default_server, capsys):
    sgl.set_default_backend(sgl.RuntimeEndpoint(default_server.url))
    answers = {}
    try:
        for name in ON_THE_DEFAULT_MODEL:
            answers[name] = PROGRAMS[name](sgl, budget=DEFAULT_MODEL_BUDGET)
    finally:
        sgl.set_default_backend(None)
    with capsys.disabled():
        for name, facts in answers.items():
            print(f"\n[sglang frontend, default model] {name}: {facts}")


def test_stream_a_batch_and_n(server):
    body = {
        "text": ["Once", "Twice"],
        "sampling_params": {"max_new_tokens": 3, "n": 2, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[5:]) for line in lines[:-1]]
    finals = {e["index"]: e for e in events if e["meta_info"]["finish_reason"]}
    assert sorted(finals) == [0, 1, 2, 3]
    assert all(e["meta_info"]["completion_tokens"] == 3 for e in finals.values())
    assert finals[0]["text"] == finals[1]["text"]  # greedy: both samples of "Once" agree
