"""Server counters and their Prometheus text exposition (format 0.0.4).

Counters are touched only from the event loop thread, so they need no lock. Engine figures
(cache hit rate, running, waiting, pool use) are read from `Engine.stats()` at scrape time.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PREFIX = "sgl"


class ServerMetrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()  # (endpoint, status) -> count
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.rejected_busy = 0
        self.client_aborts = 0
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self.ttft_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.ttft_sum = 0.0

    def record_request(self, endpoint: str, status: int, seconds: float | None) -> None:
        """Count an answer; `seconds` is None for a stream (timed by `record_stream_end`)."""
        self.requests[(endpoint, status)] += 1
        if status == 503:
            self.rejected_busy += 1
        if status < 400 and seconds is not None:
            self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            self.latency_sum += seconds

    def record_stream_end(self, seconds: float) -> None:
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds

    def record_ttft(self, seconds: float) -> None:
        self.ttft_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.ttft_sum += seconds

    def record_usage(self, prompt: int, cached: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.completion_tokens += completion

    def render(self, engine_stats: dict[str, Any], in_flight: int) -> str:
        """The Prometheus text of the server counters plus the engine's current figures."""
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {PREFIX}_{name} {help_}")
            out.append(f"# TYPE {PREFIX}_{name} {kind}")
            out.extend(f"{PREFIX}_{name}{labels} {_num(v)}" for labels, v in samples)

        reqs = [
            (f'{{endpoint="{ep}",status="{st}"}}', n)
            for (ep, st), n in sorted(self.requests.items())
        ]
        metric("requests_total", "counter", "HTTP requests answered.", reqs)
        metric(
            "rejected_busy_total",
            "counter",
            "Requests refused with 503.",
            [("", self.rejected_busy)],
        )
        metric(
            "client_aborts_total",
            "counter",
            "Requests aborted by a client disconnect.",
            [("", self.client_aborts)],
        )
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of answered requests.",
            [("", self.prompt_tokens)],
        )
        metric(
            "cached_prompt_tokens_total",
            "counter",
            "Prompt tokens served from the cache.",
            [("", self.cached_tokens)],
        )
        metric(
            "generation_tokens_total",
            "counter",
            "Tokens generated for answered requests.",
            [("", self.completion_tokens)],
        )
        self._histogram(
            out,
            "request_duration_seconds",
            "Latency of answered requests.",
            self.latency_counts,
            self.latency_sum,
        )
        self._histogram(
            out,
            "time_to_first_token_seconds",
            "Streamed requests' first token.",
            self.ttft_counts,
            self.ttft_sum,
        )
        gauges = {
            "cache_hit_rate": ("cache_hit_rate", "Prefill tokens found in the radix cache."),
            "running_requests": ("running", "Requests in the running batch."),
            "waiting_requests": ("waiting", "Requests queued in the engine."),
            "pool_usage": ("pool_usage", "Fraction of KV pages in use (incl. cache)."),
            "pool_used_tokens": ("pool_used_tokens", "KV slots in use (incl. cache)."),
            "cached_tokens": ("cached_tokens", "Tokens held by the radix cache."),
            "throughput_tokens_per_second": ("throughput_tok_s", "Generated tokens / busy s."),
        }
        for name, (key, help_) in gauges.items():
            metric(name, "gauge", help_, [("", float(engine_stats.get(key, 0)))])
        if engine_stats.get("hierarchical_cache"):
            self._hicache(metric, engine_stats)
        if engine_stats.get("speculative_algorithm"):
            self._speculative(metric, engine_stats)
        waiting = max(0, in_flight - int(engine_stats.get("running", 0)))
        metric(
            "in_flight_requests",
            "gauge",
            "Engine requests admitted by the server.",
            [("", in_flight)],
        )
        metric("queue_length", "gauge", "Admitted requests not yet running.", [("", waiting)])
        return "\n".join(out) + "\n"

    @staticmethod
    def _speculative(metric: Any, stats: dict[str, Any]) -> None:
        """Speculative decoding's figures (an engine with `speculative_algorithm`)."""
        for name, key, kind, help_ in (
            ("spec_verify_steps_total", "spec_verify_steps", "counter", "Verify forwards."),
            ("spec_draft_tokens_total", "spec_draft_tokens", "counter", "Drafts proposed."),
            ("spec_accepted_tokens_total", "spec_accepted_tokens", "counter", "Drafts kept."),
            ("spec_accept_length", "spec_accept_length", "gauge", "Tokens per verify forward."),
            ("spec_accept_rate", "spec_accept_rate", "gauge", "Share of drafts kept."),
        ):
            metric(name, kind, help_, [("", float(stats.get(key, 0)))])

    @staticmethod
    def _hicache(metric: Any, stats: dict[str, Any]) -> None:
        """The storage tier's figures (an engine with `enable_hierarchical_cache`)."""
        hits = [('{tier="device"}', stats.get("cache_hit_tokens_device", 0)),
                ('{tier="storage"}', stats.get("cache_hit_tokens_storage", 0))]  # fmt: skip
        metric("cache_hit_tokens_total", "counter", "Prompt tokens found cached, by tier.", hits)
        figures = {
            "hicache_storage_bytes": ("gauge", "Bytes the storage tier holds."),
            "hicache_storage_pages": ("gauge", "KV pages the storage tier holds."),
            "hicache_pages_written": ("counter", "KV pages written to the storage tier."),
            "hicache_pages_loaded": ("counter", "KV pages loaded back from the storage tier."),
            "hicache_load_failures": ("counter", "Stored pages missing or failing their check."),
        }
        for key, (kind, help_) in figures.items():
            name = f"{key}_total" if kind == "counter" else key
            metric(name, kind, help_, [("", float(stats.get(key, 0)))])

    @staticmethod
    def _histogram(out: list[str], name: str, help_: str, counts: list[int], total: float) -> None:
        out.append(f"# HELP {PREFIX}_{name} {help_}")
        out.append(f"# TYPE {PREFIX}_{name} histogram")
        running = 0
        for bound, n in zip(LATENCY_BUCKETS, counts, strict=False):
            running += n
            out.append(f'{PREFIX}_{name}_bucket{{le="{bound}"}} {running}')
        running += counts[-1]
        out.append(f'{PREFIX}_{name}_bucket{{le="+Inf"}} {running}')
        out.append(f"{PREFIX}_{name}_sum {_num(total)}")
        out.append(f"{PREFIX}_{name}_count {running}")


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))
