"""Decision logic of one worker delivery (Worker._handle / _process / _not_claimed), without services.

The Worker is built with the real Settings and real Failpoints; only the seams that touch the outside
world are replaced: ``_db_once`` (every SQL statement), the object store, the render pool, the dead-letter
exchange and the delivery itself. Every fake writes into ONE journal, so a test can assert not only what
happened but in which order (an ack must never precede the commit it confirms).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from prometheus_client import REGISTRY

from reference import imaging
from reference import worker as worker_module
from reference import worker_jobs
from reference.db.queries import queries
from reference.keys import variant_key
from reference.messages import JobMessage
from reference.settings import Settings
from reference.storage import ObjectMissing, StorageUnavailable

from reference_fakes import RecordingBackoff

STATEMENT_NAMES = {getattr(queries(), name): name for name in queries().names()}
ORIGINAL = b"original image bytes"
JOB_ID = uuid.UUID("0b7e7c52-3f0e-4a52-9a57-6d2b7c1f9e01")
ATTACHMENT_ID = uuid.UUID("5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e")
VARIANTS = ("thumbnail", "crop", "optimized")
TOKEN = 7


# ------------------------------------------------------------------ fakes


class FakeDatabase:
    """Stands in for Worker._db_once: answers each named statement from ``answers`` (a value, an exception
    to raise, or a callable of the params) and journals it as ``db:<name>``."""

    def __init__(self, journal: list[str]):
        self.journal = journal
        self.calls: list[tuple[str, dict]] = []
        self.answers: dict = {
            "renew_lease": {"lease_expires_at": datetime.now(timezone.utc)},
            "commit_result": {"job_id": JOB_ID, "stored": len(VARIANTS)},
            "retry_job": lambda params: {"job_id": JOB_ID, "attempt": 2, "next_attempt_at": None},
            "fail_job": {"job_id": JOB_ID, "attempt": 1},
        }

    async def __call__(self, sql: str, params: dict):
        name = STATEMENT_NAMES[sql]
        self.journal.append(f"db:{name}")
        self.calls.append((name, params))
        answer = self.answers.get(name)
        if callable(answer):
            answer = answer(params)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def params(self, name: str) -> dict:
        matching = [params for called, params in self.calls if called == name]
        assert len(matching) == 1, f"{name} ran {len(matching)} times"
        return matching[0]


class FakeStore:
    def __init__(self, journal: list[str]):
        self.journal = journal
        self.get_error: BaseException | None = None
        self.put_error: BaseException | None = None
        self.objects: dict[str, bytes] = {}

    def get_bytes(self, key: str) -> bytes:
        self.journal.append("get")
        if self.get_error:
            raise self.get_error
        return ORIGINAL

    def put_bytes(self, key: str, data: bytes, content_type: str, sha256: str | None = None) -> None:
        self.journal.append(f"put:{key}")
        if self.put_error:
            raise self.put_error
        self.objects[key] = data

    def list_prefix(self, prefix: str):
        return [type("Listed", (), {"key": key})() for key in sorted(self.objects) if key.startswith(prefix)]

    def delete(self, key: str) -> None:
        self.journal.append(f"delete:{key}")
        self.objects.pop(key, None)


class FakeRenderPool:
    def __init__(self, journal: list[str]):
        self.journal = journal
        self.error: BaseException | None = None
        self.delay = 0.0

    async def render(self, data: bytes, variants: tuple[str, ...],
                     pixels: int | None = None) -> list[imaging.RenderedVariant]:
        self.journal.append("render")
        self.pixels = pixels
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error:
            raise self.error
        return [imaging.RenderedVariant(name, f"{name}-bytes".encode(), "image/webp", "webp", 64, 64)
                for name in variants]

    def warm_up(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class FakeDeadLetterExchange:
    def __init__(self, journal: list[str]):
        self.journal = journal
        self.published: list = []
        self.error: BaseException | None = None

    async def publish(self, message, routing_key, *, mandatory, timeout):
        self.journal.append("dead_letter")
        if self.error:
            raise self.error
        self.published.append(message)


class FakeDelivery:
    """An incoming AMQP delivery: ack / nack / reject are journaled, with their requeue flag."""

    def __init__(self, journal: list[str], body: bytes, message_id: str | None):
        self.journal = journal
        self.body, self.message_id = body, message_id
        self.headers = {"x-attempt": 1}
        self.content_type = "application/json"

    async def ack(self):
        self.journal.append("ack")

    async def nack(self, requeue: bool = True):
        self.journal.append("nack" if requeue else "nack-drop")

    async def reject(self, requeue: bool = False):
        self.journal.append("reject-requeue" if requeue else "reject")


# ------------------------------------------------------------------ harness


def job_message(attempt: int = 1) -> JobMessage:
    now = datetime.now(timezone.utc)
    return JobMessage(job_id=JOB_ID, attempt=attempt, attachment_id=ATTACHMENT_ID, pipeline_version=1,
                      variants=VARIANTS, created_at=now, expires_at=now + timedelta(hours=1))


def claim_row(attempt: int = 1, attempt_base: int = 0, expired: bool = False) -> dict:
    now = datetime.now(timezone.utc)
    return {"job_id": JOB_ID, "attachment_id": ATTACHMENT_ID, "attempt": attempt, "attempt_base": attempt_base,
            "fencing_token": TOKEN, "pipeline_version": 1, "variants": list(VARIANTS),
            "expires_at": now + timedelta(hours=1), "lease_expires_at": now + timedelta(seconds=30),
            "expired": expired, "expires_in_seconds": -1.0 if expired else 3600.0,
            "original_key": f"staging/{ATTACHMENT_ID}",
            "original_sha256": hashlib.sha256(ORIGINAL).hexdigest(), "original_size": len(ORIGINAL),
            "content_type": "image/png", "original_width": 640, "original_height": 480}


def snapshot_row(state: str, *, attempt: int = 1, token: int = TOKEN, lease_live: bool = True,
                 expired: bool = False) -> dict:
    return {"job_id": JOB_ID, "attachment_id": ATTACHMENT_ID, "state": state, "attempt": attempt,
            "fencing_token": token, "lease_owner": "someone", "lease_expires_at": None,
            "lease_live": lease_live, "expired": expired}


def jobs_counted(outcome: str) -> float:
    return REGISTRY.get_sample_value("reference_jobs_total", {"outcome": outcome}) or 0.0


class Harness:
    def __init__(self, monkeypatch, failpoints: str = "", **settings):
        self.journal: list[str] = []
        self.store = FakeStore(self.journal)
        self.render_pool = FakeRenderPool(self.journal)
        # Construction seams: no process pool is started and no S3 client is built.
        monkeypatch.setattr(worker_module, "RenderPool", lambda *args, **kwargs: self.render_pool)
        monkeypatch.setattr(worker_module.ObjectStore, "from_settings",
                            classmethod(lambda cls, *args, **kwargs: self.store))
        values = {"failpoints": failpoints, "lease_seconds": 30.0, "lease_renew_seconds": 10.0, "max_attempts": 20,
                  "retry_base_seconds": 1.0, "retry_cap_seconds": 600.0, "worker_concurrency": 2,
                  "image_workers": 1, "level": 4}
        values.update(settings)
        self.worker = worker_module.Worker(Settings(**values))
        self.db = FakeDatabase(self.journal)
        monkeypatch.setattr(self.worker, "_db_once", self.db)
        self.dead_letters = FakeDeadLetterExchange(self.journal)
        self.worker.dead_letter_exchange = self.dead_letters

    def delivery(self, job: JobMessage | None = None, *, body: bytes | None = None,
                 message_id: str | None = None) -> FakeDelivery:
        job = job or job_message()
        if body is None:
            body = job.to_body()
        return FakeDelivery(self.journal, body, message_id if message_id is not None else str(job.job_id))

    def handle(self, delivery: FakeDelivery | None = None) -> FakeDelivery:
        delivery = delivery or self.delivery()
        asyncio.run(self.worker._handle(delivery))
        return delivery

    def settlements(self) -> list[str]:
        return [entry for entry in self.journal if entry.split("-")[0] in ("ack", "nack", "reject")]

    def ran(self, name: str) -> bool:
        return f"db:{name}" in self.journal


@pytest.fixture
def harness(monkeypatch) -> Harness:
    return Harness(monkeypatch)


# ------------------------------------------------------------------ poison messages


@pytest.mark.parametrize("body, message_id, reason", [
    (b"{not json", str(JOB_ID), "body is not JSON"),
    (json.dumps({**job_message().to_dict(), "attempt": 0}).encode(), str(JOB_ID), "schema violation at attempt"),
    (json.dumps({**job_message().to_dict(), "source": "s3://bucket/staging/x"}).encode(), str(JOB_ID),
     "an extra field carries a location"),
], ids=["not-json", "schema-violation", "location-in-an-extra-field"])
def test_invalid_message_is_dead_lettered_with_its_reason_and_never_requeued(harness, body, message_id, reason):
    """Poison can never succeed: it goes to the dead-letter exchange and is acked, without touching the DB."""
    harness.handle(harness.delivery(body=body, message_id=message_id))

    assert harness.journal == ["dead_letter", "ack"]
    headers = harness.dead_letters.published[0].headers
    assert headers["x-dead-letter-reason"].startswith(reason)
    assert headers["x-dead-lettered-by"] == harness.worker.identity


def test_failed_dead_letter_publish_rejects_without_requeue(harness):
    """If our own DLX publish fails, reject(requeue=False) hands the poison to the queue's DLX, not back to us."""
    harness.dead_letters.error = ConnectionError("channel closed")

    harness.handle(harness.delivery(body=b"{not json"))

    assert harness.journal == ["dead_letter", "reject"]


