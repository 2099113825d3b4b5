"""The broker list (AMQP_URLS, else AMQP_URL) and failover between its nodes.

A RabbitMQ cluster is reached through any of its nodes: a quorum queue is served from every node, whichever holds
its leader. Each process connects to the node it last reached; when that connection is lost (a node killed, or cut
off from this process) the next connection starts with the next node of the list, and a node that cannot be reached
is skipped at once. With one URL this is a plain connect.
"""

from __future__ import annotations

import logging

from typing import Any, Protocol

import aio_pika

log = logging.getLogger(__name__)


class BrokerNodes(Protocol):
    """What a connection needs of the settings (reference.settings.Settings has both)."""

    @property
    def amqp_url(self) -> str: ...

    @property
    def amqp_urls(self) -> str: ...


def broker_urls(settings: BrokerNodes) -> list[str]:
    """AMQP_URLS (comma-separated) when set, else [AMQP_URL]."""
    listed = [u.strip() for u in (getattr(settings, "amqp_urls", "") or "").split(",") if u.strip()]
    return listed or [settings.amqp_url]


class _Rotation:
    """The index of the node this process tries first (one per process: every connection follows it)."""

    def __init__(self) -> None:
        self.first = 0

    def order(self, count: int) -> list[int]:
        return [(self.first + step) % count for step in range(count)]


_rotation = _Rotation()


async def connect(settings: BrokerNodes, **options: Any) -> aio_pika.abc.AbstractConnection:
    """``aio_pika.connect`` to the first node of the list that answers; raises the last error when none does.
    A connection that later closes moves the first node to try on to the next one."""
    urls = broker_urls(settings)
    error: BaseException | None = None
    for index in _rotation.order(len(urls)):
        try:
            connection: aio_pika.abc.AbstractConnection = await aio_pika.connect(urls[index], **options)
        except Exception as exc:  # this node is down or cut off: the next one
            error = exc
            if len(urls) > 1:
                log.warning("broker %d of %d unreachable (%s); trying the next", index + 1, len(urls),
                            type(exc).__name__)
            continue
        _rotation.first = index
        if len(urls) > 1:
            def lost(*_args: Any, index: int = index) -> None:
                if _rotation.first == index:  # the next connection starts with the next node
                    _rotation.first = (index + 1) % len(urls)
            connection.close_callbacks.add(lost)
        return connection
    assert error is not None
    raise error
