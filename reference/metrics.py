"""Prometheus metrics of every role (one registry per process)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest, start_http_server

UPLOADS = Counter("reference_uploads_total", "Upload requests by outcome", ["outcome"])
UPLOAD_SECONDS = Histogram(
    "reference_upload_accept_seconds", "Time from request start to the 202 answer",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
JOBS = Counter(
    "reference_jobs_total",
    "Deliveries handled by the worker, by outcome "
    "(ready, retried, failed, expired, noop_ready, noop_terminal, stale, busy, poison, fenced, lease_lost, deferred)",
    ["outcome"],
)
JOBS_EXPIRED = Counter("reference_jobs_expired_total", "Jobs that reached their expires_at before their effect")
JOB_SECONDS = Histogram("reference_job_seconds", "Claim-to-commit time of a job",
                        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
IN_FLIGHT = Gauge("reference_worker_in_flight", "Deliveries being processed by this worker")
LEASE_RENEWALS = Counter("reference_lease_renewals_total", "Lease renewals by result", ["result"])
OUTBOX_PUBLISHED = Counter("reference_outbox_published_total", "Outbox rows published and confirmed")
OUTBOX_FAILURES = Counter("reference_outbox_publish_failures_total", "Publish failures by kind", ["kind"])
SWEEPS = Counter("reference_sweeper_actions_total", "Sweeper actions", ["action"])
REPLAYS = Counter("reference_replays_total", "Operator replays by outcome", ["outcome"])


def render() -> tuple[bytes, str]:
    return generate_latest(), CONTENT_TYPE_LATEST


def serve(port: int | None, host: str = "127.0.0.1") -> None:
    """Expose /metrics of a non-HTTP role when METRICS_PORT is set."""
    if port:
        start_http_server(port, addr=host)