# ------------------------------------------------------------------ not claimed


@pytest.mark.parametrize("state, db_attempt, outcome", [
    ("ready", 1, "noop_ready"),
    ("failed", 1, "noop_terminal"),
    ("processing", 1, "busy"),
    ("queued", 2, "stale"),
], ids=["ready", "failed", "processing-elsewhere", "queued-other-attempt"])
def test_unclaimable_job_is_acked_as_a_noop_without_any_write(harness, state, db_attempt, outcome):
    """A job that is done, failed, leased elsewhere or on another attempt needs nothing from this delivery."""
    harness.db.answers["claim_job"] = None
    harness.db.answers["job_snapshot"] = snapshot_row(state, attempt=db_attempt)
    before = jobs_counted(outcome)

    harness.handle()

    assert harness.journal == ["db:claim_job", "db:job_snapshot", "ack"]
    assert jobs_counted(outcome) == before + 1


def test_message_for_an_unknown_job_is_dead_lettered(harness):
    """No job row at all: the message can never be processed, so it is kept for an operator, not dropped."""
    harness.db.answers["claim_job"] = None
    harness.db.answers["job_snapshot"] = None

    harness.handle()

    assert harness.journal == ["db:claim_job", "db:job_snapshot", "dead_letter", "ack"]
    assert harness.dead_letters.published[0].headers["x-dead-letter-reason"].startswith("unknown_job")


