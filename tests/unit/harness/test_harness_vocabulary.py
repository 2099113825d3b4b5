"""The adapter maps a service's own vocabulary (docs/CONTRACT.md §9, harness/vocabulary.py): state names, API paths,
metrics paths, ${VAR} in environment values, durations and their units, and transitions read with [events] sql.
Each mapping is tested where the harness applies it (the observer, the final read, the uploader, the supervisor,
the scenario's timing overrides, `adapter check`), and the schema accepts exactly what the code accepts."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import tomllib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import jsonschema
import pytest

from harness import adapter as adapter_mod
from harness import events_sql, final_state, http_clients, vocabulary as vocab
from harness.adapter_check import check, render
from harness.checkers import state_regression
from harness.checkers.base import INVALID, VALID
from harness.observe import ApiObserver
from harness.supervisor import Supervisor
from harness.workload import Uploader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness_histories import ATT, Builder  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((REPO / "schemas" / "adapter.schema.json").read_text())
WORDS = {"PENDING": "queued", "RUNNING": "processing", "DONE": "ready", "ERROR": "failed"}

# A wrapper-free adapter of a service with its own names (the one docs/guides/port-an-existing-service.md shows).
PORTED = textwrap.dedent('''
    adapter_version = 1
    name = "ported"
    level = 4

    [env]
    TS_DB_URL = "${DATABASE_URL}"
    TS_JDBC = "jdbc:postgresql://${DATABASE_HOST}:${DATABASE_PORT}/${DATABASE_NAME}?user=${DATABASE_USER}"
    TS_RABBIT_VHOST = "${AMQP_VHOST}"
    AWS_ACCESS_KEY_ID = "${S3_ACCESS_KEY}"
    AWS_SECRET_ACCESS_KEY = "${S3_SECRET_KEY}"
    AWS_ENDPOINT_URL_S3 = "${S3_ENDPOINT_URL}"
    TS_PRICE = "costs $$5, $ stays"
    TS_LEASE_MS = "4000"

    [timings]
    lease_seconds = "4s"
    lease_renew_seconds = "PT1S"
    max_attempts = 5
    sweep_interval_seconds = "1000ms"
    retry_base_seconds = "200ms"
    retry_cap_seconds = 2
    relay_poll_seconds = 0.5
    staging_retention_seconds = "5s"
    job_ttl_seconds = "PT24H"
    decode_timeout_seconds = "20s"

    [timings_env]
    job_ttl_seconds = { env = "TS_JOB_TTL_MS", unit = "ms" }
    max_attempts = "TS_MAX_ATTEMPTS"
    decode_timeout_seconds = { env = "TS_DECODE_LIMIT", unit = "iso8601" }

    [vocabulary]
    states = { PENDING = "queued", RUNNING = "processing", DONE = "ready", ERROR = "failed" }

    [paths]
    upload = "/v1/files"
    status = "/v1/files/{id}"

    [events]
    sql = 'SELECT id AS seq, at, from_state AS "from", to_state AS "to", attempt, actor, reason FROM job_events WHERE attachment_id = %(attachment_id)s ORDER BY id'

    [http]
    metrics_path = "/prom"

    [metrics]
    roles = ["worker", "sweeper"]
    env = { TS_METRICS_LISTEN = "127.0.0.1:{metrics_port}", TS_METRICS_HOST = "${S3_HOST}" }
    path = "/internal/metrics"

    [roles.api]
    command = ["/bin/true", "api"]
    env = { TS_PORT = "${HTTP_PORT}", TS_FAILPOINTS = "${FAILPOINTS}" }

    [roles.worker]
    command = ["/bin/true", "worker"]

    [roles.sweeper]
    command = ["/bin/true", "sweeper"]
    recovers_work = true
    metrics_path = "/sweeper-metrics"

    [broker]
    work_queue = "ts.render"

    [capabilities]
    failpoints = true
    replay = true
''')

HARNESS_ENV = {"DATABASE_URL": "postgresql://u%40x:p%3Aw@127.0.0.1:15432/tenant_7", "AMQP_URL":
               "amqp://guest:guest@127.0.0.1:15672/t-7", "S3_ENDPOINT_URL": "http://127.0.0.1:18333",
               "S3_BUCKET": "b7", "S3_ACCESS_KEY": "ak", "S3_SECRET_KEY": "sk", "HTTP_PORT": "18080", "LEVEL": "4",
               "OPERATOR_TOKEN": "tok", "FAILPOINTS": "", "TMPDIR": "/tmp/r7"}


@pytest.fixture
def ported(tmp_path):
    path = tmp_path / "adapter.toml"
    path.write_text(PORTED)
    return adapter_mod.load(path)


# --- state names and paths ----------------------------------------------------------------------------------------

def test_state_names_map_in_bodies_versions_and_events():
    words = vocab.Vocabulary(states=WORDS)
    body = words.body({"state": "DONE", "versions": [{"pipeline_version": 2, "state": "RUNNING"}], "attempt": 1})
    assert body["state"] == "ready" and body["versions"][0]["state"] == "processing" and body["attempt"] == 1
    assert words.event({"from": None, "to": "PENDING", "seq": 1}) == {"from": None, "to": "queued", "seq": 1}
    assert words.state("queued") == "queued"  # an unmapped name is taken as a contract name
    assert words.is_unknown("WAITING") and not words.is_unknown("DONE") and not words.is_unknown(None)
    assert vocab.DEFAULT.body({"state": "DONE"}) == {"state": "DONE"}  # no vocabulary: nothing translated


def test_paths_default_to_the_contracts_and_take_the_adapters(ported):
    assert vocab.DEFAULT.status_path("a1") == "/v1/attachments/a1"
    assert vocab.DEFAULT.events_path("a1") == "/v1/attachments/a1/events"
    words = ported.vocabulary
    assert (words.upload_path(), words.status_path("a1"), words.events_path("a1")) == (
        "/v1/files", "/v1/files/a1", "/v1/attachments/a1/events")
    assert words.states == WORDS


def test_metrics_path_per_role(ported):
    assert ported.metrics_path("api") == "/prom"                   # [http] metrics_path
    assert ported.metrics_path("worker") == "/internal/metrics"    # [metrics] path
    assert ported.metrics_path("sweeper") == "/sweeper-metrics"    # the role's own
    plain = adapter_mod.load(REPO / "examples" / "go-pipeline" / "adapter.toml")
    assert plain.metrics_path("api") == plain.metrics_path("worker") == "/metrics"


# --- durations ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("250ms", 0.25), ("30s", 30), ("5m", 300), ("2h", 7200), ("1.5s", 1.5),
                                           ("PT30S", 30), ("PT0.25S", 0.25), ("PT5M", 300), ("P1DT2H", 93600),
                                           ("PT1H30M", 5400), (4, 4), (0.2, 0.2)])
def test_durations_in_seconds(text, seconds):
    assert vocab.seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5 s", "5sec", "PT", "P", "P1DT", "-1s", "pt30s", "1e3ms", "PT1S2M"])
def test_not_durations_are_refused_by_code_and_schema_alike(text):
    with pytest.raises(vocab.VocabularyError):
        vocab.seconds(text)
    assert not re.fullmatch(vocab.DURATION_PATTERN, text) and not re.search(vocab.DURATION_PATTERN, text)


@pytest.mark.parametrize("value, unit, text", [(3, "ms", "3000"), (0.25, "ms", "250"), (0.2, "s", "0.2"),
                                               (86400, "s", "86400"), (90, "m", "1.5"), (7200, "h", "2"),
                                               (3, "iso8601", "PT3S"), (0.5, "iso8601", "PT0.5S")])
def test_a_timing_is_written_in_the_unit_its_variable_takes(value, unit, text):
    assert vocab.format_duration(value, unit) == text


def test_declared_durations_are_seconds_and_overrides_use_the_unit(ported):
    assert ported.timings["lease_seconds"] == 4 and ported.timings["retry_base_seconds"] == 0.2
    assert ported.timings["job_ttl_seconds"] == 86400 and ported.timings["sweep_interval_seconds"] == 1
    assert ported.timings_env == {"job_ttl_seconds": "TS_JOB_TTL_MS", "max_attempts": "TS_MAX_ATTEMPTS",
                                  "decode_timeout_seconds": "TS_DECODE_LIMIT"}
    effective, env = ported.timing_overrides({"job_ttl_seconds": 3, "max_attempts": 6, "decode_timeout_seconds": 1.5})
    assert env == {"TS_JOB_TTL_MS": "3000", "TS_MAX_ATTEMPTS": "6", "TS_DECODE_LIMIT": "PT1.5S"}
    assert effective["job_ttl_seconds"] == 3 and effective["lease_seconds"] == 4
    assert ported.summary()["timings"]["lease_renew_seconds"] == 1  # run.json: what the checkers read, in seconds


# --- ${VAR} -------------------------------------------------------------------------------------------------------

def test_variables_and_their_parts_resolve_from_the_instances_own_environment():
    env = {**HARNESS_ENV, "MINE": "jdbc:postgresql://${DATABASE_HOST}:${DATABASE_PORT}/${DATABASE_NAME}",
           "USERPW": "${DATABASE_USER}/${DATABASE_PASSWORD}", "VH": "${AMQP_VHOST}@${AMQP_HOST}:${AMQP_PORT}",
           "S3": "${S3_HOST}:${S3_PORT}", "URLS": "[${AMQP_URLS}]", "LIT": "a$$b $c"}
    out = vocab.interpolate_env(env, ["MINE", "USERPW", "VH", "S3", "URLS", "LIT"])
    assert out["MINE"] == "jdbc:postgresql://127.0.0.1:15432/tenant_7"
    assert out["USERPW"] == "u@x/p:w"   # percent-decoded
    assert out["VH"] == "t-7@127.0.0.1:15672"
    assert out["S3"] == "127.0.0.1:18333"
    assert out["URLS"] == "[]"          # AMQP_URLS: only on a cluster
    assert out["LIT"] == "a$b $c"
    # A role with a proxy of its own (a network fault aimed at it) sees its own port in the same reference.
    own = vocab.interpolate_env({**env, "DATABASE_URL": "postgresql://u:p@127.0.0.1:25000/tenant_7"}, ["MINE"])
    assert own["MINE"] == "jdbc:postgresql://127.0.0.1:25000/tenant_7"
    assert vocab.variable("AMQP_VHOST", {"AMQP_URL": "amqp://g:g@h:1"}) == "/"
    with pytest.raises(vocab.VocabularyError, match="known: DATABASE_URL"):
        vocab.interpolate("${DB_URL}", env)


def test_the_schema_patterns_are_the_codes():
    defs = SCHEMA["$defs"]
    assert defs["interpolated"]["pattern"] == vocab.ENV_VALUE_PATTERN
    assert defs["duration"]["pattern"] == defs["duration_positive"]["pattern"] == vocab.DURATION_PATTERN
    assert SCHEMA["properties"]["events"]["properties"]["sql"]["pattern"] == vocab.EVENTS_SQL_PATTERN
    assert SCHEMA["properties"]["timings_env"]["additionalProperties"]["properties"]["unit"]["enum"] == list(vocab.UNITS)
    assert SCHEMA["properties"]["vocabulary"]["properties"]["states"]["additionalProperties"]["enum"] == list(
        vocab.CONTRACT_STATES)
    for name in vocab.KNOWN_VARIABLES:  # the schema's description lists every known variable
        assert name in defs["interpolated"]["description"], name


def test_the_supervisor_starts_a_role_with_its_references_resolved(tmp_path, ported):
    supervisor = Supervisor(tmp_path, isolate=False)
    supervisor.prepare_env = ported.interpolate_env
    env = {**HARNESS_ENV, "PATH": "/usr/bin:/bin", **ported.env, **ported.roles["api"].env,
           "FAILPOINTS": "after_staging_before_record=1*crash"}
    supervisor.add("api", "api", ["/usr/bin/env"], env)
    instance = supervisor.start("api")
    instance.process.wait(timeout=10)
    seen = dict(line.split("=", 1) for line in instance.log_path.read_text().splitlines()
                if "=" in line and not line.startswith("==="))
    assert seen["TS_DB_URL"] == HARNESS_ENV["DATABASE_URL"]
    assert seen["TS_JDBC"] == "jdbc:postgresql://127.0.0.1:15432/tenant_7?user=u@x"
    assert seen["AWS_ACCESS_KEY_ID"] == "ak" and seen["TS_PORT"] == "18080"
    assert seen["TS_FAILPOINTS"] == "after_staging_before_record=1*crash"  # armed at start, under its own name
    assert seen["TS_PRICE"] == "costs $5, $ stays"
    assert instance.armed == {"after_staging_before_record": "1*crash"}


# --- what the observers read --------------------------------------------------------------------------------------

class _History:
    def __init__(self):
        self.events = []

    def append(self, type_, **fields):
        self.events.append({"type": type_, **fields})

    def of(self, type_):
        return [e for e in self.events if e["type"] == type_]


class _Rows:
    """An [events] sql reader answering from a list (what SqlEvents returns once it has read the rows)."""

    def __init__(self, events):
        self.events, self.asked, self.closed = events, [], False

    def read(self, attachment_id):
        self.asked.append(attachment_id)
        return self.events

    def close(self):
        self.closed = True


def _api(states: list[str]):
    """A fake API answering on the ported service's paths; each status read returns the next state."""
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == f"/v1/files/{ATT}":
            state = states.pop(0) if len(states) > 1 else states[0]
            return httpx.Response(200, json={"attachment_id": ATT, "state": state, "attempt": 1})
        if request.url.path == "/v1/files":
            return httpx.Response(202, json={"attachment_id": ATT, "job_id": "j1", "status_url": "/v1/files/x"})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": request.url.path}})

    return httpx.MockTransport(handler), calls


