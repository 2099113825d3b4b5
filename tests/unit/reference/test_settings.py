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


# --- validated at start-up (issue 23): a clear refusal naming the setting, not a late failure ---------------------

def _refusal(monkeypatch, capsys, env: dict, role: str = "worker") -> list[str]:
    """Start ``reference ROLE`` with ``env``: it must exit 2 before touching a service, with one line per problem."""
    from reference import cli

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as stopped:
        cli.main([role])
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert all(line.startswith(f"reference {role}: configuration refused: ") for line in lines), lines
    return lines


def test_max_attempts_above_the_queues_delivery_limit_is_refused_at_start(monkeypatch, capsys):
    lines = _refusal(monkeypatch, capsys, {"MAX_ATTEMPTS": "30", "DELIVERY_LIMIT": "20"})
    assert len(lines) == 1 and "MAX_ATTEMPTS (30) must not exceed DELIVERY_LIMIT (20)" in lines[0]
    assert Settings(max_attempts=20, delivery_limit=20).max_attempts == 20  # equal is fine


def test_heartbeat_zero_is_refused_at_start(monkeypatch, capsys):
    lines = _refusal(monkeypatch, capsys, {"AMQP_HEARTBEAT_SECONDS": "0"}, role="relay")
    assert len(lines) == 1 and lines[0].split(": configuration refused: ")[1].startswith("AMQP_HEARTBEAT_SECONDS='0'")


def test_replays_that_would_pass_the_schemas_attempt_maximum_are_refused_at_start(monkeypatch, capsys):
    lines = _refusal(monkeypatch, capsys, {"MAX_ATTEMPTS": "20", "MAX_REPLAYS": "50"}, role="api")
    assert len(lines) == 1 and lines[0].split(": configuration refused: ")[1].startswith("MAX_REPLAYS (50)")
    assert "at most 49 replays fit" in lines[0]
    monkeypatch.delenv("MAX_REPLAYS")
    assert Settings(max_attempts=20, max_replays=49).effective_max_replays == 49
    assert Settings(max_attempts=20).effective_max_replays == 49  # unset: as many as fit
    assert Settings(max_attempts=5).effective_max_replays == 199


def test_several_problems_are_one_line_each_and_secrets_are_not_repeated(monkeypatch, capsys):
    lines = _refusal(monkeypatch, capsys, {"AMQP_HEARTBEAT_SECONDS": "0", "OPERATOR_TOKEN_NAME": "bad name!",
                                           "OPERATOR_TOKEN": "s3cret-value"})
    assert len(lines) == 2
    assert lines[0].split("refused: ")[1].startswith("OPERATOR_TOKEN_NAME") or \
        lines[1].split("refused: ")[1].startswith("OPERATOR_TOKEN_NAME")
    assert not any("s3cret-value" in line for line in lines)


def test_a_prefetch_below_the_concurrency_is_warned_not_refused():
    """The load curve measures prefetch 1 at concurrency 2 on purpose: allowed, with one warning line at start."""
    assert Settings(prefetch=1, worker_concurrency=4).start_warnings() == [
        "PREFETCH (1) is below WORKER_CONCURRENCY (4): at most 1 of the 4 slots can ever be busy"]
    assert Settings(prefetch=4, worker_concurrency=4).start_warnings() == []
    assert Settings(prefetch=16, worker_concurrency=4).start_warnings() == []


def test_the_schemas_attempt_maximum_is_the_one_settings_use():
    import json
    from pathlib import Path

    from reference.settings import SCHEMA_ATTEMPT_MAX

    schema = json.loads((Path(__file__).resolve().parents[3] / "schemas" / "jobs.schema.json").read_text())
    assert schema["properties"]["attempt"]["maximum"] == SCHEMA_ATTEMPT_MAX


def test_an_execution_deadline_within_a_lease_or_a_render_and_its_retry_is_refused_at_start(monkeypatch, capsys):
    lines = _refusal(monkeypatch, capsys, {"EXECUTION_TIMEOUT_SECONDS": "100", "DECODE_TIMEOUT_SECONDS": "60"})
    assert len(lines) == 1 and lines[0].split(": configuration refused: ")[1].startswith(
        "EXECUTION_TIMEOUT_SECONDS (100) must be longer than LEASE_SECONDS (30) and than twice DECODE_TIMEOUT_SECONDS")
    monkeypatch.delenv("EXECUTION_TIMEOUT_SECONDS")
    monkeypatch.delenv("DECODE_TIMEOUT_SECONDS")
    assert Settings(execution_timeout_seconds=121, decode_timeout_seconds=60).execution_timeout_seconds == 121
    assert Settings().execution_timeout_seconds == 1800


def test_audit_kept_shorter_than_a_dead_letter_lives_is_refused_and_the_log_format_is_text_or_json(monkeypatch,
                                                                                                    capsys):
    lines = _refusal(monkeypatch, capsys, {"AUDIT_RETENTION_SECONDS": "3600"}, role="sweeper")
    assert len(lines) == 1 and "AUDIT_RETENTION_SECONDS (3600) must not be shorter than DEAD_LETTER_TTL_SECONDS" \
        in lines[0]
    monkeypatch.delenv("AUDIT_RETENTION_SECONDS")
    lines = _refusal(monkeypatch, capsys, {"LOG_FORMAT": "xml"}, role="relay")
    assert len(lines) == 1 and "LOG_FORMAT" in lines[0]
