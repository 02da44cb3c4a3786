"""Prefill-decode disaggregation in the engine, on a tiny random Llama over loopback: a prefill
engine and a decode engine (one process, the KV moving over the bootstrap port's TCP
protocol) give the single engine's greedy tokens, for plain, streamed, constrained, chunked and
cached requests; the faults end the affected request with an error and leave the pools whole.
A representative subset (equal tokens, a timeout, a prefill server dying, a decode server
disconnecting) runs with the `mooncake` transfer backend as well.
"""

from __future__ import annotations

import itertools
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from runtime import Engine
from runtime.disaggregation import mooncake
from runtime.disaggregation.mooncake import load_transfer_engine, pieces
from runtime.disaggregation.protocol import Kind, receive, send
from runtime.errors import DisaggregationConfigError, KVTransferError
from tests.support.tiny_models import PROMPTS, make_tiny_model

N = 10
GREEDY = dict(max_new_tokens=N, temperature=0.0, ignore_eos=True)
ENGINE = dict(page_size=4, max_total_tokens=4096)
_rooms = itertools.count(1000)
LONG = " ".join(f"item {i} is number {i * 7 % 13}" for i in range(40))  # ~300 tokens


def _mooncake_missing() -> str | None:
    try:
        load_transfer_engine()
    except DisaggregationConfigError as exc:
        return str(exc)
    return None


MOONCAKE_MISSING = _mooncake_missing()
# every backend for the tests that run with both (scripts/install.sh installs Mooncake; a
# machine without it skips those, saying why)
BACKENDS = [
    "tcp",
    pytest.param("mooncake", marks=pytest.mark.skipif(MOONCAKE_MISSING is not None,
                                                      reason=str(MOONCAKE_MISSING))),
]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-pd"))


@pytest.fixture(scope="module")
def single(model_dir):
    with Engine(model_dir, **ENGINE) as e:
        yield e


@pytest.fixture(scope="module")
def prefill(model_dir):
    kw = dict(ENGINE, chunked_prefill_tokens=64)  # long prompts prefill in chunks
    with Engine(model_dir, disaggregation_mode="prefill", disaggregation_bootstrap_port=0,
                disaggregation_bootstrap_host="127.0.0.1", disaggregation_timeout_s=3,
                **kw) as e:  # fmt: skip
        yield e


@pytest.fixture(scope="module")
def decode(model_dir):
    with Engine(model_dir, disaggregation_mode="decode", disaggregation_timeout_s=3,
                **ENGINE) as e:  # fmt: skip
        yield e


@pytest.fixture(scope="module")
def mc_prefill(model_dir):
    kw = dict(ENGINE, chunked_prefill_tokens=64)
    with Engine(model_dir, disaggregation_mode="prefill", disaggregation_bootstrap_port=0,
                disaggregation_bootstrap_host="127.0.0.1", disaggregation_timeout_s=3,
                disaggregation_transfer_backend="mooncake", **kw) as e:  # fmt: skip
        yield e


@pytest.fixture(scope="module")
def mc_decode(model_dir):
    with Engine(model_dir, disaggregation_mode="decode", disaggregation_timeout_s=3,
                disaggregation_bootstrap_host="127.0.0.1",
                disaggregation_transfer_backend="mooncake", **ENGINE) as e:  # fmt: skip
        yield e


@pytest.fixture
def pair(request, backend) -> tuple[Engine, Engine]:
    """The prefill and decode engines of `backend`."""
    names = ("prefill", "decode") if backend == "tcp" else ("mc_prefill", "mc_decode")
    return tuple(request.getfixturevalue(n) for n in names)


def boot(prefill: Engine, room: int | None = None) -> dict:
    port = prefill.disaggregation.bootstrap_port
    room = next(_rooms) if room is None else room
    return dict(bootstrap_host="127.0.0.1", bootstrap_port=port, bootstrap_room=room)


