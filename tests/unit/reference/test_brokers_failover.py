"""The reference's broker list: AMQP_URLS, else AMQP_URL; a node that cannot be reached is skipped, and once a
connection is lost the next one starts with the next node (reference/brokers.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from reference import brokers


class FakeConnection:
    def __init__(self, url):
        self.url = url
        self.close_callbacks = set()

    def lose(self):
        for callback in list(self.close_callbacks):
            callback(self, ConnectionError("lost"))


@pytest.fixture
def fake(monkeypatch):
    down: set[str] = set()

    async def connect(url, **options):
        if url in down:
            raise ConnectionRefusedError(url)
        return FakeConnection(url)
    monkeypatch.setattr(brokers.aio_pika, "connect", connect)
    monkeypatch.setattr(brokers, "_rotation", brokers._Rotation())
    return down


def settings(urls="", url="amqp://a/"):
    return SimpleNamespace(amqp_url=url, amqp_urls=urls)


def test_the_list_is_amqp_urls_else_amqp_url():
    assert brokers.broker_urls(settings()) == ["amqp://a/"]
    assert brokers.broker_urls(settings(" amqp://a/, amqp://b/ ,")) == ["amqp://a/", "amqp://b/"]


def test_an_unreachable_node_is_skipped_and_a_lost_connection_moves_on(fake):
    s = settings("amqp://a/,amqp://b/,amqp://c/")
    first = asyncio.run(brokers.connect(s))
    assert first.url == "amqp://a/"
    first.lose()  # node a lost: the next connection starts with b
    assert asyncio.run(brokers.connect(s)).url == "amqp://b/"
    fake.update({"amqp://b/"})
    brokers._rotation.first = 1
    assert asyncio.run(brokers.connect(s)).url == "amqp://c/"  # b refused: c
    fake.update({"amqp://a/", "amqp://c/"})
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(brokers.connect(s))
