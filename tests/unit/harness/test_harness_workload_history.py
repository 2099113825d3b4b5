"""Determinism of workload and fault schedule; history round trip."""
from __future__ import annotations

import io
import json

import pytest

from PIL import Image

from harness import workload
from harness.history import History, HistoryWriter
from harness.nemesis import resolve_schedule, schedule_fingerprint, timings_needed
from harness.scenarios import catalogue


def test_same_seed_same_workload_and_different_seed_different_workload():
    a, b = workload.plan(11, 6, 2, 2), workload.plan(11, 6, 2, 2)
    assert [op.describe() for op in a] == [op.describe() for op in b]
    assert workload.fingerprint(a) == workload.fingerprint(b)
    assert workload.fingerprint(workload.plan(12, 6, 2, 2)) != workload.fingerprint(a)


def test_corpus_has_every_format_good_images_decode_and_bad_ones_do_not():
    ops = workload.plan(3, 24, 3, 3)
    assert {op.fmt for op in ops if op.kind == "good"} == set(workload.FORMATS)
    for op in ops:
        if op.kind == "good":
            Image.open(io.BytesIO(op.data)).load()
        else:
            try:
                Image.open(io.BytesIO(op.data)).load()
            except Exception:
                continue
            raise AssertionError(f"{op.kind} input {op.op} decoded")
    assert len({op.idempotency_key for op in ops}) == len(ops)


def test_same_seed_same_fault_schedule():
    for scenario in catalogue():
        faults = scenario.raw["faults"]
        timings = {"lease_seconds": 4, **{name: 4 for name in timings_needed(faults)}}
        assert schedule_fingerprint(resolve_schedule(faults, 5, timings)) == \
            schedule_fingerprint(resolve_schedule(faults, 5, timings))
    faults = [{"action": "sigkill", "role": "worker", "at": 1.0, "jitter": 2.0, "delay": [0.0, 1.0], "count": 3}]
    assert resolve_schedule(faults, 1) != resolve_schedule(faults, 2)
    step = resolve_schedule(faults, 1)[0]
    assert 1.0 <= step["at"] <= 3.0 and len(step["delay_drawn"]) == 3


def test_history_writer_reader_round_trip(tmp_path):
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as h:
        h.append("invoke", op="u1", f="upload")
        h.append("ok", op="u1", f="upload", attachment_id="a1")
        h.append("invoke", op="u2", f="upload")
        h.append("info", op="u2", f="upload", error="ReadTimeout")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["seq"] for line in lines] == [1, 2, 3, 4]
    assert all(line["t"] >= 0 and line["wall"] > 1e9 for line in lines)
    history = History.load(path)
    assert [e["line"] for e in history] == [1, 2, 3, 4]
    assert [(i["op"], ok["attachment_id"]) for i, ok in history.accepted()] == [("u1", "a1")]
    assert history.operations()["u2"]["complete"]["type"] == "info"


def test_unknown_event_types_are_refused(tmp_path):
    import pytest

    with HistoryWriter(tmp_path / "h.jsonl") as h, pytest.raises(ValueError):
        h.append("gossip")


class FakeResponse:
    def __init__(self, status, body):
        self.status_code, self._body = status, body

    def json(self):
        return self._body


class FakeClient:
    """Answers from a script: an exception instance is raised, a (status, body) pair returned."""

    def __init__(self, script):
        self.script = list(script)
        self.keys = []

    def post(self, path, files, headers, timeout):
        self.keys.append(headers["Idempotency-Key"])
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return FakeResponse(*item)


def test_uploader_records_unknown_outcome_then_retries_with_the_same_key(tmp_path):
    op = workload.plan(1, 1)[0]
    client = FakeClient([TimeoutError("slow"), (503, {"error": {"code": "unavailable"}}),
                         (202, {"attachment_id": "a1", "job_id": "j1"})])
    with HistoryWriter(tmp_path / "h.jsonl") as h:
        body = workload.Uploader(client, h, retry_delay=0).upload(op)
    assert body["attachment_id"] == "a1"
    assert len(set(client.keys)) == 1
    history = History.load(tmp_path / "h.jsonl")
    assert [e["type"] for e in history] == ["invoke", "info", "invoke", "info", "invoke", "ok"]
    client = FakeClient([(415, {"error": {"code": "unsupported_media_type"}})])
    with HistoryWriter(tmp_path / "h2.jsonl") as h:
        assert workload.Uploader(client, h, retry_delay=0).upload(op) is None
    assert History.load(tmp_path / "h2.jsonl").events[-1]["error_code"] == "unsupported_media_type"


def test_fault_durations_scale_with_the_implementations_own_timings():
    faults = [{"action": "sigstop", "duration": {"of": "lease_seconds", "times": 2.25}, "hold_seconds": 1}]
    assert resolve_schedule(faults, 1, {"lease_seconds": 4})[0]["duration"] == 9.0
    assert resolve_schedule(faults, 1, {"lease_seconds": 30})[0]["duration"] == 67.5  # a production-shaped lease
    assert resolve_schedule([{"action": "hold", "hold_seconds": {"of": "lease_seconds", "plus": 1}}], 1,
                            {"lease_seconds": 4})[0]["hold_seconds"] == 5.0
    with pytest.raises(KeyError, match="declares no lease_seconds"):
        resolve_schedule(faults, 1, {})


def test_an_unknown_outcome_is_retried_with_the_same_key_and_a_4xx_is_final(tmp_path):
    import httpx

    answers = iter([httpx.Response(503, json={"error": {"code": "unavailable"}}),
                    httpx.Response(202, json={"attachment_id": "a-1", "job_id": "j-1"}),
                    httpx.Response(409, json={"error": {"code": "idempotency_conflict"}})])
    keys = []

    def answer(request):
        keys.append(request.headers["Idempotency-Key"])
        return next(answers)

    writer = HistoryWriter(tmp_path / "history.jsonl")
    client = httpx.Client(transport=httpx.MockTransport(answer), base_url="http://api.test")
    uploader = workload.Uploader(client, writer, retries=2, retry_delay=0.0)
    op = workload.plan(11, 1, 0, 0)[0]
    accepted = []
    assert uploader.upload(op, on_accepted=accepted.append)["attachment_id"] == "a-1"
    assert uploader.probe(op, "conflict", op.data + b"x") is None
    writer.close()
    lines = [(e["type"], e["op"], e["f"], e.get("status"), e.get("retry_of"))
             for e in History.load(tmp_path / "history.jsonl").events]
    assert lines == [("invoke", op.op, "upload", None, None), ("info", op.op, "upload", 503, None),
                     ("invoke", f"{op.op}.r1", "upload", None, op.op), ("ok", f"{op.op}.r1", "upload", 202, None),
                     ("invoke", f"{op.op}.conflict", "idempotency", None, None),
                     ("fail", f"{op.op}.conflict", "idempotency", 409, None)]
    assert accepted == ["a-1"] and set(keys) == {op.idempotency_key}


def test_a_line_from_a_thread_that_outlived_the_run_is_dropped_not_raised(tmp_path):
    writer = HistoryWriter(tmp_path / "history.jsonl")
    assert writer.append_if_open("note", message="before")["seq"] == 1
    writer.close()
    assert writer.append_if_open("note", message="after the close") is None
    with pytest.raises(ValueError):
        writer.append("note", message="a direct append after the close still fails loudly")
    assert [e["message"] for e in History.load(tmp_path / "history.jsonl").events] == ["before"]
