"""The storage tier under the radix cache (`enable_hierarchical_cache`) on a tiny random Llama,
file backend then Mooncake Store: with a pool far smaller than the work, evicted prefixes come
back with the same greedy tokens as without the tier; a corrupt or missing object means
recompute; the tier outlives a restart; a different model fingerprint never reuses it; the
budget holds; a Mooncake master that is not there is named at start."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from runtime import Engine
from runtime.errors import HiCacheConfigError
from runtime.memory.hicache import HiCache
from runtime.memory.tier_mooncake import load_store_client
from tests.support.server_process import free_port
from tests.support.tiny_models import make_tiny_model

GREEDY = dict(max_new_tokens=6, temperature=0.0, ignore_eos=True)
# a pool of 256 tokens; six sessions of ~100 tokens each, asked twice: the second round's
# prefixes were all evicted by then
TIGHT = dict(page_size=4, max_total_tokens=256, chunked_prefill_tokens=64)
SESSIONS = [" ".join(f"session {s} turn {t} says {t * s % 7}" for t in range(12)) for s in range(6)]


def tier(folder: Path, **kw) -> dict:
    return {"enable_hierarchical_cache": True, "hicache_storage_dir": str(folder),
            "hicache_load_policy": "always", **kw}  # fmt: skip


@pytest.fixture(scope="module")
def want(model_dir) -> list[list[int]]:
    """Greedy tokens of two rounds over the sessions, radix cache only."""
    with Engine(model_dir, **TIGHT) as e:
        out = [e.generate(p, **GREEDY).token_ids for _ in range(2) for p in SESSIONS]
        assert e.stats()["cache_hit_tokens"] == 0  # the pool forgot every session
    return out


def two_rounds(engine: Engine) -> list[list[int]]:
    return [engine.generate(p, **GREEDY).token_ids for _ in range(2) for p in SESSIONS]


def files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.kv"))


def test_tier_gives_the_same_tokens_and_serves_the_evicted_prefixes(model_dir, want, tmp_path):
    with Engine(model_dir, **TIGHT, **tier(tmp_path)) as e:
        assert two_rounds(e) == want
        e.check_integrity()
        e.hicache.drain()
        s = e.stats()
    # the second round found its prefixes in the storage tier, none in the pool
    assert s["cache_hit_tokens_storage"] > 0.8 * sum(len(e.encode(p)) for p in SESSIONS)
    assert s["cache_hit_tokens_device"] == s["cache_hit_tokens"] - s["cache_hit_tokens_storage"]
    assert s["hicache_pages_loaded"] * 4 == s["cache_hit_tokens_storage"]
    assert s["hicache_pages_written"] == s["hicache_storage_pages"] == len(files(tmp_path))
    assert s["hicache_storage_bytes"] == sum(f.stat().st_size for f in files(tmp_path))
    assert s["hicache_load_failures"] == 0


def test_corrupt_and_missing_files_are_recomputed(model_dir, want, tmp_path):
    with Engine(model_dir, **TIGHT, **tier(tmp_path)) as e:
        first = [e.generate(p, **GREEDY).token_ids for p in SESSIONS]
        e.hicache.drain()
        stored = files(tmp_path)
        assert len(stored) > 10
        corrupted = {}
        for path in stored[::3]:  # flip one payload byte: the digest no longer matches
            raw = bytearray(path.read_bytes())
            raw[-5] ^= 0xFF
            corrupted[path] = bytes(raw)
            path.write_bytes(corrupted[path])
        for path in stored[1::3]:
            path.unlink()
        second = [e.generate(p, **GREEDY).token_ids for p in SESSIONS]
        e.check_integrity()
        s = e.stats()
    assert first + second == want
    assert s["hicache_load_failures"] > 0
    # a file found corrupt was deleted (and written again from recomputed KV, or not yet)
    assert sum(not p.exists() or p.read_bytes() != raw for p, raw in corrupted.items()) > 0
    with Engine(model_dir, **TIGHT, **tier(tmp_path)) as e:  # and after a restart
        assert [e.generate(p, **GREEDY).token_ids for p in SESSIONS] == want[len(SESSIONS) :]


def test_a_restarted_engine_reloads_the_prefix_from_the_tier(model_dir, tmp_path):
    prompt = SESSIONS[0]
    with Engine(model_dir, **TIGHT, **tier(tmp_path)) as e:
        before = e.generate(prompt, **GREEDY).token_ids
        assert e.stats()["hicache_pages_written"] == 0  # nothing evicted yet
    # shutdown wrote what the tree held
    assert files(tmp_path)
    with Engine(model_dir, **TIGHT, **tier(tmp_path)) as e:
        assert e.stats()["hicache_storage_pages"] == len(files(tmp_path))
        after = e.generate(prompt, **GREEDY)
        s = e.stats()
    assert after.token_ids == before
    prompt_tokens = after.usage.prompt_tokens
    assert s["cache_hit_tokens_storage"] == (prompt_tokens - 1) // 4 * 4
    assert after.usage.cached_tokens == s["cache_hit_tokens_storage"]
    assert s["prefill_computed_tokens"] == prompt_tokens - s["cache_hit_tokens_storage"]


def test_a_different_model_or_layout_never_reuses_the_tier(model_dir, tmp_path):
    prompt = SESSIONS[1]
    with Engine(model_dir, **TIGHT, **tier(tmp_path)) as e:
        e.generate(prompt, **GREEDY)
    other_model = make_tiny_model(tmp_path / "other", seed=1)
    for folder, kw in ((other_model, {}), (model_dir, {"kv_cache_dtype": "bf16"})):
        with Engine(folder, **TIGHT, **tier(tmp_path), **kw) as e:
            e.generate(prompt, **GREEDY)
            s = e.stats()
        assert s["cache_hit_tokens_storage"] == 0 and s["hicache_pages_loaded"] == 0, kw
    assert len({p.parent for p in files(tmp_path)}) == 3  # one folder per fingerprint


def test_the_tier_stays_within_its_budget(model_dir, want, tmp_path):
    budget = 40 * 1024  # about 18 pages of this model
    gb = budget / 1024**3
    with Engine(model_dir, **TIGHT, **tier(tmp_path, hicache_storage_budget_gb=gb)) as e:
        assert two_rounds(e) == want
        e.hicache.drain()
        s = e.stats()
        assert sum(f.stat().st_size for f in files(tmp_path)) == s["hicache_storage_bytes"]
    assert 0 < s["hicache_storage_bytes"] <= budget
    assert s["hicache_files_evicted"] > 0


def test_loading_waits_for_measured_costs_in_auto_policy(model_dir, tmp_path):
    with Engine(model_dir, **TIGHT, **tier(tmp_path, hicache_load_policy="auto")) as e:
        h: HiCache = e.hicache
        assert h.worth_loading(3)  # nothing measured yet: load
        h._load_s_per_page, h._compute_s_per_token = 1e-3, 1e-3  # a page: 4 tokens
        assert h.worth_loading(3)
        h._load_s_per_page = 5e-3
        assert not h.worth_loading(3)
        assert not h.worth_loading(0)


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(enable_radix_cache=False), "radix cache"),
        (dict(hicache_storage_backend="nfs"), "hicache_storage_backend"),
        (dict(hicache_storage_budget_gb=0), "hicache_storage_budget_gb"),
        (dict(hicache_load_policy="never"), "hicache_load_policy"),
        (
            dict(hicache_storage_backend_extra_config='{"prefetch_threshold": 1}'),
            "hicache_storage_backend_extra_config",
        ),
        (
            dict(
                hicache_storage_backend="mooncake",
                hicache_storage_backend_extra_config={"master": "127.0.0.1:1"},
            ),
            "master",
        ),
    ],
    ids=["no-radix", "backend", "budget", "policy", "file-extra", "mooncake-key"],
)
def test_bad_settings_are_typed_errors_naming_the_field(model_dir, tmp_path, kw, field):
    with pytest.raises(HiCacheConfigError, match=field):
        Engine(model_dir, **TIGHT, **{**tier(tmp_path), **kw})


def test_server_flags_build_the_tier_and_metrics_show_it(model_dir, tmp_path):
    from runtime.server.__main__ import engine_kwargs, parse_args
    from runtime.server.metrics import ServerMetrics

    flags = ["--enable-hierarchical-cache", "--hicache-storage-dir", str(tmp_path),
             "--hicache-storage-budget-gb", "0.5", "--page-size", "4",
             "--max-total-tokens", "256"]  # fmt: skip
    kw = engine_kwargs(parse_args(flags))
    assert kw["enable_hierarchical_cache"] and kw["hicache_storage_backend"] == "file"
    mc = engine_kwargs(parse_args(["--enable-hierarchical-cache", "--hicache-storage-backend",
                                   "mooncake", "--hicache-storage-backend-extra-config",
                                   '{"master_server_address": "10.0.0.1:50051"}']))  # fmt: skip
    assert mc["hicache_storage_backend"] == "mooncake"
    assert json.loads(mc["hicache_storage_backend_extra_config"]) == {
        "master_server_address": "10.0.0.1:50051"}  # fmt: skip
    with Engine(model_dir, **{**kw, "hicache_load_policy": "always"}) as e:
        for prompt in SESSIONS * 2:
            e.generate(prompt, **GREEDY)
        text = ServerMetrics().render(e.stats(), in_flight=0)
        s = e.stats()
    assert s["hicache_storage_budget_bytes"] == 2**29
    assert f'sgl_cache_hit_tokens_total{{tier="storage"}} {s["cache_hit_tokens_storage"]}' in text
    assert s["cache_hit_tokens_storage"] > 0
    for name in ("hicache_storage_bytes", "hicache_pages_written_total",
                 "hicache_pages_loaded_total", "hicache_load_failures_total"):  # fmt: skip
        assert f"sgl_{name} " in text


# ---- the mooncake backend: the same tier over Mooncake Store -----------------------------------
MASTER_BIN = Path(sys.executable).parent / "mooncake_master"


def _mooncake_missing() -> str | None:
    if not MASTER_BIN.exists():
        return f"no {MASTER_BIN} (pip install mooncake-transfer-engine-non-cuda)"
    try:
        load_store_client()
    except HiCacheConfigError as exc:
        return str(exc)
    return None


MOONCAKE_MISSING = _mooncake_missing()
needs_mooncake = pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=str(MOONCAKE_MISSING))


def _wait_listening(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}: {log.read_text()}")


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory):
    """A `mooncake_master` and a store service lending it 64 MiB (so pages outlive an engine),
    on free ports, stopped at the end. Yields the extra config of an engine lending nothing and
    a function that empties the store (each test starts from an empty one)."""
    if MOONCAKE_MISSING is not None:
        pytest.skip(MOONCAKE_MISSING)
    folder = tmp_path_factory.mktemp("mooncake")
    master_port, http_port = free_port(), free_port()
    address = f"127.0.0.1:{master_port}"
    procs = []
    try:
        log = folder / "master.log"
        procs.append(subprocess.Popen(
            [str(MASTER_BIN), f"--rpc_port={master_port}", f"--metrics_port={free_port()}",
             "--default_kv_lease_ttl=50"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT))  # fmt: skip
        _wait_listening(master_port, procs[-1], log)
        config = folder / "store.json"
        config.write_text(json.dumps({
            "local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
            "master_server_address": address, "global_segment_size": 64 * 2**20,
            "local_buffer_size": 0, "protocol": "tcp", "device_name": ""}))  # fmt: skip
        log = folder / "store.log"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "mooncake.mooncake_store_service", "--config", str(config),
             "--port", str(http_port)],
            stdout=log.open("wb"), stderr=subprocess.STDOUT))  # fmt: skip
        _wait_listening(http_port, procs[-1], log)

        def empty() -> None:
            request = urllib.request.Request(
                f"http://127.0.0.1:{http_port}/api/remove_all", method="DELETE"
            )
            urllib.request.urlopen(request, timeout=10).read()

        extra = {"master_server_address": address, "global_segment_size": 0,
                 "local_hostname": "127.0.0.1"}  # fmt: skip
        yield extra, empty
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait(timeout=10)


def mooncake_tier(extra: dict) -> dict:
    return {
        "enable_hierarchical_cache": True,
        "hicache_storage_backend": "mooncake",
        "hicache_storage_backend_extra_config": extra,
        "hicache_load_policy": "always",
    }


@needs_mooncake
def test_mooncake_tier_gives_the_same_tokens(model_dir, want, mooncake):
    extra, empty = mooncake
    empty()
    with Engine(model_dir, **TIGHT, **mooncake_tier(extra)) as e:
        assert two_rounds(e) == want
        e.check_integrity()
        e.hicache.drain()
        s = e.stats()
        store = e.hicache.store
        assert all(store.backend.exists(store.keys()))  # in Mooncake, not only in the index
    assert s["hicache_storage_backend"] == "mooncake"
    assert s["cache_hit_tokens_storage"] > 0.8 * sum(len(e.encode(p)) for p in SESSIONS)
    assert s["hicache_pages_loaded"] * 4 == s["cache_hit_tokens_storage"]
    assert s["hicache_pages_written"] == s["hicache_storage_pages"] > 0
    assert s["hicache_load_failures"] == 0


@needs_mooncake
def test_mooncake_pages_outlive_the_engine_and_bad_ones_are_recomputed(model_dir, want, mooncake):
    extra, empty = mooncake
    empty()
    n = len(SESSIONS)
    with Engine(model_dir, **TIGHT, **mooncake_tier(extra)) as e:
        assert [e.generate(p, **GREEDY).token_ids for p in SESSIONS] == want[:n]
    # a new engine, the master and the store service still running: shutdown stored the tree
    with Engine(model_dir, **TIGHT, **mooncake_tier(extra)) as e:
        backend, tier_ = e.hicache.store.backend, e.hicache
        bad = {}
        for i, prompt in enumerate(SESSIONS):  # the middle page: corrupt (even sessions) or
            ids = e.encode(prompt)  # gone (odd ones)
            key = tier_.page_keys(ids, len(ids) // 4)[len(ids) // 8]
            raw = backend.get(key)
            assert raw is not None
            backend.delete(key)
            if i % 2 == 0:
                bad[key] = raw[:-5] + bytes([raw[-5] ^ 0xFF]) + raw[-4:]
                assert backend.put(key, [bad[key]])
        assert [e.generate(p, **GREEDY).token_ids for p in SESSIONS] == want[n:]
        e.check_integrity()
        e.hicache.drain()
        s = e.stats()
        assert all(backend.get(key) != raw for key, raw in bad.items())  # deleted or rewritten
    # a corrupt object is a failed load; a missing one is never offered (the master lacks it)
    assert s["hicache_load_failures"] == len(bad)
    # every page before the bad one came from the store
    assert s["cache_hit_tokens_storage"] >= sum(len(e.encode(p)) // 8 * 4 for p in SESSIONS)


@pytest.mark.parametrize("case", ["no-master", "no-address", "no-package"])
def test_mooncake_missing_pieces_are_named_at_start(model_dir, monkeypatch, case):
    extra: dict = {"master_server_address": f"127.0.0.1:{free_port()}"}  # nothing listens
    match = "no Mooncake master .*reachable at 127.0.0.1"
    if case == "no-master" and MOONCAKE_MISSING is not None:
        pytest.skip(MOONCAKE_MISSING)
    if case == "no-address":
        extra, match = {}, "MOONCAKE_MASTER"
        monkeypatch.delenv("MOONCAKE_MASTER", raising=False)
    if case == "no-package":
        monkeypatch.setitem(sys.modules, "mooncake.store", None)  # as if not installed
        match = "mooncake-transfer-engine-non-cuda"
    with pytest.raises(HiCacheConfigError, match=match):
        Engine(model_dir, **TIGHT, **mooncake_tier(extra))
