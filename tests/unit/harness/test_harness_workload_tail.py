"""The workload tail (harness/workload_tail.py): uploads sent once the consumers are seen back after a hold or pause,
judged from hand-built history lines (no services)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from harness import workload_tail as wt
from harness.history import HistoryWriter

CONSUMERS = ["worker"]


def line(seq: int, wall: float, type_: str, **fields):
    return {"seq": seq, "t": wall, "wall": wall, "type": type_, **fields}


HOLD = [line(1, 1.0, "phase", name="hold_start", roles=["worker"], instances=["worker"], fault=0),
        line(2, 2.0, "invoke", op="u0000"),
        line(3, 2.5, "delivery", attachment_id="a0")]  # a delivery while held (another consumer role's queue, say)


def test_not_back_while_held():
    assert wt.last_release(HOLD, CONSUMERS) is None
    assert wt.consumers_back(HOLD, CONSUMERS) is None


def test_release_alone_is_not_back():
    # The hold ended but the consumer was not seen working yet: a cold start on a loaded machine took 19 s.
    events = HOLD + [line(4, 4.0, "phase", name="hold_end", roles=["worker"], instances=["worker"], fault=0)]
    assert wt.last_release(events, CONSUMERS)["seq"] == 4
    assert wt.consumers_back(events, CONSUMERS) is None


def test_back_at_the_first_delivery_after_the_release():
    events = HOLD + [line(4, 4.0, "phase", name="hold_end", roles=["worker"], instances=["worker"], fault=0),
                     line(5, 23.0, "delivery", attachment_id="a0")]
    assert wt.consumers_back(events, CONSUMERS)["seq"] == 5
    assert wt.claim_seen_after(events, 4.0) is None  # a delivery of expired work is no claim


def test_back_at_a_claim_seen_after_the_release():
    events = HOLD + [line(4, 4.0, "phase", name="hold_end", roles=["worker"], instances=["worker"], fault=0),
                     line(5, 5.0, "state", attachment_id="a1", state="processing")]
    assert wt.consumers_back(events, CONSUMERS)["seq"] == 5
    assert wt.claim_seen_after(events, 4.0)["seq"] == 5


def test_hold_of_another_role_is_no_release():
    events = [line(1, 1.0, "phase", name="hold_start", roles=["sweeper"], instances=["sweeper"], fault=0),
              line(2, 2.0, "phase", name="hold_end", roles=["sweeper"], instances=["sweeper"], fault=0),
              line(3, 3.0, "delivery", attachment_id="a0")]
    assert wt.consumers_back(events, CONSUMERS) is None


def test_pause_counts_until_every_paused_instance_resumed():
    events = [line(1, 1.0, "fault", action="sigstop", phase="start", role="worker"),
              line(2, 1.1, "fault", action="sigstop", phase="start", role="worker#2"),
              line(3, 1.5, "delivery", attachment_id="a0"),  # into a paused consumer's prefetch: not back
              line(4, 7.0, "fault", action="sigcont", phase="end", role="worker")]
    assert wt.consumers_back(events, CONSUMERS) is None  # worker#2 still paused
    events += [line(5, 7.1, "fault", action="sigcont", phase="end", role="worker#2"),
               line(6, 7.2, "transition", attachment_id="a1", to="processing")]
    assert wt.last_release(events, CONSUMERS)["seq"] == 5
    assert wt.consumers_back(events, CONSUMERS)["seq"] == 6


class FakeObserver:
    """Ends each upload in the state the test scripts for it; records which ones were read."""

    def __init__(self, outcomes):
        self.outcomes, self.states, self.polled = outcomes, {}, []

    def poll_one(self, attachment_id):
        self.polled.append(attachment_id)
        self.states[attachment_id] = self.outcomes[attachment_id]


def tail_run(tmp_path: Path, before: list[dict], outcomes: dict[str, str], claim_on_send: bool, uploads: int = 3,
             timeout: float = 5.0):
    history = HistoryWriter(tmp_path / "history.jsonl")
    for e in before:  # the run so far, as the runner's writer would have put it
        history.append(e["type"], **{k: v for k, v in e.items() if k not in ("seq", "t", "wall", "type")})
    sent = []

    def send(op):
        sent.append(op)
        if claim_on_send:  # the implementation claims it: the observer records the claim line
            history.append("state", attachment_id=f"a-{op}", state="processing")
        return {"attachment_id": f"a-{op}"}

    observer = FakeObserver(outcomes)
    wt.run_tail({"uploads": uploads, "timeout_seconds": timeout, "wait_seconds": 2}, [f"t{i}" for i in range(uploads)],
                send=send, observer=observer, history=history, consumer_roles=CONSUMERS, stopping=threading.Event())
    history.close()
    notes = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    return sent, [n["message"] for n in notes if n["type"] == "note"]


RELEASED = [{"type": "phase", "name": "hold_start", "roles": ["worker"], "instances": ["worker"], "fault": 0},
            {"type": "phase", "name": "hold_end", "roles": ["worker"], "instances": ["worker"], "fault": 0},
            {"type": "delivery", "attachment_id": "old"}]


def test_tail_stops_at_the_second_upload_when_the_first_made_the_claim(tmp_path):
    # No claim before the tail: the first tail upload's own claim is what proves the consumers back, so it is not
    # judged as work after them; the second, sent after that claim, is — and ends ready: the tail stops there.
    sent, notes = tail_run(tmp_path, RELEASED, {"a-t0": "ready", "a-t1": "ready", "a-t2": "ready"}, claim_on_send=True)
    assert sent == ["t0", "t1"]
    assert "workload tail: consumers seen back" in notes
    assert any("ended ready" in n for n in notes)


def test_tail_goes_on_past_an_upload_that_expired(tmp_path):
    before = RELEASED + [{"type": "state", "attachment_id": "x", "state": "processing"}]
    sent, notes = tail_run(tmp_path, before, {"a-t0": "failed", "a-t1": "ready", "a-t2": "ready"}, claim_on_send=False)
    assert sent == ["t0", "t1"]


def test_tail_spent_says_so(tmp_path):
    before = RELEASED + [{"type": "state", "attachment_id": "x", "state": "processing"}]
    sent, notes = tail_run(tmp_path, before, {"a-t0": "failed", "a-t1": "failed"}, claim_on_send=False, uploads=2)
    assert sent == ["t0", "t1"]
    assert any("tail spent" in n for n in notes)


def test_tail_sent_anyway_when_the_consumers_never_came_back(tmp_path):
    held = RELEASED[:1]  # still held at the end
    sent, notes = tail_run(tmp_path, held, {"a-t0": "ready"}, claim_on_send=False, uploads=1, timeout=1.0)
    assert sent == ["t0"]
    assert any("not seen back" in n for n in notes)


def test_scenarios_declare_a_tail():
    from harness import scenarios

    root = Path(__file__).resolve().parents[3]
    for name in ("expiry-after-backlog", "clock-skew-expiry"):
        w = scenarios.load_file(root / "scenarios" / f"{name}.toml").raw["workload"]
        assert 1 <= w["tail"]["uploads"] < w["uploads"]