def test_the_observer_reads_the_services_paths_and_names_and_the_sql_events(ported):
    transport, calls = _api(["PENDING", "DONE"])
    history = _History()
    rows = _Rows([{"seq": 1, "at": "2026-12-02T00:00:00Z", "from": None, "to": "PENDING", "attempt": 1,
                   "actor": "api", "reason": None},
                  {"seq": 2, "at": "2026-12-02T00:00:01Z", "from": "PENDING", "to": "RUNNING", "attempt": 1,
                   "actor": "worker", "reason": None}])
    observer = ApiObserver("http://sut", history, transport=transport, vocabulary=ported.vocabulary,
                           events_reader=rows)
    observer.watch(ATT)
    observer.poll_one(ATT)
    observer.poll_one(ATT)
    assert [e["state"] for e in history.of("state")] == ["queued", "ready"]
    assert [(e["from"], e["to"]) for e in history.of("transition")] == [(None, "queued"), ("queued", "processing")]
    assert set(calls) == {f"/v1/files/{ATT}"} and rows.asked == [ATT, ATT]  # no GET /events at all
    assert observer.states[ATT] == "ready" and ATT in observer._terminal
    assert not history.of("note")
    observer.close()
    assert rows.closed


def test_an_unknown_state_is_recorded_as_reported_and_noted_not_a_crash(ported):
    transport, _ = _api(["WAITING"])
    history = _History()
    observer = ApiObserver("http://sut", history, transport=transport, vocabulary=ported.vocabulary,
                           events_reader=_Rows([{"seq": 1, "at": "2026-12-02T00:00:00Z", "from": None,
                                                 "to": "SCHEDULED", "attempt": 1, "actor": "api", "reason": None}]))
    observer.watch(ATT)
    observer.poll_one(ATT)
    observer.poll_one(ATT)
    assert [e["state"] for e in history.of("state")] == ["WAITING"]
    assert history.of("transition")[0]["to"] == "SCHEDULED"
    notes = history.of("note")
    assert [n["state"] for n in notes] == ["WAITING", "SCHEDULED"] and all(n["attachment_id"] == ATT for n in notes)
    observer.close()