def test_claim_params_carry_the_message_attempt_and_this_worker(harness):
    """Only the message of the job's current attempt may claim it, under this worker's identity."""
    harness.db.answers["claim_job"] = None
    harness.db.answers["job_snapshot"] = snapshot_row("ready")

    harness.handle(harness.delivery(job_message(attempt=3)))

    params = harness.db.params("claim_job")
    assert params["job_id"] == JOB_ID and params["attempt"] == 3
    # One owner string per delivery, under this worker's identity: a claim whose reply was lost is adopted.
    assert params["owner"].startswith(harness.worker.identity + "/") and params["lease_seconds"] == 30.0


# ------------------------------------------------------------------ permanent failures


def test_job_expired_at_claim_fails_as_expired_without_doing_the_work(harness):
    """An expired job must not start its effect: no fetch, no render, failed 'expired', then ack."""
    harness.db.answers["claim_job"] = claim_row(expired=True)

    harness.handle()

    assert harness.journal == ["db:claim_job", "db:fail_job", "ack"]
    params = harness.db.params("fail_job")
    assert params["error_code"] == "expired" and params["fencing_token"] == TOKEN


def test_expired_job_is_counted_as_expired_only_when_its_failure_is_recorded(harness):
    """The expiry metric counts recorded expiries: a fail_job refused by the fence is a nack, not an expiry."""
    from reference import metrics

    def expired_total():
        return metrics.EXPIRED.labels("worker", "claim")._value.get()

    harness.db.answers["claim_job"] = claim_row(expired=True)
    before = expired_total()
    harness.handle()
    assert expired_total() == before + 1

    harness.db.answers["fail_job"] = None
    harness.handle()
    assert expired_total() == before + 1 and harness.settlements()[-1] == "nack"


def test_rejected_image_fails_with_the_rejection_code(harness):
    """A permanent image error becomes the job's error_code; nothing is written to S3 or committed."""
    harness.db.answers["claim_job"] = claim_row()
    harness.render_pool.error = imaging.ImageRejected("too_many_pixels", "50000000 > 40000000")

    harness.handle()

    assert harness.journal == ["db:claim_job", "get", "render", "db:fail_job", "ack"]
    params = harness.db.params("fail_job")
    assert params["error_code"] == "too_many_pixels" and params["reason"] == "50000000 > 40000000"
    assert params["fencing_token"] == TOKEN


def test_original_that_differs_from_its_record_fails_without_rendering(harness):
    """The trusted checksum in the DB decides: a changed staging object is never rendered."""
    harness.db.answers["claim_job"] = {**claim_row(), "original_sha256": "0" * 64}

    harness.handle()

    assert harness.journal == ["db:claim_job", "get", "db:fail_job", "ack"]
    assert harness.db.params("fail_job")["error_code"] == "original_checksum_mismatch"


