"""What an operator sees of the server: Prometheus metrics (`/metrics`, `prometheus_client`'s text
format) and one access-log line per request (the `keras_tfm.serve` logger, at INFO)."""

from __future__ import annotations

import logging
import time

LOG = logging.getLogger("keras_tfm.serve")
# seconds: a short answer on a warm server to a long one on a cold server that compiles first
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    """The server's counters, gauges and histograms, in a registry of their own (two servers in one
    process keep theirs apart). `engine`: its queue and busy rows are read at each scrape."""

    def __init__(self, engine):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        kind = dict(registry=self.registry)
        self.requests = Counter(
            "keras_tfm_requests",
            "Requests answered, by route, method and HTTP status",
            ["route", "method", "status"],
            **kind,
        )
        self.prompt_tokens = Counter("keras_tfm_prompt_tokens", "Prompt tokens of the requests decoded", **kind)
        self.generated_tokens = Counter("keras_tfm_generated_tokens", "Tokens generated (every choice)", **kind)
        self.latency = Histogram(
            "keras_tfm_request_seconds", "Seconds from a request to its last byte", ["route"],
            buckets=LATENCY_BUCKETS, **kind,
        )  # fmt: skip
        self.first_token = Histogram(
            "keras_tfm_time_to_first_token_seconds", "Seconds from a streamed request to its first text",
            buckets=LATENCY_BUCKETS, **kind,
        )  # fmt: skip
        waiting = Gauge("keras_tfm_requests_waiting", "Requests waiting for rows", **kind)
        waiting.set_function(engine.waiting)
        if hasattr(engine, "busy_rows"):  # a decoding engine (an embedding server's batcher has no rows)
            busy = Gauge("keras_tfm_rows_busy", "Rows of the cache decoding a request", **kind)
            busy.set_function(lambda: len(engine.busy_rows()))

    def exposition(self) -> tuple[bytes, str]:
        """The metrics as `/metrics` answers them: Prometheus' text format and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class Observed:
    """ASGI middleware: every HTTP request counted in `metrics` by route and status, timed to its last
    byte, and logged in one line (client, method, path, status, seconds), but the polls of `/health` and
    `/metrics`."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - start
            route = scope["path"] if scope["path"] in KNOWN_ROUTES else "other"
            self.metrics.requests.labels(route, scope["method"], str(status[0])).inc()
            self.metrics.latency.labels(route).observe(seconds)
            if scope["path"] not in POLLED:  # a monitor's polls (787 during one warm-up) would bury the requests
                client = scope.get("client") or ("-", 0)
                LOG.info('%s "%s %s" %d %.3fs', client[0], scope["method"], scope["path"], status[0], seconds)


POLLED = ("/health", "/metrics")  # counted in the metrics, not logged

# paths counted under their own name (others are "other", so that a scan cannot grow the label set)
KNOWN_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models", "/health", "/metrics")
