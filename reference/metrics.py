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
    "(ready, retried, failed, expired, noop_ready, noop_terminal, stale, busy, poison, fenced, lease_lost, deferred; "
    "storage_waited: a job that waited out an object-store outage; render_retried: a cheap render retried once; "
    "abandoned: a claim past its execution deadline)",
    ["outcome"],
)
# BE-JOB-005: expiry has a metric of its own, on every role that can expire a job. Labels: ``role`` (worker,
# sweeper) and ``where`` the deadline was found passed: ``claim`` (the worker's claim of a job already past it),
# ``processing`` (passed while the worker fetched or rendered), ``commit`` (the fenced commit refused it),
# ``sweeper`` (a queued job nobody claimed in time, expired by the sweeper). Each expired job counts once.
EXPIRED = Counter("attachments_expired", "Jobs that reached their expires_at before their effect, by role and where",
                  ["role", "where"])
EXPIRED_WHERE = ("claim", "processing", "commit", "sweeper")


def count_expired(role: str, where: str, n: int = 1) -> None:
    """Count ``n`` jobs that ended expired (``attachments_expired_total{role,where}``)."""
    if n:
        EXPIRED.labels(role, where).inc(n)


class _WorkerExpiredShim:
    """Old name kept for callers not yet moved to count_expired: counts as the worker's."""

    def inc(self, n: int = 1, where: str = "processing") -> None:
        count_expired("worker", where, n)


JOBS_EXPIRED = _WorkerExpiredShim()
JOB_SECONDS = Histogram("reference_job_seconds", "Claim-to-commit time of a job",
                        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
IN_FLIGHT = Gauge("reference_worker_in_flight", "Deliveries being processed by this worker")
LEASE_RENEWALS = Counter("reference_lease_renewals_total", "Lease renewals by result", ["result"])
OUTBOX_PUBLISHED = Counter("reference_outbox_published_total", "Outbox rows published and confirmed")
OUTBOX_FAILURES = Counter("reference_outbox_publish_failures_total", "Publish failures by kind", ["kind"])
SWEEPS = Counter("reference_sweeper_actions_total", "Sweeper actions", ["action"])
REPLAYS = Counter("reference_replays_total", "Operator replays by outcome", ["outcome"])
# Read by the sweeper each sweep (issue 23, observability): the pipeline's state as the database and the broker see it.
JOBS_BY_STATE = Gauge("reference_jobs_by_state", "Jobs per state (sweeper, each sweep)", ["state"])
OLDEST_QUEUED = Gauge("reference_oldest_queued_job_seconds",
                      "How long the oldest due queued job has waited since it became due (0: none)")
OUTBOX_PENDING = Gauge("reference_outbox_pending", "Outbox rows not yet published")
OUTBOX_LAG = Gauge("reference_outbox_lag_seconds",
                   "Age of the oldest due, unpublished outbox row (0: none); sweeper and relay")
QUEUE_MESSAGES = Gauge("reference_queue_messages", "Ready messages per queue (work queues and the dead-letter queue)",
                       ["queue"])
JOB_STATES = ("queued", "processing", "ready", "failed")
OPERATOR_AUTH_REFUSALS = Counter("reference_operator_auth_refusals_total",
                                 "Admin API requests refused for a wrong operator token (403) or too many (429)",
                                 ["status"])


def render() -> tuple[bytes, str]:
    return generate_latest(), CONTENT_TYPE_LATEST


def serve(port: int | None, host: str = "127.0.0.1") -> None:
    """Expose /metrics of a non-HTTP role when METRICS_PORT is set."""
    if port:
        start_http_server(port, addr=host)
