"""All configuration of the reference pipeline, from environment variables.

One class, one place: every limit the roles enforce is a field here with the
default of CONTRACT §8 (or a documented choice where §8 is silent).
"""

from __future__ import annotations

import os
from functools import cached_property
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

VARIANTS_BY_LEVEL: dict[int, tuple[str, ...]] = {
    3: ("thumbnail",),
    4: ("thumbnail", "crop", "optimized"),
    5: ("thumbnail", "crop", "optimized"),  # level 5 adds pipeline versions, not variants
}


# The job message schema's maximum attempt number (schemas/jobs.schema.json, properties.attempt.maximum).
SCHEMA_ATTEMPT_MAX = 1000


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    # --- services (CONTRACT §2) ---
    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    # A RabbitMQ cluster: every node's URL, comma-separated (reference/brokers.py fails over between them).
    amqp_urls: str = ""
    s3_endpoint_url: str = "http://127.0.0.1:8333"
    s3_bucket: str = "attachments"
    s3_access_key: str = ""
    s3_secret_key: str = ""
    s3_region: str = "us-east-1"
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    failpoints: str = ""
    # The bootstrap operator token (empty: none): accepted by the admin API as the operator OPERATOR_TOKEN_NAME,
    # next to the per-operator tokens of `reference operator-token` (hashed in the database; reference/operators.py).
    operator_token: str = ""
    operator_token_name: str = Field("bootstrap", pattern=r"^[A-Za-z0-9._@-]{1,100}$")
    # Wrong operator tokens from one client: after this many within the window, 429 + Retry-After for every token.
    operator_auth_max_failures: int = Field(10, ge=1, le=10_000)
    operator_auth_window_seconds: float = Field(300.0, gt=0)

    # --- pipeline shape ---
    level: int = 4  # 3 → [thumbnail]; 4 and 5 → [thumbnail, crop, optimized]
    pipeline_version: int = Field(1, ge=1, le=1000)
    # Level 5 (docs/CONTRACT.md): GET serves the newest ready version at or below this cap (unset: no cap).
    # A rollback that must stop serving a newer version's results sets it on the API; nothing is deleted.
    served_pipeline_version_max: int | None = Field(None, ge=1, le=1000)

    # --- lease and fencing (CONTRACT §8: 30 s renewed every 10 s) ---
    lease_seconds: float = Field(30.0, gt=0)
    # Unset: a third of the lease (10 s for the default 30 s lease).
    lease_renew_seconds: float | None = Field(None, gt=0)

    # --- retries (full jitter, base 1 s, cap 600 s, 20 attempts) ---
    max_attempts: int = Field(20, ge=1, le=1000)
    # Operator replays of one job; each starts a new round of MAX_ATTEMPTS, and every attempt number must stay
    # within the job message schema's maximum (SCHEMA_ATTEMPT_MAX). Unset: as many as fit.
    max_replays: int | None = Field(None, ge=0, le=1000)
    retry_base_seconds: float = Field(1.0, gt=0)
    retry_cap_seconds: float = Field(600.0, gt=0)

    # --- background loops ---
    sweep_interval_seconds: float = Field(10.0, gt=0)
    relay_poll_seconds: float = Field(1.0, gt=0)
    relay_batch_size: int = Field(100, ge=1, le=10_000)
    # An outbox row the broker returns for want of a route (a pipeline version no worker ever declared a queue for)
    # is deferred this long after it was written, then settled for good: its job ends failed/unroutable.
    outbox_unroutable_give_up_seconds: float = Field(3600.0, gt=0)
    # A queued job whose message was lost (dead-lettered while the DB was down,
    # purged queue, ...) is republished by the sweeper after this long.
    stale_queued_seconds: float = Field(300.0, gt=0)

    # --- worker flow control (prefetch = free worker slots) ---
    worker_concurrency: int = Field(default_factory=lambda: 2 * available_cores(), ge=1, le=1024)
    prefetch: int | None = Field(None, ge=1, le=65535)
    # Batch consumer (BE-JOB-007): up to this many deliveries are taken together, each still claimed, committed
    # and acked on its own; 1 = one delivery at a time. A batch is dispatched when full, when nothing more can
    # arrive (the prefetch window is taken), or this long after its first delivery.
    worker_batch_size: int = Field(1, ge=1, le=1024)
    worker_batch_wait_ms: float = Field(20.0, ge=0, le=60_000)
    image_workers: int = Field(default_factory=available_cores, ge=1, le=256)
    decode_timeout_seconds: float = Field(60.0, gt=0)
    # A replacement render process (after a time limit, a cancel or a process death) must be ready within this
    # long, or it is killed and another one started: a hung start never holds a slot.
    image_worker_start_timeout_seconds: float = Field(30.0, gt=0)

    # AMQP heartbeat: a stopped or hung consumer loses its connection after
    # about two missed beats and the broker returns its prefetched deliveries.
    # Default: the lease length, at least 5 s, at most 60 s.
    # 0 (heartbeats off) is refused at start: a hung peer would then hold its deliveries until TCP gives up.
    amqp_heartbeat_seconds: int | None = Field(None, ge=1, le=600)

    # --- broker topology ---
    delivery_limit: int = Field(20, ge=1)
    # The dead-letter queue's own limit, declared explicitly (RabbitMQ 4.0 defaults a quorum queue to 20, and 4.0-4.2
    # count each return of a read of the dead-letter tools against it): reads never delete a letter.
    dead_letter_delivery_limit: int = Field(1_000_000, ge=1)
    queue_max_length: int = Field(1_000_000, ge=1)
    dead_letter_ttl_seconds: int = Field(7 * 24 * 3600, ge=1)

    # --- expiry and retention ---
    job_ttl_seconds: float = Field(24 * 3600.0, gt=0)
    staging_retention_seconds: float = Field(3600.0, gt=0)
    failed_retention_seconds: float = Field(7 * 24 * 3600.0, gt=0)
    idempotency_ttl_seconds: float = Field(7 * 24 * 3600.0, gt=0)
    outbox_retention_seconds: float = Field(24 * 3600.0, gt=0)
    # The events of a job that has been terminal (ready or failed) this long are pruned, the job's whole path at
    # once; audit rows (replay_audit, dlq_replays, operator_audit) older than AUDIT_RETENTION_SECONDS too.
    events_retention_seconds: float = Field(30 * 24 * 3600.0, gt=0)
    audit_retention_seconds: float = Field(365 * 24 * 3600.0, gt=0)

    # --- deadline per execution (Temporal's start-to-close) ---
    # A claim that has run this long is abandoned and recovered (a new attempt, or failed when the budget is
    # spent), whatever its lease renewal says: a worker that renews but never finishes cannot hold a job for ever.
    execution_timeout_seconds: float = Field(1800.0, gt=0)

    # --- input safety (CONTRACT §3) ---
    max_upload_bytes: int = Field(25 * 1024 * 1024, ge=1)
    max_pixels: int = Field(40_000_000, ge=1)
    max_side: int = Field(20_000, ge=1)
    max_frames: int = Field(100, ge=1)
    # Uploads in progress in one API process; the next one gets 503 + Retry-After before its body is read.
    max_concurrent_uploads: int = Field(32, ge=1, le=10_000)
    # Receiving one upload's body: at most this long in all, and never this long without a byte (408 on expiry,
    # the slot freed): a slow or stalled sender cannot hold an upload slot for ever. 25 MiB in 120 s is ~1.7 Mbit/s.
    upload_receive_timeout_seconds: float = Field(120.0, gt=0)
    upload_idle_timeout_seconds: float = Field(15.0, gt=0)
    # The API's own decoding (integrity check of a file without its format's trailer) runs in this many
    # sandbox processes, each decode killed past the limit (422 decode_timeout); waiting for a free one is
    # bounded by the same limit (503 + Retry-After).
    upload_decode_workers: int = Field(2, ge=1, le=64)
    upload_decode_timeout_seconds: float = Field(10.0, gt=0)

    # --- timeouts ---
    shutdown_grace_seconds: float = Field(25.0, gt=0)
    db_statement_timeout_seconds: float = Field(5.0, gt=0)
    db_connect_timeout_seconds: float = Field(3.0, gt=0)
    s3_timeout_seconds: float = Field(10.0, gt=0)
    retry_after_seconds: int = Field(2, ge=1)

    metrics_port: int | None = None  # non-API roles expose /metrics, /livez and /readyz here when set
    # /livez fails when the role's event loop has not ticked for this long (reference/health.py).
    health_stall_seconds: float = Field(30.0, gt=0)
    # /readyz of a relay fails while the oldest due, unpublished outbox row is older than this.
    relay_ready_max_lag_seconds: float = Field(60.0, gt=0)
    log_level: str = "INFO"
    # text: one line per record; json: one JSON object per line with role, pid and the record's job_id,
    # attachment_id, attempt and trace_id where it names them.
    log_format: str = Field("text", pattern=r"^(text|json)$")
    # OpenTelemetry spans API -> relay -> worker -> S3 (reference/tracing.py): none exports nothing (the global
    # tracer provider, a no-op unless the host installed one; the traceparent still travels), console prints each
    # span on stdout.
    tracing_exporter: str = Field("none", pattern=r"^(none|console)$")

    @field_validator("level")
    @classmethod
    def _known_level(cls, value: int) -> int:
        if value not in VARIANTS_BY_LEVEL:
            raise ValueError("LEVEL must be 3, 4 or 5")
        return value

    @field_validator("failpoints")
    @classmethod
    def _failpoints_parse(cls, value: str) -> str:
        from reference.failpoints import parse_failpoints

        parse_failpoints(value)  # raises ValueError on a typo: fail loudly at start
        return value

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> "Settings":
        if self.lease_renew_seconds is None:
            self.lease_renew_seconds = self.lease_seconds / 3
        if self.lease_renew_seconds >= self.lease_seconds:
            raise ValueError("LEASE_RENEW_SECONDS must be shorter than LEASE_SECONDS")
        return self

    @model_validator(mode="after")
    def _batch_fits_prefetch(self) -> "Settings":
        if self.worker_batch_size > self.effective_prefetch:
            raise ValueError(
                f"WORKER_BATCH_SIZE ({self.worker_batch_size}) must not exceed the prefetch "
                f"({self.effective_prefetch}: PREFETCH, or WORKER_CONCURRENCY when PREFETCH is unset): a batch "
                f"larger than the deliveries the broker may hand out at once never fills; raise PREFETCH")
        return self

    @model_validator(mode="after")
    def _attempts_fit_the_broker_and_the_schema(self) -> "Settings":
        # Before the claim the worker counts deliveries against MAX_ATTEMPTS and dead-letters the message itself,
        # with the cause, recorded on the job; a smaller broker limit would drop it first, without either.
        if self.max_attempts > self.delivery_limit:
            raise ValueError(
                f"MAX_ATTEMPTS ({self.max_attempts}) must not exceed DELIVERY_LIMIT ({self.delivery_limit}): the "
                f"broker would dead-letter a message before the worker's attempt budget is spent, without its cause "
                f"and without recording it on the job; raise DELIVERY_LIMIT or lower MAX_ATTEMPTS")
        fits = SCHEMA_ATTEMPT_MAX // self.max_attempts - 1
        if self.max_replays is not None and self.max_replays > fits:
            raise ValueError(
                f"MAX_REPLAYS ({self.max_replays}) with MAX_ATTEMPTS ({self.max_attempts}): each replay starts a new "
                f"round of MAX_ATTEMPTS attempts, and {self.max_replays + 1} rounds reach attempt "
                f"{(self.max_replays + 1) * self.max_attempts}, past the job message schema's maximum "
                f"({SCHEMA_ATTEMPT_MAX}); at most {fits} replays fit")
        return self

    @model_validator(mode="after")
    def _execution_deadline_fits(self) -> "Settings":
        # A deadline within one lease, or shorter than a render and its one retry, would abandon healthy work.
        floor = max(self.lease_seconds, 2 * self.decode_timeout_seconds)
        if self.execution_timeout_seconds <= floor:
            raise ValueError(
                f"EXECUTION_TIMEOUT_SECONDS ({self.execution_timeout_seconds:g}) must be longer than LEASE_SECONDS "
                f"({self.lease_seconds:g}) and than twice DECODE_TIMEOUT_SECONDS ({self.decode_timeout_seconds:g}: "
                f"a render and its one retry): a shorter deadline abandons work that is going well")
        if self.audit_retention_seconds < self.dead_letter_ttl_seconds:
            raise ValueError(
                f"AUDIT_RETENTION_SECONDS ({self.audit_retention_seconds:g}) must not be shorter than "
                f"DEAD_LETTER_TTL_SECONDS ({self.dead_letter_ttl_seconds}): a dead letter's replay record keeps a "
                f"second replay of the same letter a no-op for as long as the letter can exist")
        return self

    @property
    def effective_max_replays(self) -> int:
        fits = SCHEMA_ATTEMPT_MAX // self.max_attempts - 1
        return fits if self.max_replays is None else self.max_replays

    def start_warnings(self) -> list[str]:
        """Settings that are allowed but rarely meant (one line each, logged at start)."""
        warnings = []
        if self.effective_prefetch < self.worker_concurrency:
            warnings.append(
                f"PREFETCH ({self.effective_prefetch}) is below WORKER_CONCURRENCY ({self.worker_concurrency}): "
                f"at most {self.effective_prefetch} of the {self.worker_concurrency} slots can ever be busy")
        return warnings

    @property
    def variants(self) -> tuple[str, ...]:
        return VARIANTS_BY_LEVEL[self.level]

    @property
    def heartbeat_seconds(self) -> int:
        if self.amqp_heartbeat_seconds is not None:
            return self.amqp_heartbeat_seconds
        return int(min(60, max(5, round(self.lease_seconds))))

    @property
    def effective_prefetch(self) -> int:
        return self.prefetch or self.worker_concurrency

    @cached_property
    def psycopg_conninfo(self) -> str:
        """DATABASE_URL as libpq understands it (driver suffixes removed)."""
        return to_libpq_url(self.database_url)

    @cached_property
    def sqlalchemy_url(self) -> str:
        parts = urlsplit(to_libpq_url(self.database_url))
        return urlunsplit(parts._replace(scheme="postgresql+psycopg"))


def to_libpq_url(url: str) -> str:
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in ("postgresql", "postgres"):
        raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}")
    return urlunsplit(parts._replace(scheme="postgresql"))