def test_missing_original_fails_as_original_missing(harness):
    """A vanished staging object will not come back: permanent failure, not a retry."""
    harness.db.answers["claim_job"] = claim_row()
    harness.store.get_error = ObjectMissing(f"staging/{ATTACHMENT_ID}")

    harness.handle()

    assert harness.journal == ["db:claim_job", "get", "db:fail_job", "ack"]
    assert harness.db.params("fail_job")["error_code"] == "original_missing"
    assert not harness.ran("retry_job")


def test_failure_not_recorded_because_the_fence_moved_is_nacked(harness):
    """fail_job found no row (lease lost): this worker no longer owns the outcome, so it must not ack."""
    harness.db.answers["claim_job"] = claim_row()
    harness.db.answers["fail_job"] = None
    harness.store.get_error = ObjectMissing("gone")

    harness.handle()

    assert harness.settlements() == ["nack"]


# ------------------------------------------------------------------ transient failures


@pytest.mark.parametrize("where, error", [
    ("get", ConnectionError("reset")),
    ("render", concurrent.futures.process.BrokenProcessPool("a pool process died")),
    ("put", TimeoutError("the write timed out")),
], ids=["connection-error", "broken-pool", "put-timeout"])
def test_transient_error_requeues_through_the_database_with_backoff(harness, where, error):
    """A transient error is a new attempt recorded in the DB (its outbox row delays the message); the delivery
    itself is acked, never nacked into a hot broker redelivery loop. (An unavailable object store is not one of
    these: it is waited out, see test_an_object_store_outage_is_waited_out_without_spending_an_attempt.)"""
    harness.db.answers["claim_job"] = claim_row(attempt=3)
    harness.worker.backoff = RecordingBackoff(12.5)
    if where == "get":
        harness.store.get_error = error
    elif where == "render":
        harness.render_pool.error = error
    else:
        harness.store.put_error = error

    harness.handle()

    assert harness.journal[-2:] == ["db:retry_job", "ack"]
    assert not harness.ran("commit_result") and not harness.ran("fail_job")
    params = harness.db.params("retry_job")
    assert params["fencing_token"] == TOKEN and params["delay_seconds"] == 12.5
    assert params["reason"] == worker_jobs.redact(error)
    assert harness.worker.backoff.asked == [2]  # two failed attempts before this one


def test_retry_backoff_counts_only_the_attempts_of_the_current_round(harness):
    """After an operator replay (attempt_base 10) attempt 12 is the second of the round: backoff(1)."""
    harness.db.answers["claim_job"] = claim_row(attempt=12, attempt_base=10)
    harness.worker.backoff = RecordingBackoff(3.0)
    harness.store.get_error = ConnectionError("reset")

    harness.handle()

    assert harness.worker.backoff.asked == [1]
    assert harness.journal[-2:] == ["db:retry_job", "ack"]


def test_real_backoff_delay_stays_under_its_full_jitter_ceiling(harness):
    """With the configured policy (base 1 s) the first retry waits between 0 and 1 s."""
    harness.db.answers["claim_job"] = claim_row(attempt=1)
    harness.store.get_error = ConnectionError("reset")

    harness.handle()

    assert 0.0 <= harness.db.params("retry_job")["delay_seconds"] <= 1.0


def test_transient_error_on_the_last_attempt_fails_as_attempts_exhausted(harness):
    """Attempt 20 of 20: no further retry is scheduled; the job fails for good."""
    harness.db.answers["claim_job"] = claim_row(attempt=20)
    harness.store.get_error = ConnectionError("reset")

    harness.handle()

    assert harness.journal[-2:] == ["db:fail_job", "ack"]
    assert not harness.ran("retry_job")
    assert harness.db.params("fail_job")["error_code"] == "attempts_exhausted"


def test_retry_not_recorded_because_the_lease_was_lost_is_nacked(harness):
    """retry_job found no row: someone else owns the job now; acking would hide that."""
    harness.db.answers["claim_job"] = claim_row()
    harness.db.answers["retry_job"] = None
    harness.store.get_error = ConnectionError("reset")

    harness.handle()

    assert harness.settlements() == ["nack"]


