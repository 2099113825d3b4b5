"""Reading consumers from the management API: a consumer listed before its channel details is skipped, not fatal."""

from __future__ import annotations

from harness.prefetch import read_consumers


class FakeManagement:
    """The two management API answers read_consumers asks for (shapes as RabbitMQ 3.10 returns them)."""

    def __init__(self, consumers, channels):
        self.consumers, self.channels = consumers, channels

    def get(self, path):
        body = self.consumers if path.startswith("/api/consumers/") else self.channels.get(path.rsplit("/", 1)[1])
        return FakeResponse(body)


class FakeResponse:
    def __init__(self, body):
        self.body = body
        self.status_code = 200 if body is not None else 404

    def raise_for_status(self):
        return self

    def json(self):
        return self.body


def test_a_consumer_whose_channel_details_are_not_filled_in_yet_is_skipped():
    consumers = [
        {"queue": {"name": "work"}, "channel_details": [], "consumer_tag": "new", "prefetch_count": 2},
        {"queue": {"name": "work"}, "channel_details": {"name": "ch1"}, "consumer_tag": "old", "prefetch_count": 2},
        {"queue": {"name": "other"}, "channel_details": {"name": "ch2"}, "consumer_tag": "x", "prefetch_count": 9},
    ]
    samples = read_consumers(FakeManagement(consumers, {"ch1": {"messages_unacknowledged": 2}}), "/", "work")
    assert [(s.consumer, s.prefetch, s.unacked) for s in samples] == [("old", 2, 2)]