def test_an_events_query_that_fails_is_noted_and_the_poll_goes_on(ported):
    class Broken(_Rows):
        def read(self, attachment_id):
            raise RuntimeError("relation job_events does not exist")

    transport, _ = _api(["PENDING"])
    history = _History()
    observer = ApiObserver("http://sut", history, transport=transport, vocabulary=ported.vocabulary,
                           events_reader=Broken([]))
    observer.watch(ATT)
    observer.poll_one(ATT)
    observer.poll_one(ATT)
    assert [e["state"] for e in history.of("state")] == ["queued"]
    assert len(history.of("note")) == 1 and "job_events" in history.of("note")[0]["error"]
    observer.close()


def test_the_final_read_uses_the_paths_names_and_sql_events(monkeypatch, ported):
    transport, calls = _api(["DONE"])

    class S3:
        def list_objects_v2(self, **kwargs):
            return {"Contents": []}

    monkeypatch.setattr(final_state, "s3_client", lambda env: S3())
    monkeypatch.setattr(http_clients, "client", lambda **kw: httpx.Client(transport=transport, **kw))
    rows = _Rows([{"seq": 1, "at": "2026-12-02T00:00:00Z", "from": None, "to": "PENDING", "attempt": 1,
                   "actor": "api", "reason": None}])
    final = final_state.read_final("http://sut", [ATT], {"S3_BUCKET": "b"}, events=ported.has("events"),
                                   vocabulary=ported.vocabulary, events_reader=rows)
    record = final["attachments"][ATT]
    assert record["body"]["state"] == "ready" and record["events"][0]["to"] == "queued"
    assert final["read_ok"] and rows.closed and calls == [f"/v1/files/{ATT}"]