class Background:
    """`engine.generate(...)` on a thread; `.result()` is its result or the exception it raised."""

    def __init__(self, engine: Engine, *args, **kw) -> None:
        self._out: list = []
        self._thread = threading.Thread(target=self._run, args=(engine, args, kw))
        self._thread.start()

    def _run(self, engine: Engine, args, kw) -> None:
        try:
            self._out.append(engine.generate(*args, **kw))
        except Exception as exc:
            self._out.append(exc)

    def result(self, timeout: float = 30):
        self._thread.join(timeout=timeout)
        assert not self._thread.is_alive(), "the request hung"
        return self._out[0]


def pd(prefill: Engine, decode: Engine, prompt, stream: bool = False, **kw):
    """What the gateway does: the same request to both servers at once, one room; returns the
    decode side's result and the prefill side's (or the exception each raised)."""
    room = boot(prefill)
    out: dict = {}
    pre = Background(prefill, prompt, **kw, **room)
    try:
        if stream:
            chunks = list(decode.generate(prompt, stream=True, **kw, **room))
            assert chunks[-1].finished
            out["decode"] = chunks
        else:
            out["decode"] = decode.generate(prompt, **kw, **room)
    except Exception as exc:
        out["decode"] = exc
    return out["decode"], pre.result()


def pool_whole(engine: Engine) -> None:
    engine.check_integrity()
    stats = engine.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
    # no pages held for a Mooncake read (prefill) or landing from one (decode)
    sched = engine.scheduler
    assert engine.scheduler.call(lambda: (len(sched.held), len(sched.landing))) == (0, 0)
    if engine.disaggregation.sender is not None:
        assert engine.disaggregation.sender.open_rooms == 0  # no staged KV kept


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_tokens_equal_the_single_engine(single, pair, backend):
    prefill, decode = pair
    assert decode.stats()["disaggregation_transfer_backend"] == backend
    for prompt in [*PROMPTS, LONG]:  # LONG is prefilled in chunks of 64 tokens
        want = single.generate(prompt, **GREEDY)
        got, pre = pd(prefill, decode, prompt, **GREEDY)
        assert got.token_ids == want.token_ids, prompt
        assert got.text == want.text
        assert got.finish_reason == "length" and got.usage.completion_tokens == N
        # the prefill server computed the first token; the decode server did not prefill
        assert pre.token_ids == want.token_ids[:1]
    for e in (prefill, decode):
        pool_whole(e)


def test_stream_and_logprobs_equal_the_single_engine(single, prefill, decode):
    kw = dict(GREEDY, logprobs=True, top_logprobs=3)
    want = single.generate(PROMPTS[0], **kw)
    chunks, _ = pd(prefill, decode, PROMPTS[0], stream=True, **kw)
    result = chunks[-1].result
    assert result.token_ids == want.token_ids
    assert "".join(c.text_delta for c in chunks) == want.text
    assert [t for c in chunks for t in c.token_ids] == want.token_ids
    assert result.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    assert [sorted(d) for d in result.top_logprobs] == [sorted(d) for d in want.top_logprobs]


