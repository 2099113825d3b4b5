"""The API observer of a long run reads attachments on several threads: unfinished ones first, never two reads of
one attachment at once, and an API that does not answer ends the tick instead of costing one timeout per id."""

import json
import threading
import time

import httpx
import pytest

from harness.history import HistoryWriter
from harness.observe import ApiObserver


class Api:
    """Answers GET /v1/attachments/{id} and /events from a dict of states; records how reads overlapped."""

    def __init__(self, states: dict[str, str], delay: float = 0.002, down: bool = False):
        self.states, self.delay, self.down = states, delay, down
        self.lock = threading.Lock()
        self.in_flight: dict[str, int] = {}
        self.overlap_same_id = 0
        self.max_parallel = 0
        self.order: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("refused", request=request)
        parts = request.url.path.split("/")
        attachment_id = parts[3]
        with self.lock:
            self.in_flight[attachment_id] = self.in_flight.get(attachment_id, 0) + 1
            self.overlap_same_id += self.in_flight[attachment_id] > 1
            self.max_parallel = max(self.max_parallel, sum(self.in_flight.values()))
            if len(parts) == 4:
                self.order.append(attachment_id)
        time.sleep(self.delay)
        with self.lock:
            self.in_flight[attachment_id] -= 1
        if len(parts) == 5:
            return httpx.Response(200, json={"events": []})
        return httpx.Response(200, json={"id": attachment_id, "state": self.states[attachment_id], "attempt": 1})


def observer(tmp_path, api) -> ApiObserver:
    obs = ApiObserver("http://api.test", HistoryWriter(tmp_path / "history.jsonl"), transport=httpx.MockTransport(api))
    for attachment_id in api.states:
        obs.watch(attachment_id)
    return obs


def test_a_long_run_reads_in_parallel_unfinished_first_and_each_attachment_in_turn(tmp_path):
    states = {f"a{n:04d}": ("ready" if n % 2 else "processing") for n in range(400)}
    api = Api(states)
    obs = observer(tmp_path, api)
    obs.tick()  # first read of all 400: everything is due
    assert obs.states == states
    assert api.max_parallel > 1 and api.overlap_same_id == 0
    # Second read: mark every attachment due again; the unfinished ones are read before any finished one.
    api.order.clear()
    obs.next_read = {a: 0.0 for a in states}
    obs.tick()
    unfinished = {a for a, s in states.items() if s == "processing"}
    first = api.order[: len(unfinished)]
    # Reads start in the order submitted; at most POLL_THREADS of the first ones can overtake each other.
    assert len(set(first) - unfinished) <= ApiObserver.POLL_THREADS
    lines = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert sum(line["type"] == "state" for line in lines) == 400  # one per change, none lost or doubled
    obs.halt()  # what a run's teardown calls: the reading threads end with it
    assert not [t for t in threading.enumerate() if t.name.startswith("api-observer_")]
    obs.close()


def test_a_small_run_keeps_reading_in_turn(tmp_path):
    api = Api({f"a{n}": "queued" for n in range(ApiObserver.SERIAL_UP_TO)})
    obs = observer(tmp_path, api)
    obs.tick()
    assert api.max_parallel == 1 and obs._pool is None
    obs.close()


def test_an_api_that_is_down_ends_the_tick_early(tmp_path):
    api = Api({f"a{n:04d}": "queued" for n in range(2000)}, down=True)
    calls = []
    transport = httpx.MockTransport(lambda request: (calls.append(1), api(request))[1])
    obs = ApiObserver("http://api.test", HistoryWriter(tmp_path / "history.jsonl"), transport=transport)
    for attachment_id in api.states:
        obs.watch(attachment_id)
    with pytest.raises(httpx.ConnectError):
        obs.tick()
    assert len(calls) < 200  # not one failed request per attachment
    obs.close()