def test_the_uploader_posts_to_the_services_upload_path():
    transport, calls = _api(["PENDING"])
    history = _History()
    from harness.workload import UploadOp

    op = UploadOp(op="u1", kind="good", filename="a.png", fmt="png", content_type="image/png", data=b"x" * 10,
                  idempotency_key="k1")
    Uploader(httpx.Client(transport=transport, base_url="http://sut"), history, path="/v1/files").upload(op)
    assert calls == ["/v1/files"] and history.of("ok")[0]["attachment_id"] == ATT


# --- [events] sql rows --------------------------------------------------------------------------------------------

def test_sql_rows_become_the_contracts_events():
    at = datetime(2026, 12, 2, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=3)))
    events = events_sql.rows_to_events(["FROM", "to", "at", "attempt", "actor", "reason", "extra"],
                                       [(None, "PENDING", at, 1, "api", None, "x"),
                                        ("PENDING", "RUNNING", datetime(2026, 12, 2, 1, 0, 0), "2", "w", "claim", 0)])
    assert events[0] == {"seq": 1, "at": "2026-12-02T00:04:05.123456Z", "from": None, "to": "PENDING", "attempt": 1,
                         "actor": "api", "reason": None}
    assert events[1]["seq"] == 2 and events[1]["attempt"] == 2 and events[1]["at"] == "2026-12-02T01:00:00Z"
    with pytest.raises(events_sql.EventsQueryError, match="no column from, to"):
        events_sql.rows_to_events(["from_state", "to_state", "at"], [])


