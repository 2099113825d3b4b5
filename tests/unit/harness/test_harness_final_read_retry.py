"""The final read tries one attachment's GET again after a refused connection or a 5xx: one transient error on a
loaded machine made a whole run's final state unreadable (every checker unknown), as a broken variant's grade in CI
showed."""

from __future__ import annotations

import httpx

from harness import final_state, http_clients

ATT = "4c8f4a4e-5d3a-4a41-9a39-0b8a7a0e0001"
BODY = {"id": ATT, "state": "ready", "attempt": 1, "variants": []}


class _S3:
    def list_objects_v2(self, **kwargs):
        return {"Contents": []}


def _read(monkeypatch, answers):
    calls = []

    def handler(request):
        calls.append(request.url.path)
        answer = answers.pop(0) if answers else 200
        if isinstance(answer, Exception):
            raise answer
        if request.url.path.endswith("/events"):
            return httpx.Response(200, json={"events": []})
        return httpx.Response(answer, json=BODY if answer == 200 else {"error": "down"})

    monkeypatch.setattr(final_state, "READ_RETRY_PAUSES", (0.0, 0.0))
    monkeypatch.setattr(final_state, "s3_client", lambda env: _S3())
    monkeypatch.setattr(http_clients, "client",
                        lambda **kw: httpx.Client(transport=httpx.MockTransport(handler), **kw))
    return final_state.read_final("http://sut", [ATT], {"S3_BUCKET": "b"}), calls


def test_a_refused_connection_then_a_503_are_read_through(monkeypatch):
    final, calls = _read(monkeypatch, [httpx.ConnectError("refused"), 503])
    assert final["read_ok"], final["errors"]
    assert final["attachments"][ATT]["body"]["state"] == "ready"
    assert len(final["read_retries"]) == 2 and "ConnectError" in final["read_retries"][0]


def test_an_api_that_stays_down_leaves_the_final_read_failed_with_its_error(monkeypatch):
    final, _ = _read(monkeypatch, [httpx.ConnectError("refused")] * 3)
    assert not final["read_ok"]
    assert "ConnectError" in final["errors"][0] and final["attachments"][ATT] == {"status": None}


def test_a_404_is_an_answer_not_an_error(monkeypatch):
    final, calls = _read(monkeypatch, [404])
    assert final["read_ok"] and final["attachments"][ATT]["status"] == 404 and len(calls) == 1