def test_failpoint_after_s3_write_is_a_transient_error_before_the_commit(monkeypatch):
    """The effects are written but never committed: the attempt is retried, and nothing is published."""
    harness = Harness(monkeypatch, failpoints="after_s3_write_before_commit=error")
    harness.db.answers["claim_job"] = claim_row()

    harness.handle()

    settled = [entry for entry in harness.journal if not entry.startswith("delete:")]
    assert settled[-2:] == ["db:retry_job", "ack"]
    assert sum(entry.startswith("put:") for entry in harness.journal) == len(VARIANTS)
    assert not harness.ran("commit_result")
    # The next attempt writes under a new fencing token: this claim's objects are removed once the retry is recorded.
    puts = [entry[4:] for entry in harness.journal if entry.startswith("put:")]
    deletes = [entry[7:] for entry in harness.journal if entry.startswith("delete:")]
    assert sorted(deletes) == sorted(puts) and harness.journal.index(f"delete:{deletes[0]}") > harness.journal.index("ack")


# ------------------------------------------------------------------ lease lost


def test_lease_lost_mid_job_stops_effects_and_nacks(monkeypatch):
    """The renewal says the lease was taken over while rendering: no S3 write, no commit, no DB outcome and
    no ack; the delivery goes back (nack) and the new owner decides."""
    harness = Harness(monkeypatch, lease_seconds=5.0, lease_renew_seconds=0.05)
    harness.db.answers["claim_job"] = claim_row()
    harness.db.answers["renew_lease"] = None  # fenced: another claim bumped the token
    harness.render_pool.delay = 0.3  # long enough for a renewal to run

    harness.handle()

    assert "db:renew_lease" in harness.journal
    assert harness.settlements() == ["nack"]
    assert not any(entry.startswith("put:") for entry in harness.journal)
    assert not (harness.ran("commit_result") or harness.ran("fail_job") or harness.ran("retry_job"))


# ------------------------------------------------------------------ commit


def test_success_acks_only_after_the_commit(harness):
    """The order that makes the pipeline safe: write every effect, commit once (fenced), THEN ack."""
    harness.db.answers["claim_job"] = claim_row()

    harness.handle()

    keys = [variant_key(ATTACHMENT_ID, 1, name, "webp", TOKEN) for name in VARIANTS]
    assert harness.journal == ["db:claim_job", "get", "render", *(f"put:{key}" for key in keys),
                               "db:commit_result", "ack"]
    assert harness.journal.index("db:commit_result") < harness.journal.index("ack")
    params = harness.db.params("commit_result")
    assert params["fencing_token"] == TOKEN
    assert [row["object_key"] for row in json.loads(params["variants"])] == keys


@pytest.mark.parametrize("snapshot", [
    snapshot_row("processing", token=TOKEN + 1),
    snapshot_row("queued", attempt=2),
    snapshot_row("processing", lease_live=False),
    snapshot_row("ready", token=TOKEN + 1),
], ids=["claimed-by-another-worker", "requeued-by-sweeper", "lease-ran-out", "ready-by-another-commit"])
def test_fenced_commit_is_nacked_never_acked(harness, snapshot):
    """The fence rejected our commit: the result is not ours to confirm, so the delivery is not acked."""
    harness.db.answers["claim_job"] = claim_row()
    harness.db.answers["commit_result"] = None
    harness.db.answers["job_snapshot"] = snapshot
    before = jobs_counted("fenced")

    harness.handle()

    assert harness.settlements() == ["nack"]
    assert harness.journal[-1] == "nack"
    assert not harness.ran("fail_job") and not harness.ran("retry_job")
    assert jobs_counted("fenced") == before + 1


def test_commit_refused_because_the_job_expired_fails_it_as_expired(harness):
    """Still ours, lease live, but past expires_at: the job ends 'expired', and only then is acked."""
    harness.db.answers["claim_job"] = claim_row()
    harness.db.answers["commit_result"] = None
    harness.db.answers["job_snapshot"] = snapshot_row("processing", expired=True)

    harness.handle()

    settled = [entry for entry in harness.journal if not entry.startswith("delete:")]
    assert settled[-4:] == ["db:commit_result", "db:job_snapshot", "db:fail_job", "ack"]
    assert harness.db.params("fail_job")["error_code"] == "expired"
    # No object of an expired job is left behind (keys of its own fencing token: no replay races this).
    assert sum(entry.startswith("delete:") for entry in harness.journal) == len(VARIANTS)
    assert not harness.store.objects


def test_commit_with_unknown_outcome_that_did_land_is_acked(harness):
    """The connection broke during the commit; reading the job back shows OUR token made it ready."""
    harness.db.answers["claim_job"] = claim_row()
    harness.db.answers["commit_result"] = psycopg.OperationalError("server closed the connection")
    harness.db.answers["job_snapshot"] = snapshot_row("ready")

    harness.handle()

    assert harness.journal[-3:] == ["db:commit_result", "db:job_snapshot", "ack"]