def test_sql_events_satisfy_the_events_capability(ported, tmp_path):
    assert ported.capabilities["events"] is True and ported.summary()["events_from"] == "sql"
    no_events = tmp_path / "none.toml"
    sql_table = PORTED[PORTED.index("[events]"):PORTED.index("[http]")]
    no_events.write_text(PORTED.replace(sql_table, "").replace("replay = true\n", "replay = true\nevents = false\n"))
    assert adapter_mod.load(no_events).has("events") is False
    reader = ported.events_reader({"DATABASE_URL": "postgresql://u:p@127.0.0.1:1/db"})
    assert isinstance(reader, events_sql.SqlEvents) and reader.sql == ported.events_sql
    assert adapter_mod.load(REPO / "examples" / "go-pipeline" / "adapter.toml").events_reader(HARNESS_ENV) is None


# --- the checkers and adapter check -------------------------------------------------------------------------------

def test_a_polled_state_outside_the_contract_is_a_finding_with_evidence():
    b = Builder()
    b.upload(0, ATT)
    b.add(0.3, "state", attachment_id=ATT, state="queued", attempt=1)
    b.add(0.6, "state", attachment_id=ATT, state="WAITING", attempt=1)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (2, "processing", "ready", 1, "worker")])
    verdict = state_regression.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID, verdict
    assert "'WAITING' is not a contract state" in verdict.evidence[0]["message"]
    assert verdict.evidence[0]["attachment_id"] == ATT and verdict.evidence[0]["history"][0]["state"] == "WAITING"
    clean = Builder()
    clean.upload(0, ATT)
    clean.add(0.3, "state", attachment_id=ATT, state="queued", attempt=1)
    clean.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                            (2, "processing", "ready", 1, "worker")])
    assert state_regression.check(clean.history(), clean.final, clean.run).status == VALID