@pytest.mark.parametrize("backend", BACKENDS)
def test_transfer_counters_count_pages_on_both_sides(pair, backend):
    prefill, decode = pair
    sent0, got0 = prefill.stats(), decode.stats()
    prompt = f"Counting with {backend}: {LONG}"  # nothing of it cached on the decode side
    prompt_ids = decode.encode(prompt)
    pd(prefill, decode, prompt, **GREEDY)
    sent, got = prefill.stats(), decode.stats()
    assert sent["disaggregation_mode"] == "prefill" and got["disaggregation_mode"] == "decode"
    pages = -(-len(prompt_ids) // 4)
    nbytes = pages * 4 * decode.pool.bytes_per_token
    for before, after in ((sent0, sent), (got0, got)):
        assert after["kv_transfer_requests"] == before["kv_transfer_requests"] + 1
        assert after["kv_transfer_bytes"] == before["kv_transfer_bytes"] + nbytes
    # the decode side never prefilled the prompt: it computed only the decoded tokens
    assert got["prefill_computed_tokens"] == got0["prefill_computed_tokens"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_side_radix_cache_knows_the_transferred_prompt(single, pair, backend):
    prefill, decode = pair
    prompt = f"Again with {backend}: {LONG} and one more"
    want = single.generate(prompt, **GREEDY)
    first, _ = pd(prefill, decode, prompt, **GREEDY)
    moved = decode.stats()["kv_transfer_bytes"]
    again, _ = pd(prefill, decode, prompt, **GREEDY)
    assert first.token_ids == again.token_ids == want.token_ids
    assert again.usage.cached_tokens >= len(decode.encode(prompt)) - 4
    if backend == "mooncake":  # pool to pool: only the pages past the cached prefix are read
        page = 4 * decode.pool.bytes_per_token
        assert decode.stats()["kv_transfer_bytes"] - moved <= page
    pool_whole(decode)


def test_constrained_output_and_jump_forward_equal_the_single_engine(single, prefill, decode):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    cases = [
        dict(json_schema=schema, max_new_tokens=40, temperature=0.0),
        dict(regex=r"(yes|no), because [a-z]{3,8}\.", max_new_tokens=20, temperature=0.0),
        dict(choices=["alpha", "beta", "gamma"], temperature=0.0),
    ]
    for kw in cases:
        want = single.generate("Answer:", **kw)
        # compiled on the prefill server first, without a room: its compile workers start on
        # its first constraint (seconds on a loaded machine), which the 3 s room timeout of
        # these fixtures would otherwise count
        prefill.generate("Answer:", **kw)
        got, _ = pd(prefill, decode, "Answer:", **kw)
        assert got.text == want.text and got.token_ids == want.token_ids, kw
        assert got.finish_reason == want.finish_reason
    for e in (prefill, decode):
        pool_whole(e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_first_token_that_ends_the_request_and_zero_new_tokens(single, pair, backend):
    prefill, decode = pair
    want = single.generate(PROMPTS[1], max_new_tokens=1, temperature=0.0)
    got, _ = pd(prefill, decode, PROMPTS[1], max_new_tokens=1, temperature=0.0)
    assert got.token_ids == want.token_ids and got.finish_reason == "length"
    got, _ = pd(prefill, decode, PROMPTS[1], max_new_tokens=0)
    assert got.token_ids == [] and got.finish_reason == "length"
    pool_whole(decode)


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_concurrent_requests_are_each_answered_once(single, pair, backend, monkeypatch):
    prefill, decode = pair
    # mooncake: reads in batches of 7 pieces, at most 20 in flight (the queue bound)
    monkeypatch.setattr(mooncake, "MAX_BATCH", 7)
    monkeypatch.setattr(mooncake, "MAX_IN_FLIGHT", 20)
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} #{i}" for i in range(16)]
    want = [single.generate(p, **GREEDY).token_ids for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda p: pd(prefill, decode, p, **GREEDY)[0], prompts))
    assert [g.token_ids for g in got] == want
    for e in (prefill, decode):
        pool_whole(e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_room_that_never_arrives_times_out_with_an_error(pair, backend):
    prefill, decode = pair
    with pytest.raises(KVTransferError, match="did not arrive"):
        decode.generate(PROMPTS[0], **GREEDY, **boot(prefill))
    pool_whole(decode)
    pool_whole(prefill)


def test_prefill_room_no_decode_server_asks_for_is_dropped(model_dir):
    with Engine(model_dir, disaggregation_mode="prefill", disaggregation_bootstrap_port=0,
                disaggregation_timeout_s=0.5, **ENGINE) as pre:  # fmt: skip
        with pytest.raises(KVTransferError, match="no decode server asked"):
            pre.generate(PROMPTS[0], **GREEDY, **boot(pre))
        pool_whole(pre)
        assert pre.stats()["kv_transfer_failures"] == 1
        assert pre.generate(PROMPTS[0], **GREEDY).finish_reason == "length"  # plain requests go on


def test_layout_mismatch_is_refused_at_registration(model_dir, prefill):
    for other in (dict(page_size=8), dict(dtype="bfloat16")):
        kw = {**ENGINE, **other}
        with Engine(model_dir, disaggregation_mode="decode", disaggregation_timeout_s=3,
                    **kw) as dec:  # fmt: skip
            name = next(iter(other))
            got, pre = pd(prefill, dec, PROMPTS[0], **GREEDY)
            assert isinstance(got, KVTransferError) and name in str(got), got
            assert isinstance(pre, KVTransferError), pre
            pool_whole(dec)
    pool_whole(prefill)


def _fake_prefill_server(
    meta: dict, pages_sent: int, page_bytes: int
) -> tuple[int, threading.Thread]:
    """A bootstrap peer that answers META, sends `pages_sent` pages, then dies."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            receive(conn)  # REGISTER
            send(conn, Kind.META, meta)
            for i in range(pages_sent):
                send(conn, Kind.PAGE, {"index": i}, bytes(page_bytes))
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv.getsockname()[1], t


def test_prefill_server_dying_mid_transfer_ends_the_request(decode):
    ids = decode.encode(LONG)
    pages = -(-len(ids) // 4)
    meta = {"prompt_ids": ids, "output_ids": [5], "logprobs": None, "top_logprobs": None,
            "kv_tokens": len(ids), "num_pages": pages}  # fmt: skip
    port, t = _fake_prefill_server(meta, pages_sent=3, page_bytes=4 * decode.pool.bytes_per_token)
    free_before = decode.pool.num_free_pages
    with pytest.raises(KVTransferError, match="closed"):
        decode.generate(LONG, **GREEDY, bootstrap_host="127.0.0.1", bootstrap_port=port,
                        bootstrap_room=1)  # fmt: skip
    t.join(timeout=10)
    pool_whole(decode)
    assert decode.pool.num_free_pages == free_before  # nothing was allocated for it
    assert decode.generate(PROMPTS[0], **GREEDY).finish_reason == "length"


@pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=str(MOONCAKE_MISSING))
def test_prefill_engine_gone_before_the_mooncake_read_ends_the_request(mc_decode):
    """The prefill server answers META with pages in a Mooncake session that is gone."""
    ids = mc_decode.encode(LONG)
    pages = -(-len(ids) // 4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # nobody listens here once closed
    regions = len(mc_decode.disaggregation.mooncake.regions)
    where = {"session": dead, "bases": [4096 * (i + 1) for i in range(regions)],
             "pages": list(range(1, pages + 1))}  # fmt: skip
    meta = {"prompt_ids": ids, "output_ids": [5], "logprobs": None, "top_logprobs": None,
            "kv_tokens": len(ids), "num_pages": pages, "mooncake": where}  # fmt: skip
    port, t = _fake_prefill_server(meta, pages_sent=0, page_bytes=0)
    free_before = mc_decode.pool.num_free_pages
    with pytest.raises(KVTransferError, match="Mooncake read"):
        mc_decode.generate(LONG, **GREEDY, bootstrap_host="127.0.0.1", bootstrap_port=port,
                           bootstrap_room=1)  # fmt: skip
    t.join(timeout=10)
    pool_whole(mc_decode)
    assert mc_decode.pool.num_free_pages == free_before
    assert mc_decode.generate(PROMPTS[0], **GREEDY).finish_reason == "length"


@pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=str(MOONCAKE_MISSING))
def test_mooncake_prefill_holds_the_pages_until_the_decode_side_read_them(mc_prefill):
    """The decode server reads the prefill pool in place: the finished request's pages stay
    held (not free, not evictable) until its ACK, then the prefill side answers DONE and
    frees them."""
    sched, pool, tree = mc_prefill.scheduler, mc_prefill.pool, mc_prefill.tree
    room = boot(mc_prefill)
    pre = Background(mc_prefill, LONG, **GREEDY, **room)
    layout = mc_prefill.disaggregation.sender.layout
    with socket.create_connection(("127.0.0.1", room["bootstrap_port"])) as conn:
        send(conn, Kind.REGISTER, {"room": room["bootstrap_room"], "layout": layout.to_json(),
                                   "transfer": "mooncake"})  # fmt: skip
        kind, meta, _ = receive(conn)
        assert kind is Kind.META
        pages = set(meta["mooncake"]["pages"])
        assert len(pages) == meta["num_pages"] > 0
        held = sched.call(lambda: [set(r.pages) for r in sched.held])
        sched.call(lambda: tree.evict(tree.evictable_pages))  # as a full pool would
        free = sched.call(pool.free_page_set)
        assert len(held) == 1 and pages <= held[0] and not pages & free
        send(conn, Kind.ACK, {"pages": len(pages)})
        kind, _, _ = receive(conn)
        assert kind is Kind.DONE  # they were held until the ACK came
    assert pre.result().finish_reason == "length"
    pool_whole(mc_prefill)  # and released after it


@pytest.mark.slow
@pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=str(MOONCAKE_MISSING))
def test_mooncake_held_pages_are_freed_when_the_decode_side_goes_silent(model_dir):
    """A decode server that takes META, then says nothing: past the timeout (+5 s) the prefill
    side frees the held pages and answers ERROR, which a late ACK's reader gets instead of
    DONE (so the decode side drops what it read). About 10 s: the timeout is 3 s + 5 s."""
    with Engine(model_dir, disaggregation_mode="prefill", disaggregation_bootstrap_port=0,
                disaggregation_bootstrap_host="127.0.0.1", disaggregation_timeout_s=3,
                disaggregation_transfer_backend="mooncake", **ENGINE) as pre:  # fmt: skip
        room = boot(pre)
        request = Background(pre, LONG, **GREEDY, **room)
        layout = pre.disaggregation.sender.layout
        with socket.create_connection(("127.0.0.1", room["bootstrap_port"])) as conn:
            register = {"room": room["bootstrap_room"], "layout": layout.to_json(),
                        "transfer": "mooncake"}  # fmt: skip
            send(conn, Kind.REGISTER, register)
            kind, _, _ = receive(conn)
            assert kind is Kind.META
            assert pre.scheduler.call(lambda: len(pre.scheduler.held)) == 1
            got = request.result(timeout=30)  # silent past the timeout
            assert isinstance(got, KVTransferError) and "timed out" in str(got), got
            pool_whole(pre)  # the held pages are free again
            kind, _, _ = receive(conn)
            assert kind is Kind.ERROR


def test_mooncake_pieces_are_runs_of_pages_per_pool_tensor():
    regions = [(1000, 10, 100), (5000, 10, 100)]  # two tensors, 10 bytes a page
    dst, src, lengths = pieces(regions, [200, 600], mine=[5, 6, 7, 9], theirs=[1, 2, 3, 4])
    # pages 5-7 <- 1-3 are one run, 9 <- 4 another (not consecutive here)
    assert dst == [1050, 1090, 5050, 5090]
    assert src == [210, 240, 610, 640]
    assert lengths == [30, 10, 30, 10]
    # falling runs (as the pool hands pages out): 8, 7, 6 <- 3, 2, 1 is pages 6-8 <- 1-3
    dst, src, lengths = pieces(regions[:1], [200], mine=[8, 7, 6, 2, 3], theirs=[3, 2, 1, 9, 8])
    assert (dst, src, lengths) == ([1060, 1020, 1030], [210, 290, 280], [30, 10, 10])
    assert pieces(regions, [200, 600], mine=[], theirs=[]) == ([], [], [])


@pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=str(MOONCAKE_MISSING))
def test_mixed_transfer_backends_are_refused_at_registration(prefill, mc_decode):
    got, pre = pd(prefill, mc_decode, PROMPTS[0], **GREEDY)
    assert isinstance(got, KVTransferError) and "transfer backend" in str(got), got
    assert isinstance(pre, KVTransferError), pre
    pool_whole(mc_decode)
    pool_whole(prefill)


def test_a_missing_mooncake_is_named_in_the_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # as if not installed
    with pytest.raises(DisaggregationConfigError, match="mooncake-transfer-engine-non-cuda"):
        load_transfer_engine()


def test_unreachable_prefill_server_is_an_error(decode):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once closed
    with pytest.raises(KVTransferError, match="cannot reach"):
        decode.generate(PROMPTS[0], **GREEDY, bootstrap_host="127.0.0.1", bootstrap_port=port,
                        bootstrap_room=2)  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_server_disconnecting_fails_the_prefill_request(pair, backend):
    prefill, _ = pair
    room = boot(prefill)
    pre = Background(prefill, LONG, **GREEDY, **room)
    layout = prefill.disaggregation.sender.layout
    with socket.create_connection(("127.0.0.1", room["bootstrap_port"])) as conn:
        send(conn, Kind.REGISTER, {"room": room["bootstrap_room"], "layout": layout.to_json(),
                                   "transfer": backend})  # fmt: skip
        kind, _, _ = receive(conn)
        assert kind is Kind.META
    # gone before the pages and the acknowledgement
    got = pre.result()
    assert isinstance(got, KVTransferError) and "disconnected" in str(got)
    pool_whole(prefill)
    assert prefill.generate(PROMPTS[0], **GREEDY).finish_reason == "length"


def test_prefill_request_that_fails_tells_the_decode_side(prefill, decode):
    got, pre = pd(prefill, decode, PROMPTS[0], regex="(unclosed", max_new_tokens=5)
    assert isinstance(got, KVTransferError | ValueError) or got.finish_reason == "abort", got
    assert "room" in str(got) or "regex" in str(got).lower()
    for e in (prefill, decode):
        pool_whole(e)


def test_bad_disaggregation_settings_are_typed_errors(model_dir, prefill):
    with pytest.raises(DisaggregationConfigError, match="disaggregation_mode"):
        Engine(model_dir, disaggregation_mode="both", **ENGINE)
    port = prefill.disaggregation.bootstrap_port
    with pytest.raises(DisaggregationConfigError, match="bootstrap port"):
        Engine(model_dir, disaggregation_mode="prefill", disaggregation_bootstrap_port=port,
               disaggregation_bootstrap_host="127.0.0.1", **ENGINE)  # fmt: skip
    with pytest.raises(ValueError, match="one prompt"):
        prefill.generate(PROMPTS[:2], **GREEDY, **boot(prefill))


def test_servers_without_a_room_serve_as_plain_ones(single, prefill, decode):
    want = single.generate(PROMPTS[2], **GREEDY).token_ids
    assert prefill.generate(PROMPTS[2], **GREEDY).token_ids == want
    assert decode.generate(PROMPTS[2], **GREEDY).token_ids == want


def test_mla_latent_cache_moves_as_well(tmp_path):
    """DeepSeek's latent KV (one [kv_lora_rank + rope] vector per token and layer) hands off
    the same way: greedy tokens equal the single engine's."""
    folder = make_tiny_model(tmp_path / "tiny-deepseek", kind="deepseek_v3")
    engines = [
        Engine(folder, **ENGINE),
        Engine(folder, disaggregation_mode="prefill", disaggregation_bootstrap_port=0,
               disaggregation_timeout_s=3, **ENGINE),
        Engine(folder, disaggregation_mode="decode", disaggregation_timeout_s=3, **ENGINE),
    ]  # fmt: skip
    one, pre, dec = engines
    try:
        assert [name for name, _, _ in dec.pool.layout] == ["latent"]
        for prompt in (PROMPTS[0], LONG):
            got, _ = pd(pre, dec, prompt, **GREEDY)
            assert got.token_ids == one.generate(prompt, **GREEDY).token_ids
        assert dec.stats()["kv_transfer_bytes"] > 0
        pool_whole(dec)
    finally:
        for e in engines:
            e.shutdown()


def test_seeded_sampling_continues_the_single_engine_stream(single, prefill, decode):
    """The decode side replays the random draw of the prefill side's first token."""
    kw = dict(max_new_tokens=N, temperature=0.9, top_k=50, seed=1234, ignore_eos=True)
    want = single.generate(PROMPTS[0], **kw)
    got, _ = pd(prefill, decode, PROMPTS[0], **kw)
    assert got.token_ids == want.token_ids
