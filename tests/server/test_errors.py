"""Bad input gets an OpenAI-style error body with the right status, and the server lives on."""

from __future__ import annotations

import httpx
import pytest

USER = [{"role": "user", "content": "hi"}]
LONG_PROMPT = "hello " * 5000  # > the tiny model's 4096-token context


@pytest.fixture(scope="module")
def model(server):
    return httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]


CASES = [
    # (path, body (dict, or raw text), status, code, words the message must contain)
    pytest.param(
        "/v1/chat/completions", "{bad json", 400, "invalid_json", "JSON", id="malformed-json"
    ),
    pytest.param(
        "/v1/chat/completions",
        "[1, 2]",
        400,
        "invalid_json",
        "JSON object",
        id="body-not-an-object",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": "gpt-9", "messages": USER},
        404,
        "model_not_found",
        "gpt-9",
        id="unknown-model",
    ),
    pytest.param(
        "/v1/completions",
        {"model": "gpt-9", "prompt": "x"},
        404,
        "model_not_found",
        "gpt-9",
        id="unknown-model-completions",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"messages": USER, "max_tokens": 2},
        200,
        None,
        "",
        id="model-omitted-means-the-served-one",
    ),
    pytest.param(  # what the gateway sends in front of a cluster when the client named none
        "/v1/chat/completions",
        {"model": "unknown", "messages": USER, "max_tokens": 2},
        200,
        None,
        "",
        id="the-gateways-unknown-means-the-served-one",
    ),
    pytest.param(  # the gateway in PD mode sends one room per generation for n > 1
        "/v1/chat/completions",
        {
            "messages": USER,
            "n": 2,
            "bootstrap_host": ["127.0.0.1"] * 2,
            "bootstrap_port": [9, 9],
            "bootstrap_room": [1, 2],
        },  # fmt: skip
        400,
        None,
        "one generation per request",
        id="pd-rooms-for-n-2",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": "M", "messages": []},
        422,
        "invalid_value",
        "messages",
        id="no-messages",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": "M", "messages": [{"role": "wizard", "content": "x"}]},
        422,
        "invalid_value",
        "role",
        id="unknown-role",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": "M", "messages": USER, "temperature": 3},
        422,
        "invalid_value",
        "temperature",
        id="temperature-out-of-range",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": "M", "messages": USER, "top_p": 0},
        422,
        "invalid_value",
        "top_p",
        id="top-p-zero",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": "M", "messages": USER, "top_k": 0},
        400,
        None,
        "top_k",
        id="top-k-zero",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": "M", "messages": USER, "n": 0},
        422,
        "invalid_value",
        "n",
        id="n-zero",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": "M", "messages": [{"role": "user", "content": LONG_PROMPT}]},
        413,
        "context_length_exceeded",
        "context",
        id="prompt-longer-than-context",
    ),
    pytest.param(
        "/v1/completions",
        {"model": "M", "prompt": LONG_PROMPT},
        413,
        "context_length_exceeded",
        "4096",
        id="completion-prompt-too-long",
    ),
    pytest.param(
        "/v1/completions", {"model": "M", "prompt": []}, 400, None, "prompt", id="empty-prompt-list"
    ),
    pytest.param(
        "/v1/completions",
        {"model": "M", "prompt": [[7, 99999999]]},
        400,
        "invalid_value",
        "token ids",
        id="token-id-out-of-vocab",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "model": "M",
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "string", "not": {"pattern": "^a"}},
                },
            },
        },
        400,
        "unsupported_schema_keyword",
        "'not'",
        id="unsupported-schema-keyword",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "model": "M",
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                },
            },
        },
        400,
        "unsupported_schema_keyword",
        "uniqueItems",
        id="unsupported-keyword-2",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "model": "M",
            "messages": USER,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"xs": {"type": "array", "uniqueItems": True}},
                        },
                    },
                }
            ],
            "tool_choice": "required",
        },
        400,
        "unsupported_schema_keyword",
        "'uniqueItems'",
        id="tool-parameters-unsupported-keyword",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "model": "M",
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        None,
        "'g'",
        id="tool-choice-names-unknown-function",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "model": "M",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
        400,
        "unsupported_content",
        "image_url",
        id="image-content",
    ),
    pytest.param(
        "/generate",
        {"text": "x", "sampling_params": {"temprature": 0}},
        400,
        None,
        "temprature",
        id="generate-unknown-sampling-param",
    ),
    pytest.param("/generate", {"sampling_params": {}}, 400, None, "text", id="generate-no-prompt"),
    pytest.param(
        "/generate",
        {"text": "x", "sampling_params": {"max_new_tokens": -1}},
        400,
        None,
        "max_new_tokens",
        id="generate-negative-max-new-tokens",
    ),
    pytest.param(
        "/generate",
        {"text": "x", "sampling_params": {"json_schema": {"type": "array", "uniqueItems": True}}},
        400,
        "unsupported_schema_keyword",
        "uniqueItems",
        id="generate-unsupported-keyword",
    ),
    pytest.param(
        "/generate",
        {"text": LONG_PROMPT},
        413,
        "context_length_exceeded",
        "context",
        id="generate-prompt-too-long",
    ),
    pytest.param(
        "/generate",
        {"text": "x", "sampling_params": {"regex": "("}},
        400,
        "invalid_constraint",
        "regex",
        id="generate-bad-regex",
    ),
    pytest.param(
        "/generate",
        {"text": "x", "stream": True, "sampling_params": {"regex": "(?=a)b"}},
        400,
        "invalid_constraint",
        "lookahead",
        id="generate-stream-unsupported-regex",
    ),
    pytest.param(
        "/generate",
        {"text": "x", "sampling_params": {"choices": []}},
        400,
        "invalid_constraint",
        "choices",
        id="generate-empty-choices",
    ),
    pytest.param(
        "/generate",
        {"text": "x", "sampling_params": {"regex": "a", "choices": ["a"]}},
        400,
        None,
        "at most one constraint",
        id="generate-two-constraints",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": "M", "messages": USER, "regex": "(?<=a)b"},
        400,
        "invalid_constraint",
        "regex",
        id="chat-unsupported-regex",
    ),
    pytest.param(
        "/score",
        {"prompt": "x", "continuations": []},
        422,
        "invalid_value",
        "continuations",
        id="score-no-continuations",
    ),
    pytest.param("/nowhere", {}, 404, None, "Not Found", id="unknown-path"),
]