def test_adapter_check_accepts_the_ported_adapter_and_says_how_it_speaks_to_it(tmp_path):
    path = tmp_path / "adapter.toml"
    path.write_text(PORTED)
    report = check(path)
    assert report.ok, render(report)
    text = render(report)
    assert "states: PENDING -> queued, RUNNING -> processing, DONE -> ready, ERROR -> failed" in text
    assert "paths: upload POST /v1/files, status GET /v1/files/{id}" in text
    assert "events: read by the harness from the database ([events] sql, read only)" in text
    assert "metrics: api /prom, worker /internal/metrics, sweeper /sweeper-metrics" in text
    assert "TS_JDBC=jdbc:postgresql://${DATABASE_HOST}" in text
    assert "capabilities.events" not in " ".join(str(w) for w in report.warnings)  # events provided by the query
    assert not any("state_regression needs" in r.why for r in report.plan)


@pytest.mark.parametrize("old, new, field, says", [
    ('"${DATABASE_URL}"', '"${DB_URL}"', "env.TS_DB_URL", "unknown variable ${DB_URL}"),
    ('"${HTTP_PORT}"', '"${HTTP_PORT"', "roles.api.env.TS_PORT", "neither ${NAME} nor $$"),
    ('"${S3_HOST}"', '"${s3_host}"', "metrics.env.TS_METRICS_HOST", "unknown variable ${s3_host}"),
    ('lease_seconds = "4s"', 'lease_seconds = "4 sec"', "timings.lease_seconds", "not a duration: '4 sec'"),
    ('unit = "ms"', 'unit = "millis"', "timings_env.job_ttl_seconds.unit", "must be 's' or 'ms'"),
    ("attachment_id = %(attachment_id)s", "attachment_id = $1", "events.sql", "%(attachment_id)s"),
    ('DONE = "ready"', 'DONE = "done"', "vocabulary.states.DONE", "must be 'queued' or"),
    ('status = "/v1/files/{id}"', 'status = "/v1/files"', "paths.status", "does not match"),
])
def test_adapter_check_refuses_what_it_cannot_map_and_the_schema_and_load_agree(tmp_path, old, new, field, says):
    assert PORTED.count(old) == 1
    text = PORTED.replace(old, new)
    path = tmp_path / "adapter.toml"
    path.write_text(text)
    report = check(path)
    problems = [str(p) for p in report.problems]
    assert any(p.startswith(field + ":") and says in p for p in problems), problems
    if "unknown variable" in says:
        assert any("known: DATABASE_URL, AMQP_URL" in p for p in problems), problems
    # The shipped schema refuses it too, and so does adapter.load (a grade never starts with it).
    assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(tomllib.loads(text)))
    with pytest.raises(adapter_mod.AdapterError):
        adapter_mod.load(path)