def test_commit_with_unknown_outcome_where_another_token_made_it_ready_is_nacked(harness):
    """'ready' alone proves nothing after a broken commit: only our own fencing token means it was our commit."""
    harness.db.answers["claim_job"] = claim_row()
    harness.db.answers["commit_result"] = psycopg.OperationalError("server closed the connection")
    harness.db.answers["job_snapshot"] = snapshot_row("ready", token=TOKEN + 1)

    harness.handle()

    assert harness.settlements() == ["nack"]
    assert harness.journal[-1] == "nack"


def test_failpoint_after_commit_before_ack_nacks_after_the_commit(monkeypatch):
    """The crash window after the commit: the delivery is returned; its redelivery finds the job ready."""
    harness = Harness(monkeypatch, failpoints="after_commit_before_ack=error")
    harness.db.answers["claim_job"] = claim_row()

    harness.handle()

    assert harness.journal[-2:] == ["db:commit_result", "nack"]
    assert "ack" not in harness.journal


# ------------------------------------------------------------------ anything else


def test_unexpected_error_after_the_claim_retries_with_backoff_and_keeps_the_cause(harness):
    """A bug-shaped error after the claim is neither permanent nor a success: a retry through the database
    (backoff, attempt budget) whose reason names the cause — never a hot nack loop that ends in a lease expiry
    with the cause lost."""
    harness.db.answers["claim_job"] = claim_row()
    harness.render_pool.error = KeyError("surprise")

    harness.handle()

    assert harness.settlements() == ["ack"]
    assert harness.ran("retry_job") and not harness.ran("fail_job") and not harness.ran("commit_result")
    assert harness.db.params("retry_job")["reason"] == "KeyError"


def test_database_down_during_shutdown_nacks_instead_of_waiting(harness):
    """Stopping while the DB is unreachable: give the delivery back rather than hold it past the grace period."""
    harness.db.answers["claim_job"] = psycopg.OperationalError("connection refused")
    harness.worker.stop.set()

    harness.handle()

    assert harness.journal == ["db:claim_job", "nack"]


def test_expiry_is_rechecked_after_fetch_and_render_before_the_first_write(harness):
    """Claimed in time, but the deadline passed while the job waited for its fetch and render: the database's
    clock confirms it, and the job ends expired without writing a single object."""
    claim = claim_row()
    claim["expires_in_seconds"] = 0.0  # the deadline was reached right after the claim
    harness.db.answers["claim_job"] = claim
    harness.db.answers["job_expired"] = {"expired": True}

    harness.handle()

    assert not any(entry.startswith("put:") for entry in harness.journal)
    assert harness.ran("job_expired") and not harness.ran("commit_result")
    assert harness.db.params("fail_job")["error_code"] == "expired"
    assert harness.settlements() == ["ack"]


def test_expiry_recheck_defers_to_the_database_clock(harness):
    """The local estimate is conservative; when the database says the job has not expired, the work goes on."""
    claim = claim_row()
    claim["expires_in_seconds"] = 0.0
    harness.db.answers["claim_job"] = claim
    harness.db.answers["job_expired"] = {"expired": False}

    harness.handle()

    assert harness.ran("commit_result") and harness.settlements() == ["ack"]


def test_unclassified_error_before_the_claim_backs_off_then_dead_letters_with_its_cause(harness):
    """A database that refuses the claim for a reason that is neither an outage nor a verdict on the job (a
    trigger raising): never a hot requeue; after max_attempts deliveries it is dead-lettered with the cause."""
    harness.worker.settings.retry_base_seconds = 0.01
    harness.db.answers["claim_job"] = psycopg.errors.RaiseException("trigger says no")
    first = harness.delivery()
    harness.handle(first)
    assert harness.settlements() == ["nack"]
    last = harness.delivery()
    last.headers = {"x-delivery-count": harness.worker.settings.max_attempts - 1}
    harness.journal.clear()
    harness.handle(last)
    assert harness.journal[-2:] == ["dead_letter", "ack"]
    reason = harness.dead_letters.published[-1].headers["x-dead-letter-reason"]
    assert "RaiseException" in reason and "SQLSTATE P0001" in reason