@pytest.mark.parametrize("path, body, status, code, words", CASES)
def test_bad_input_gets_its_status_and_message(server, model, path, body, status, code, words):
    if isinstance(body, dict) and body.get("model") == "M":
        body = {**body, "model": model}
    kw = (
        {"content": body, "headers": {"content-type": "application/json"}}
        if isinstance(body, str)
        else {"json": body}
    )
    r = httpx.post(f"{server.url}{path}", timeout=60, **kw)
    assert r.status_code == status, r.text
    if status == 200:
        return
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"]
    if code is not None:
        assert error["code"] == code
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_error_then_good_request_on_the_same_connection(server, model):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.post("/v1/chat/completions", content="{").status_code == 400
        ok = c.post(
            "/v1/chat/completions", json={"model": model, "messages": USER, "max_tokens": 2}
        )
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2


def test_a_users_mistake_is_answered_without_a_traceback_in_the_log(server, model):
    """A 400 for the user's input is an answer, not a server fault: nothing is logged as an
    exception (Starlette re-raises what its catch-all handler answered)."""
    mark = "Exception in ASGI application"
    before = server.logs(tail=None).count(mark)
    for prompt in ([[7, 99999999]], [[-1]]):
        r = httpx.post(
            f"{server.url}/v1/completions", json={"model": model, "prompt": prompt}, timeout=60
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert server.logs(tail=None).count(mark) == before


def test_stream_request_errors_come_as_status_not_as_a_broken_stream(server, model):
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": LONG_PROMPT}]}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "context_length_exceeded"


def test_schema_check_accepts_automaton_only_shapes() -> None:
    """Shapes with no regex text form (pattern + format, overlapping oneOf) are honoured by
    compile_json_schema, so the server's pre-check must not refuse them."""
    from runtime.server.chat import check_schema

    check_schema({"type": "string", "format": "uri", "pattern": "^mailto:"}, "response_format")
    check_schema(
        {"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "maxLength": 2}]},
        "response_format",
    )
