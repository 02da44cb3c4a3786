"""`runtime.server --disaggregation-mode prefill|decode` as two processes, driven the way the
gateway drives them (the same body with a bootstrap room to both at once): a request the
prefill server refuses fails its room at once, a pool layout mismatch is refused at
registration, and both servers' /server_info say what they are and count what moved."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.server_process import SMALL_ENGINE, ServerProcess, free_port, tiny_model_dir

pytestmark = pytest.mark.timeout(300)

TIMEOUT = "30"  # the hand-off timeout of both servers: the tests must answer well before it


@pytest.fixture(scope="module")
def servers():
    port = free_port()
    pre = ServerProcess(tiny_model_dir(), *SMALL_ENGINE, "--disaggregation-mode", "prefill",
                        "--disaggregation-bootstrap-port", str(port),
                        "--disaggregation-timeout", TIMEOUT)  # fmt: skip
    dec = ServerProcess(tiny_model_dir(), *SMALL_ENGINE, "--disaggregation-mode", "decode",
                        "--disaggregation-timeout", TIMEOUT)  # fmt: skip
    yield pre, dec, port
    for s in (pre, dec):
        assert s.stop() == 0, s.logs()


def both(prefill: str, decode: str, port: int, path: str, body: dict) -> tuple:
    """The gateway's PD dispatch: one room, the same body to both servers at once."""
    body = {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": port,
            "bootstrap_room": random.getrandbits(63)}  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        p = pool.submit(httpx.post, prefill + path, json=body, timeout=120)
        d = pool.submit(httpx.post, decode + path, json=body, timeout=120)
        return p.result(), d.result()


def test_server_info_names_the_role_and_counts_transfers(servers):
    pre, dec, port = servers
    body = {"text": "A short note", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    p, d = both(pre.url, dec.url, port, "/generate", body)
    assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
    assert len(d.json()["output_ids"]) == 6
    infos = [httpx.get(f"{s.url}/server_info", timeout=10).json() for s in (pre, dec)]
    assert [i["disaggregation_mode"] for i in infos] == ["prefill", "decode"]
    assert infos[0]["disaggregation_bootstrap_port"] == port
    assert all(i["kv_transfer_requests"] >= 1 for i in infos)
    assert infos[0]["kv_transfer_bytes"] == infos[1]["kv_transfer_bytes"] > 0


def test_a_request_the_prefill_server_refuses_fails_the_room_at_once(servers):
    pre, dec, port = servers
    bad = {"text": "hi", "sampling_params": {"max_new_tokens": 4, "no_such_knob": 1}}
    started = time.monotonic()
    p, d = both(pre.url, dec.url, port, "/generate", bad)
    assert p.status_code == 400
    # the decode server validates the same body: it refuses it too, or is told by the room
    assert d.status_code >= 400
    chat = {"messages": [{"role": "user", "content": "hi"}], "temperature": 9.0}
    p, d = both(pre.url, dec.url, port, "/v1/chat/completions", chat)
    assert p.status_code >= 400 and d.status_code >= 400
    assert time.monotonic() - started < float(TIMEOUT) / 2


def test_prefill_refusing_what_the_decode_server_accepts_is_reported_there(servers):
    pre, dec, port = servers
    # a prompt over the prefill server's limit only: the bridge's queue is fine, but a
    # max_tokens beyond the context is clamped on both; use a regex only the decode side sees
    body = {"text": "x", "sampling_params": {"max_new_tokens": 4}}
    room = random.getrandbits(63)
    started = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        d = pool.submit(
            httpx.post,
            dec.url + "/generate",
            json={
                **body,
                "bootstrap_host": "127.0.0.1",
                "bootstrap_port": port,
                "bootstrap_room": room,
            },  # fmt: skip
            timeout=120,
        )
        time.sleep(0.5)  # the decode server is waiting for the room
        p = httpx.post(
            pre.url + "/generate",
            json={
                **body,
                "sampling_params": {"max_new_tokens": -1},
                "bootstrap_room": room,
                "bootstrap_host": "127.0.0.1",
                "bootstrap_port": port,
            },  # fmt: skip
            timeout=60,
        )
        d = d.result()
    assert p.status_code == 400
    assert d.status_code == 500 and "prefill server answered" in d.text, d.text
    assert time.monotonic() - started < float(TIMEOUT) / 2


def test_pool_layout_mismatch_is_refused_at_registration(servers):
    pre, _, port = servers
    other = ServerProcess(tiny_model_dir(), *SMALL_ENGINE, "--page-size", "8",
                          "--disaggregation-mode", "decode")  # fmt: skip
    try:
        body = {"text": "Layouts", "sampling_params": {"max_new_tokens": 4}}
        p, d = both(pre.url, other.url, port, "/generate", body)
        assert d.status_code == 500 and "page_size" in d.text, d.text
        assert p.status_code == 500 and "page_size" in p.text, p.text
    finally:
        assert other.stop() == 0, other.logs()


def test_a_failed_hand_off_of_a_constrained_request_is_a_500_not_a_constraint_400(servers):
    # the KV could not be fetched (no prefill server there): the server's failure, even though
    # the request carries a constraint and no token was made
    _, dec, _ = servers
    body = {
        "messages": [{"role": "user", "content": "Yes or no?"}],
        "max_tokens": 4,
        "regex": "(yes|no)",
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": free_port(),  # nothing listens there
        "bootstrap_room": random.getrandbits(63),
    }
    d = httpx.post(dec.url + "/v1/chat/completions", json=body, timeout=120)
    assert d.status_code == 500, d.text
    assert "bootstrap port" in d.text and "invalid constraint" not in d.text