def test_a_job_whose_delivery_is_dead_lettered_is_recorded_failed_not_left_queued(harness):
    """Issue 23 defect 7: the job of a delivery dead-lettered after max_attempts deliveries without a verdict is
    recorded as such (failed, error_code dead_lettered) before the letter goes, so the lost-message safety net does
    not republish it until its TTL."""
    harness.worker.settings.retry_base_seconds = 0.01
    harness.db.answers["claim_job"] = psycopg.errors.RaiseException("trigger says no")
    harness.db.answers["dead_letter_job"] = {"job_id": JOB_ID, "attempt": 1}
    before = jobs_counted("dead_lettered")
    last = harness.delivery()
    last.headers = {"x-delivery-count": harness.worker.settings.max_attempts - 1}
    harness.handle(last)
    assert harness.journal[-3:] == ["db:dead_letter_job", "dead_letter", "ack"]
    params = harness.db.params("dead_letter_job")
    assert (params["job_id"], params["attempt"]) == (JOB_ID, 1) and "RaiseException" in params["reason"]
    assert jobs_counted("dead_lettered") == before + 1


def test_recording_a_dead_lettering_that_the_database_refuses_still_dead_letters(harness):
    harness.worker.settings.retry_base_seconds = 0.01
    harness.db.answers["claim_job"] = psycopg.errors.RaiseException("trigger says no")
    harness.db.answers["dead_letter_job"] = psycopg.errors.RaiseException("trigger says no again")
    last = harness.delivery()
    last.headers = {"x-delivery-count": harness.worker.settings.max_attempts - 1}
    harness.handle(last)
    assert harness.journal[-3:] == ["db:dead_letter_job", "dead_letter", "ack"]


def raise_exception_answers(harness) -> None:
    """The fake database raises an exception answer only when given directly; one computed by a callable answer is
    returned. Make the worker's database calls raise those too."""
    original = harness.db.__call__

    async def call(sql, params):
        answer = await original(sql, params)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    harness.worker._db_once = call


def test_read_only_database_is_waited_out_like_an_outage(harness):
    """A read-only database (failover, maintenance) is the database's condition: the claim waits with backoff and
    goes on once writes are accepted again — no requeue, no attempt spent."""
    answers = iter([psycopg.errors.ReadOnlySqlTransaction("read-only")] * 2 + [claim_row()])
    harness.db.answers["claim_job"] = lambda params: next(answers)
    raise_exception_answers(harness)
    harness.handle()

    assert harness.journal.count("db:claim_job") == 3 and harness.ran("commit_result")
    assert harness.settlements() == ["ack"]


def test_a_claim_whose_reply_was_lost_is_adopted_not_left_to_the_lease_recovery(harness):
    """The claim committed but the connection broke before its reply: the retry finds the job processing under
    this delivery's own owner string and adopts it — no `busy` ack, no attempt spent by a lease expiry."""
    answers = iter([psycopg.OperationalError("server closed the connection"), None])
    harness.db.answers["claim_job"] = lambda params: next(answers)
    harness.db.answers["adopt_claim"] = claim_row()
    raise_exception_answers(harness)
    harness.handle()

    assert harness.db.params("adopt_claim")["owner"] == harness.db.calls[0][1]["owner"]
    assert harness.ran("commit_result") and harness.settlements() == ["ack"]
    assert not harness.ran("job_snapshot")


def test_stopping_after_the_claim_releases_the_job_without_spending_an_attempt(harness):
    """Shutdown while the job is ours (its commit waits for the database): processing → queued with the same
    attempt (release_job), and the delivery goes back unacked — not a lease expiry that costs an attempt."""
    harness.db.answers["claim_job"] = claim_row()
    harness.db.answers["release_job"] = {"job_id": JOB_ID, "attempt": 1}

    def commit(params):
        harness.worker.stop.set()
        return psycopg.OperationalError("connection refused")

    harness.db.answers["commit_result"] = commit
    harness.db.answers["job_snapshot"] = psycopg.OperationalError("connection refused")
    raise_exception_answers(harness)
    harness.handle()

    assert harness.ran("release_job") and harness.settlements() == ["nack"]
    assert harness.db.params("release_job")["fencing_token"] == TOKEN
    assert not (harness.ran("retry_job") or harness.ran("fail_job"))


# ------------------------------------------------------------------ issue 23 defects 2 and 8


class FlakyStore(FakeStore):
    """The object store down for the first ``down`` calls (StorageUnavailable), then up."""

    def __init__(self, journal: list[str], down: int):
        super().__init__(journal)
        self.down = down

    def _outage(self) -> None:
        if self.down > 0:
            self.down -= 1
            raise StorageUnavailable("s3 unreachable: EndpointConnectionError")

    def get_bytes(self, key: str) -> bytes:
        self.journal.append("get")
        self._outage()
        return ORIGINAL

    def put_bytes(self, key: str, data: bytes, content_type: str, sha256: str | None = None) -> None:
        self.journal.append(f"put:{key}")
        self._outage()
        self.objects[key] = data


def _quick_waits(monkeypatch) -> None:
    import itertools

    monkeypatch.setattr(worker_jobs, "reconnect_delays", lambda *args: itertools.repeat(0.01))


