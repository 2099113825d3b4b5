import pytest
from pydantic import ValidationError

from reference.settings import Settings, to_libpq_url


def test_design_defaults(monkeypatch):
    for name in ("LEVEL", "LEASE_SECONDS", "MAX_ATTEMPTS", "FAILPOINTS", "PREFETCH", "WORKER_CONCURRENCY"):
        monkeypatch.delenv(name, raising=False)
    s = Settings()
    assert (s.lease_seconds, s.lease_renew_seconds, s.max_attempts) == (30, 10, 20)
    assert (s.retry_base_seconds, s.retry_cap_seconds, s.max_pixels) == (1, 600, 40_000_000)
    assert (s.http_port, s.pipeline_version, s.shutdown_grace_seconds, s.level) == (8000, 1, 25, 4)
    assert s.variants == ("thumbnail", "crop", "optimized")
    assert s.effective_prefetch == s.worker_concurrency


def test_fault_harness_short_timings(monkeypatch):
    env = dict(LEASE_SECONDS="4", LEASE_RENEW_SECONDS="1", SWEEP_INTERVAL_SECONDS="1", RETRY_BASE_SECONDS="0.2",
               RETRY_CAP_SECONDS="2", MAX_ATTEMPTS="5", RELAY_POLL_SECONDS="0.5", LEVEL="3", PREFETCH="3",
               FAILPOINTS="after_commit_before_ack=1*crash")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s = Settings()
    assert (s.lease_seconds, s.retry_base_seconds, s.relay_poll_seconds, s.max_attempts) == (4, 0.2, 0.5, 5)
    assert s.variants == ("thumbnail",) and s.effective_prefetch == 3


def test_bad_failpoints_fail_at_start(monkeypatch):
    monkeypatch.setenv("FAILPOINTS", "after_commit_before_ack=explode")
    with pytest.raises(ValidationError):
        Settings()


def test_renew_must_be_shorter_than_lease():
    with pytest.raises(ValidationError):
        Settings(lease_seconds=5, lease_renew_seconds=5)


def test_renew_defaults_to_a_third_of_the_lease(monkeypatch):
    monkeypatch.delenv("LEASE_RENEW_SECONDS", raising=False)
    assert Settings(lease_seconds=4).lease_renew_seconds == pytest.approx(4 / 3)


def test_level_is_3_4_or_5():
    assert Settings(level=5).variants == Settings(level=4).variants  # level 5 adds pipeline versions, not variants
    for level in (2, 6):
        with pytest.raises(ValidationError):
            Settings(level=level)


def test_database_url_conversion():
    s = Settings(database_url="postgresql://u:p%40ss@127.0.0.1:5432/db?sslmode=disable")
    assert s.psycopg_conninfo == "postgresql://u:p%40ss@127.0.0.1:5432/db?sslmode=disable"
    assert s.sqlalchemy_url == "postgresql+psycopg://u:p%40ss@127.0.0.1:5432/db?sslmode=disable"
    assert to_libpq_url("postgresql+psycopg://h/db") == "postgresql://h/db"
    with pytest.raises(ValueError):
        to_libpq_url("mysql://h/db")