def test_a_unit_on_a_count_is_a_warning(tmp_path):
    path = tmp_path / "adapter.toml"
    path.write_text(PORTED.replace('max_attempts = "TS_MAX_ATTEMPTS"',
                                   'max_attempts = { env = "TS_MAX_ATTEMPTS", unit = "ms" }'))
    report = check(path)
    assert report.ok, render(report)
    assert any(w.field == "timings_env.max_attempts.unit" for w in report.warnings)
    assert adapter_mod.load(path).timing_overrides({"max_attempts": 6})[1] == {"TS_MAX_ATTEMPTS": "6"}


def test_the_port_guides_adapter_uses_every_mapping_and_passes_the_check(tmp_path):
    guide = (REPO / "docs" / "guides" / "port-an-existing-service.md").read_text()
    block = next(b for b in re.findall(r"```toml\n(.*?)```", guide, re.S) if "adapter_version" in b)
    path = tmp_path / "adapter.toml"
    path.write_text(block)
    report = check(path)
    assert [str(p) for p in report.problems if not p.reason.startswith("program not found")] == []
    sut = adapter_mod.load(path)
    assert sut.vocabulary.states == WORDS and sut.vocabulary.upload_path() != vocab.DEFAULT_PATHS["upload"]
    assert sut.events_sql and sut.has("events") and sut.metrics_path("api") == "/prom"
    assert sut.timing_unit("job_ttl_seconds") == "ms" and isinstance(sut.timings["lease_seconds"], int)
    assert {"TS_DB_URL", "AWS_ACCESS_KEY_ID", "TS_FAULTS", "TS_PORT"} <= sut.interpolated_keys
    # What the guide quotes adapter check saying is what it says.
    text = render(check(path))
    for line in re.findall(r"^(states: .*|paths: .*|events: .*|metrics: .*)$", guide, re.M):
        assert line in text, line


def test_the_events_query_runs_with_the_roles_credentials_on_the_direct_address(ported):
    direct = {"DATABASE_URL": "postgresql://admin:root@127.0.0.1:5432/tenant_7"}
    roles = {"DATABASE_URL": "postgresql://tenant_7:s3cr%40t@127.0.0.1:24567/tenant_7"}
    reader = ported.events_reader(direct, roles)
    assert reader.database_url == "postgresql://tenant_7:s3cr%40t@127.0.0.1:5432/tenant_7"  # never the admin
    assert events_sql.with_credentials_of("postgresql://a:b@h:1/d", "postgresql://h2:2/d") == "postgresql://h:1/d"


def test_the_port_guides_quoted_refusals_are_what_adapter_check_says(tmp_path):
    guide = (REPO / "docs" / "guides" / "port-an-existing-service.md").read_text()
    block = next(b for b in re.findall(r"```toml\n(.*?)```", guide, re.S) if "adapter_version" in b)
    quoted = re.search(r"^(env\.TS_DB_URL: unknown variable .*)$", guide, re.M).group(1)
    path = tmp_path / "adapter.toml"
    path.write_text(block.replace('TS_DB_URL = "${DATABASE_URL}"', 'TS_DB_URL = "${DB_URL}"'))
    assert quoted in [str(p) for p in check(path).problems]
    path.write_text(block.replace('lease_seconds = "4s"', 'lease_seconds = "4 sec"'))
    assert "timings.lease_seconds: not a duration: '4 sec'" in guide
    assert any(str(p).startswith("timings.lease_seconds: not a duration: '4 sec'") for p in check(path).problems)