@pytest.mark.parametrize("where", ["get", "put"])
def test_an_object_store_outage_is_waited_out_without_spending_an_attempt(harness, monkeypatch, where):
    """Issue 23 defect 8: the store's outage is not the job's error — no retry_job (a new attempt), no
    attempts_exhausted at the end of the budget: the claim is held and the call tried again until the store is
    back, then the job commits on its own attempt."""
    _quick_waits(monkeypatch)
    harness.db.answers["claim_job"] = claim_row(attempt=20)  # the last attempt of the budget
    store = FlakyStore(harness.journal, down=0)
    harness.worker.store = store
    if where == "get":
        store.down = 25
    else:
        original_get = store.get_bytes

        def get_then_down(key):
            data = original_get(key)
            store.down = 25  # down from the first variant write on
            return data

        store.get_bytes = get_then_down

    harness.handle()

    assert harness.ran("commit_result") and harness.settlements() == ["ack"]
    assert not (harness.ran("retry_job") or harness.ran("fail_job"))
    assert sum(1 for entry in harness.journal if entry == "get" or entry.startswith("put:")) >= 25


def test_an_object_store_outage_past_the_job_deadline_ends_it_expired(harness, monkeypatch):
    """The wait for the store is bounded by the job's TTL: past its deadline (the database's clock confirms)
    the job ends failed/expired, not attempts_exhausted and not waiting forever."""
    _quick_waits(monkeypatch)
    claim = claim_row()
    claim["expires_in_seconds"] = 0.05
    harness.db.answers["claim_job"] = claim
    harness.db.answers["job_expired"] = {"expired": True}
    harness.worker.store = FlakyStore(harness.journal, down=10 ** 6)

    harness.handle()

    assert harness.db.params("fail_job")["error_code"] == "expired"
    assert not harness.ran("retry_job") and not harness.ran("commit_result")
    assert harness.settlements() == ["ack"]


def test_stopping_while_the_store_is_down_releases_the_job(harness, monkeypatch):
    """A stop during the wait for the store gives the job back on the same attempt (release_job) and the
    delivery back unacked."""
    _quick_waits(monkeypatch)
    harness.db.answers["claim_job"] = claim_row()
    harness.db.answers["release_job"] = {"job_id": JOB_ID, "attempt": 1}
    store = FlakyStore(harness.journal, down=10 ** 6)
    harness.worker.store = store
    calls = []

    def get_and_stop(key):
        calls.append(key)
        if len(calls) == 3:
            harness.worker.stop.set()
        return FlakyStore.get_bytes(store, key)

    store.get_bytes = get_and_stop

    harness.handle()

    assert harness.ran("release_job") and harness.settlements() == ["nack"]
    assert not (harness.ran("retry_job") or harness.ran("fail_job"))


def test_a_delivery_of_the_jobs_own_attempt_found_queued_claims_again_not_acked_as_stale(harness):
    """Issue 23 defect 2 (the race): the claim found the job processing elsewhere, whose owner released it (a
    drain) before the snapshot read it: queued at this very delivery's attempt. That delivery is the job's
    message — it claims again; acking it as stale left the job without one."""
    claims = iter([None, claim_row()])
    harness.db.answers["claim_job"] = lambda params: next(claims)
    harness.db.answers["job_snapshot"] = snapshot_row("queued", attempt=1)
    before = jobs_counted("stale")

    harness.handle()

    assert harness.journal[:3] == ["db:claim_job", "db:job_snapshot", "db:claim_job"]
    assert harness.ran("commit_result") and harness.settlements() == ["ack"]
    assert jobs_counted("stale") == before


def test_a_claim_that_keeps_finding_its_own_attempt_queued_gives_up_as_stale(harness):
    """Bounded: a claim refused again and again while the job reads queued at the same attempt (it cannot be
    claimed by this worker for a reason the snapshot does not show) is acked as stale after CLAIM_RACES tries."""
    harness.db.answers["claim_job"] = None
    harness.db.answers["job_snapshot"] = snapshot_row("queued", attempt=1)

    harness.handle()

    assert harness.journal.count("db:claim_job") == worker_jobs.CLAIM_RACES + 1
    assert harness.settlements() == ["ack"]


def test_the_render_is_told_the_pixels_the_upload_recorded(harness):
    """Issue 23 defect 12: whether a time-out earns a retry is judged from the dimensions the API read from the
    header at the upload (the attachment's width and height), never by parsing the image in the worker's process."""
    harness.db.answers["claim_job"] = claim_row()

    harness.handle()

    assert harness.render_pool.pixels == 640 * 480
