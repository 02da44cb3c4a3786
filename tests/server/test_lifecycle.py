"""Bearer auth, the bounded queue (503 + Retry-After), and graceful SIGTERM, on a server of its
own: `--api-key`, one running request and one waiting at most."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import openai
import pytest

from tests.support.server_process import SMALL_ENGINE, ServerProcess, tiny_model_dir

KEY = "sekret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"max_tokens": 400, "temperature": 0, "ignore_eos": True}


def _started():
    proc = ServerProcess(
        tiny_model_dir(),
        *SMALL_ENGINE,
        "--api-key",
        KEY,
        "--max-queue",
        "1",
        "--max-running-requests",
        "1",
        "--graceful-timeout",
        "2",
    )
    yield proc
    proc.stop()


# the SIGTERM test stops its server, so it gets one of its own; the others share one
server = pytest.fixture(scope="module", name="server")(_started)
own_server = pytest.fixture(name="own_server")(_started)


def _chat_body(**kw):
    return {"messages": [{"role": "user", "content": "hi"}], **kw}


@pytest.mark.parametrize(
    "headers, status",
    [
        pytest.param({}, 401, id="no-header"),
        pytest.param({"Authorization": "Bearer wrong"}, 401, id="wrong-key"),
        pytest.param({"Authorization": KEY}, 401, id="no-bearer-scheme"),
        pytest.param(AUTH, 200, id="right-key"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/get_model_info"])
def test_api_key_guards_every_endpoint(server, headers, status, path):
    r = httpx.get(f"{server.url}{path}", headers=headers)
    assert r.status_code == status
    if status == 401:
        assert r.json()["error"]["code"] == "invalid_api_key"


def test_health_needs_no_key(server):
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_openai_client_with_the_key(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    out = client.chat.completions.create(
        model=client.models.list().data[0].id,
        max_tokens=2,
        messages=[{"role": "user", "content": "x"}],
    )
    assert out.usage.completion_tokens <= 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="bad", max_retries=0).models.list()


def test_full_queue_answers_503_with_retry_after(server):
    results: list[httpx.Response] = []
    lock = threading.Lock()

    def send() -> None:
        r = httpx.post(
            f"{server.url}/v1/chat/completions", json=_chat_body(**LONG), headers=AUTH, timeout=120
        )
        with lock:
            results.append(r)

    threads = [threading.Thread(target=send) for _ in range(5)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    statuses = sorted(r.status_code for r in results)
    # one running + one waiting are admitted; the rest are refused at once
    assert statuses.count(200) >= 2 and statuses.count(503) >= 1, statuses
    assert set(statuses) <= {200, 503}
    refused = next(r for r in results if r.status_code == 503)
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "queue_full"
    assert all(
        r.json()["usage"]["completion_tokens"] == 400 for r in results if r.status_code == 200
    )
    metrics = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    assert f"sgl_rejected_busy_total {statuses.count(503)}" in metrics


def test_sigterm_ends_running_streams_and_exits_zero(own_server):
    server = own_server
    body = _chat_body(stream=True, max_tokens=5000, temperature=0, ignore_eos=True)
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60
    ) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        rest = list(lines)  # the stream ends (cancelled after the grace period)
    assert time.monotonic() - started < 30
    assert len(rest) < 5000
    # cut short, but the stream still ends properly: a final chunk, then [DONE]
    assert "data: [DONE]" in rest and '"finish_reason": "abort"' in "".join(rest)
    assert server.stop(timeout=30) == 0, server.logs()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health")
