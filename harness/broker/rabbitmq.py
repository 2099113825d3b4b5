"""RabbitMQ, as the harness sees it (the broker seam's one implementation).

* :class:`Management` — the few management API calls the harness needs, for one vhost (on a cluster, over every
  node's API through :class:`FailoverClient`);
* :func:`amqp_queue_depth` — the exact, real-time depth of a queue by a passive declare;
* :class:`Tap` binds its own durable queue to the watched exchange with ``#`` and drains it through the management
  API (a plain HTTP poll, which survives a broker restart without reconnect logic), recording each message; it
  also samples the depth of the work and dead-letter queues;
* :class:`ConsumerSampler` records every consumer of the work queue (prefetch, unacked) while a backlog drains,
  for the bounded-concurrency checker (BE-JOB-004).
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import threading
import time
import urllib.parse

import httpx

from .. import http_clients
from ..polling import Poller


def management_auth(amqp_url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(amqp_url)
    return urllib.parse.unquote(parts.username or "guest"), urllib.parse.unquote(parts.password or "guest")


def vhost_of(amqp_url: str) -> str:
    path = urllib.parse.urlsplit(amqp_url).path
    return urllib.parse.unquote(path[1:]) if len(path) > 1 else "/"


class FailoverClient:
    """The httpx.Client calls Management makes, over a RabbitMQ cluster's management APIs (one per node): a request
    that cannot reach a node (killed, restarting) goes to the next, which then stays the current one."""

    def __init__(self, urls, **options):
        self.clients = [http_clients.client(base_url=url, **options) for url in urls]
        self.current = 0

    def request(self, method: str, url: str, **options) -> httpx.Response:
        error: Exception | None = None
        for step in range(len(self.clients)):
            index = (self.current + step) % len(self.clients)
            try:
                response = self.clients[index].request(method, url, **options)
            except httpx.TransportError as exc:
                error = exc
                continue
            if response.status_code == 503 and step < len(self.clients) - 1:  # a node still booting
                continue
            self.current = index
            return response
        raise error or httpx.ConnectError("no RabbitMQ node answered")

    def get(self, url: str, **options) -> httpx.Response:
        return self.request("GET", url, **options)

    def put(self, url: str, **options) -> httpx.Response:
        return self.request("PUT", url, **options)

    def post(self, url: str, **options) -> httpx.Response:
        return self.request("POST", url, **options)

    def close(self) -> None:
        for client in self.clients:
            client.close()


class Management:
    """The few RabbitMQ management API calls the harness needs, for one vhost. With ``management_urls`` (a
    cluster's every node) a call goes to whichever node answers, and the firehose is turned on at every node (it
    is per node: a node traces only what passes through it)."""

    def __init__(self, management_url: str, amqp_url: str, timeout: float = 5, management_urls=()):
        self.vhost = vhost_of(amqp_url)
        self.urls = list(management_urls) or [management_url]
        options = {"auth": management_auth(amqp_url), "timeout": timeout}
        self.client = (FailoverClient(self.urls, **options) if len(self.urls) > 1
                       else http_clients.client(base_url=management_url, **options))

    @property
    def clustered(self) -> bool:
        return len(self.urls) > 1

    def _each_node(self, method: str, path: str, **options) -> list[httpx.Response | None]:
        """The same call on every node (None for a node that did not answer: down, or restarting)."""
        if not self.clustered:
            return [self.client.request(method, path, **options)]
        return [_try(client, method, path, **options) for client in self.client.clients]

    def _q(self, name: str) -> str:
        return f"{urllib.parse.quote(self.vhost, safe='')}/{urllib.parse.quote(name, safe='')}"

    def _vq(self) -> str:
        return urllib.parse.quote(self.vhost, safe="")

    def queue_exists(self, queue: str) -> bool:
        return self.client.get(f"/api/queues/{self._q(queue)}").status_code == 200

    def declare_queue(self, queue: str) -> None:
        # On a cluster a quorum queue: a classic one lives on one node, and is gone while that node is down.
        kind = "quorum" if self.clustered else "classic"
        response = self.client.put(f"/api/queues/{self._q(queue)}", json={"durable": True, "auto_delete": False,
                                                                         "arguments": {"x-queue-type": kind}})
        response.raise_for_status()

    def queue_bindings(self, queue: str) -> list[dict] | None:
        """Every binding of ``queue`` (None when the queue does not exist yet)."""
        response = self.client.get(f"/api/queues/{self._q(queue)}/bindings")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def bind(self, exchange: str, queue: str, routing_key: str, arguments: dict | None = None) -> None:
        response = self.client.post(f"/api/bindings/{self._vq()}/e/{urllib.parse.quote(exchange, safe='')}/q/"
                                    f"{urllib.parse.quote(queue, safe='')}",
                                    json={"routing_key": routing_key, "arguments": arguments or {}})
        response.raise_for_status()

    def enable_tracing(self) -> None:
        """Turn on the vhost's firehose (amq.rabbitmq.trace): the only view of default-exchange publishes."""
        answers = [r for r in self._each_node("PUT", f"/api/vhosts/{self._vq()}", json={"tracing": True}) if r]
        if not answers:
            raise httpx.ConnectError("no RabbitMQ node answered to turn the firehose on")
        for response in answers:
            response.raise_for_status()

    def tracing_on(self) -> bool:
        """Whether the vhost's firehose is on (a broker restart turns it off) — at every node that answers (a
        node that is down traces nothing and turns it off when it comes back: the next look turns it on again)."""
        answers = [r for r in self._each_node("GET", f"/api/vhosts/{self._vq()}") if r is not None]
        for response in answers:
            response.raise_for_status()
        return bool(answers) and all(bool(r.json().get("tracing")) for r in answers)

    def connections_by_node(self) -> dict[str, int]:
        """The vhost's client connections per node, the harness's own probes left out (management statistics: they
        lag by a moment)."""
        response = self.client.get(f"/api/vhosts/{self._vq()}/connections")
        response.raise_for_status()
        counts: dict[str, int] = {}
        for c in response.json():
            name = str((c.get("client_properties") or {}).get("connection_name") or "")
            if name.startswith(HARNESS_CONNECTION):
                continue
            counts[str(c.get("node"))] = counts.get(str(c.get("node")), 0) + 1
        return counts

    def queue_leader(self, queue: str) -> dict | None:
        """A quorum queue's leader node and members (None when the queue or the field is not there)."""
        response = self.client.get(f"/api/queues/{self._q(queue)}")
        if response.status_code != 200:
            return None
        body = response.json()
        if not body.get("leader"):
            return None
        return {"leader": body.get("leader"), "members": body.get("members") or [], "online": body.get("online") or []}

    def get(self, queue: str, count: int = 100, requeue: bool = False) -> list[dict]:
        response = self.client.post(f"/api/queues/{self._q(queue)}/get", json={
            "count": count, "ackmode": "ack_requeue_true" if requeue else "ack_requeue_false",
            "encoding": "auto", "truncate": 100000})
        if response.status_code == 404:
            return []
        response.raise_for_status()
        return response.json()

    def depth(self, queue: str) -> dict | None:
        response = self.client.get(f"/api/queues/{self._q(queue)}")
        if response.status_code != 200:
            return None
        body = response.json()
        return {"ready": body.get("messages_ready"), "unacked": body.get("messages_unacknowledged"),
                "consumers": body.get("consumers")}

    def publish(self, exchange: str, routing_key: str, payload: str, properties: dict) -> bool:
        response = self.client.post(f"/api/exchanges/{self._q(exchange or 'amq.default')}/publish", json={
            "routing_key": routing_key, "payload": payload, "payload_encoding": "string",
            "properties": properties})
        response.raise_for_status()
        return bool(response.json().get("routed"))

    def close(self) -> None:
        self.client.close()


def _try(client, method: str, path: str, **options):
    try:
        return client.request(method, path, **options)
    except httpx.TransportError:
        return None


def payload_bytes(message: dict) -> bytes:
    """The exact bytes of a message read through the management API (``encoding: auto`` gives text or base64)."""
    raw = message.get("payload", "")
    if message.get("payload_encoding") == "base64":
        return base64.b64decode(raw)
    return str(raw).encode("utf-8")


def decode_payload(message: dict) -> tuple[dict | None, str]:
    raw = message.get("payload", "")
    if message.get("payload_encoding") == "base64":
        raw = base64.b64decode(raw).decode("utf-8", "replace")
    try:
        body = json.loads(raw)
    except ValueError:
        return None, raw
    return (body if isinstance(body, dict) else None), raw


HARNESS_CONNECTION = "harness-probe"


def amqp_queue_depth(amqp_url: str, queue: str, timeout: float = 5.0) -> dict | None:
    """Exact, real-time ready-message and consumer counts by a passive declare (the management API's counts
    lag by its statistics interval and may even be stale after draining). None if the queue is unreachable."""
    import asyncio

    import aio_pika

    async def probe():
        # Named, so a count of the implementation's own connections can leave the harness's probes out.
        connection = await aio_pika.connect(amqp_url, timeout=timeout,
                                            client_properties={"connection_name": HARNESS_CONNECTION})
        try:
            channel = await connection.channel()
            declared = await channel.declare_queue(queue, passive=True)
            result = declared.declaration_result
            return {"ready": result.message_count, "consumers": result.consumer_count, "source": "amqp"}
        finally:
            await connection.close()

    try:
        return asyncio.run(asyncio.wait_for(probe(), timeout + 2))
    except Exception:
        return None


TRACE_EXCHANGE = "amq.rabbitmq.trace"
KEPT_PROPERTIES = ("message_id", "content_type", "content_encoding", "delivery_mode", "headers", "timestamp",
                   "type", "app_id", "correlation_id", "priority", "expiration", "user_id", "reply_to")


class Tap(Poller):
    """Sees every message that reaches the work queue, whatever the topology (CONTRACT §10).

    Two sources feed one private queue: a copy of each binding of the work queue (any exchange type: the copy
    routes exactly what the original routes, dead-lettered messages included), kept in sync while the run goes
    on, since roles may declare their topology at start or late; and the vhost's firehose, kept only for what the
    broker says it routed to the work queue. The firehose is the only view of default-exchange publishes, and of
    publishes made before a binding could be copied (a role that declares and publishes at once). For an exchange
    whose binding is copied, the firehose is used until the first copy from it arrives: the tap queue is FIFO and
    the broker traces a publish before routing it, so that first copy repeats the firehose record just kept for
    the same publish (dropped as such), and from then on the copies stand for that exchange.
    """

    def __init__(self, management: Management, history, work_queue: str, dead_letter_queue: str | None,
                 tap_queue: str = "harness.tap", interval: float = 0.2, sample_every: float = 1.0,
                 sync_every: float = 1.0):
        super().__init__("tap", interval)
        self.m = management
        self.history = history
        self.work_queue = work_queue
        self.dead_letter_queue = dead_letter_queue
        self.tap_queue = tap_queue
        self.sample_every = sample_every
        self.sync_every = sync_every
        self._last_sample = 0.0
        self._last_sync = 0.0
        self.copied: set[tuple[str, str, str]] = set()  # (exchange, routing key, arguments) copied onto the tap
        self.firehose = False
        self.copies_seen: set[str] = set()  # exchanges a binding copy arrived from: their firehose records are dropped
        self.traced: dict[str, list[tuple]] = {}  # exchange -> firehose records kept before its first copy arrived
        self.messages: list[dict] = []  # (body, raw, properties, exchange, routing_key) of every tapped message
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Before any role starts: the tap queue and the firehose for default-exchange publishes."""
        self.m.declare_queue(self.tap_queue)
        try:
            self.m.enable_tracing()
            self.m.bind(TRACE_EXCHANGE, self.tap_queue, "publish.")   # the default exchange
            self.m.bind(TRACE_EXCHANGE, self.tap_queue, "publish.#")  # every other one
            self.firehose = True
        except httpx.HTTPError as exc:
            self.history.append("note", message="firehose unavailable: default-exchange publishes are not observed",
                                error=repr(exc))
        self.history.append("observe", source="tap", queue=self.tap_queue, firehose=self.firehose)

    def sync_bindings(self) -> int:
        """Copy any binding of the work queue the tap lacks; returns how many bindings the tap mirrors."""
        bindings = self.m.queue_bindings(self.work_queue)
        if bindings is None:
            return len(self.copied)
        for b in bindings:
            if not b.get("source"):  # the default exchange's implicit binding: seen through the firehose
                continue
            arguments = b.get("arguments") or {}
            key = (b["source"], b.get("routing_key", ""), json.dumps(arguments, sort_keys=True))
            if key in self.copied:
                continue
            self.m.bind(b["source"], self.tap_queue, b.get("routing_key", ""), arguments)
            self.copied.add(key)
            self.history.append("observe", source="binding", exchange=b["source"], routing_key=b.get("routing_key"),
                                arguments=arguments, queue=self.work_queue)
        return len(self.copied)

    def wait_for_topology(self, timeout: float) -> bool:
        """Wait until the work queue exists (declared by a setup command or a role at start) and mirror it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.m.queue_exists(self.work_queue):
                    self.sync_bindings()
                    self._last_sync = time.monotonic()
                    return True
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.history.append("note", message="work queue not declared yet; the tap keeps looking",
                                    queue=self.work_queue, waited_seconds=timeout)
                return False
            time.sleep(0.2)

    @property
    def observing(self) -> bool:
        return bool(self.copied) or self.firehose

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_sync >= self.sync_every:
            self._last_sync = now
            self.sync_bindings()
            if self.firehose and not self.m.tracing_on():
                # A broker restart turns the firehose off: on again, and the gap is said (what it traced is partial).
                self.m.enable_tracing()
                self.history.append("observe", source="firehose", tracing_restored=True, queue=self.work_queue)
        self.drain_once()
        if now - self._last_sample >= self.sample_every:
            self._last_sample = now
            self.sample()

    def trace_deliveries(self) -> bool:
        """Also record every delivery from the work queue to a consumer (the firehose's ``deliver.<queue>``), as
        ``delivery`` lines: how often one message was handed out. False when the firehose is unavailable."""
        if not self.firehose:
            return False
        if getattr(self, "_tracing_deliveries", False):
            return True  # bound once for the whole run
        key = f"deliver.{self.work_queue}"
        self.m.bind(TRACE_EXCHANGE, self.tap_queue, key)
        self._tracing_deliveries = True
        self.history.append("observe", source="firehose", deliveries=True, routing_key=key, queue=self.work_queue)
        return True

    def _delivery(self, message: dict) -> None:
        trace = (message.get("properties") or {}).get("headers") or {}
        properties = trace.get("properties") or {}
        body = decode_payload(message)[0] or {}
        self.history.append("delivery", queue=str(message.get("routing_key"))[len("deliver."):],
                            redelivered=trace.get("redelivered"), message_id=properties.get("message_id"),
                            sha256=hashlib.sha256(payload_bytes(message)).hexdigest(), job_id=body.get("job_id"),
                            attachment_id=body.get("attachment_id"), attempt=body.get("attempt"),
                            channel=trace.get("channel"),
                            connection=trace.get("connection"))

    def drain_once(self) -> int:
        got = self.m.get(self.tap_queue, 100)
        kept = 0
        for message in got:
            if message.get("exchange") == TRACE_EXCHANGE and str(message.get("routing_key")).startswith("deliver."):
                self._delivery(message)
                continue
            if not message.get("exchange") and message.get("routing_key") == self.tap_queue:
                self._forged(message)
                continue
            seen = self._unwrap(message)
            if seen is None:
                continue
            kept += 1
            body, raw = decode_payload(message)
            properties = {k: seen["properties"].get(k) for k in KEPT_PROPERTIES if seen["properties"].get(k) is not None}
            self.history.append("message", exchange=seen["exchange"], routing_key=seen["routing_key"],
                                source=seen["source"], properties=properties, body=body,
                                body_raw=None if body is not None else raw[:2000])
            with self._lock:
                self.messages.append({"body": body, "raw": raw, "properties": properties,
                                      "exchange": seen["exchange"], "routing_key": seen["routing_key"]})
        return kept

    def _unroutable(self, trace: dict, keys: list, message: dict) -> None:
        """A publish the broker routed nowhere: it confirms such a message and drops it (unless published
        ``mandatory``). Kept as a fact with the job it names, so that work lost this way is reported with its cause
        (typically: the queue and its bindings were declared by a consumer that had not started yet)."""
        body = decode_payload(message)[0] or {}
        self.history.append("unroutable", exchange=trace.get("exchange_name") or "", routing_key=keys[0],
                            job_id=body.get("job_id"), attachment_id=body.get("attachment_id"),
                            attempt=body.get("attempt"),
                            message_id=(trace.get("properties") or {}).get("message_id"))

    def _forged(self, message: dict) -> None:
        """A message published straight into the tap queue (the default exchange, by its name): the harness binds
        only copies of the work queue's bindings and the firehose to it, so someone else wrote into what the
        harness observes — a ``tamper`` line (tamper_evidence), and the message is not taken for the system's."""
        body = payload_bytes(message)
        self.history.append("tamper", found="changed", fault="tap", kind="broker", link=self.tap_queue,
                            what="a message published straight into the harness's tap queue",
                            expected="only copies of the work queue's bindings and firehose records",
                            observed=f"default exchange, routing key {self.tap_queue!r}, {len(body)} bytes, "
                                     f"sha256 {hashlib.sha256(body).hexdigest()[:16]}")

    def _unwrap(self, message: dict) -> dict | None:
        """Where the message was published and with which properties; None for a firehose record of a publish
        that did not reach the work queue."""
        properties = message.get("properties") or {}
        if message.get("exchange") != TRACE_EXCHANGE:
            exchange = message.get("exchange") or ""
            seen = {"exchange": exchange, "routing_key": message.get("routing_key") or "",
                    "properties": properties, "source": "binding"}
            if exchange not in self.copies_seen:  # the first copy from this exchange
                self.copies_seen.add(exchange)
                kept = self.traced.pop(exchange, [])
                if self._fingerprint(seen, message) in kept[-1:]:
                    return None  # the same publish as the firehose record just kept
            return seen
        trace = properties.get("headers") or {}
        routed = trace.get("routed_queues")
        keys = trace.get("routing_keys") or [""]
        if routed is not None and not routed:
            self._unroutable(trace, keys, message)
            return None
        if self.work_queue not in (routed if routed is not None else keys):
            return None
        exchange = trace.get("exchange_name") or ""
        if exchange and exchange in self.copies_seen:
            return None  # its binding copies stand for it
        seen = {"exchange": exchange, "routing_key": keys[0], "properties": trace.get("properties") or {},
                "source": "firehose"}
        if exchange:
            self.traced.setdefault(exchange, []).append(self._fingerprint(seen, message))
        return seen

    @staticmethod
    def _fingerprint(seen: dict, message: dict) -> tuple:
        # Headers are left out: the firehose nests them in a table, which the management API may render otherwise.
        return seen["routing_key"], message.get("payload"), seen["properties"].get("message_id")

    def sample(self) -> dict:
        out = {}
        for queue, dead in ((self.work_queue, False), (self.dead_letter_queue, True)):
            if not queue:
                continue
            depth = self.m.depth(queue)
            if depth is not None:
                out["dead" if dead else "work"] = depth
                self.history.append("queue", queue=queue, dead_letter=dead, **depth)
        return out

    def tapped(self) -> list[dict]:
        with self._lock:
            return list(self.messages)


class ConsumerSampler(Poller):
    """Every consumer of ``queue``: prefetch_count and its channel's messages_unacknowledged, one ``consumer``
    history line per consumer per tick (``tick`` numbers the samples; a tick with no consumer is kept too).
    The broker refreshes these statistics every collect_statistics_interval (500 ms on the harness stack), so
    sampling faster only repeats values; ~0.15 s catches every refresh."""

    def __init__(self, management: Management, history, queue: str, interval: float = 0.15):
        super().__init__("consumer-sampler", interval)
        self.m = management
        self.history = history
        self.queue = queue
        self.ticks = 0

    def tick(self) -> None:
        from ..prefetch import read_consumers

        samples = read_consumers(self.m.client, self.m.vhost, self.queue)
        self.ticks += 1
        if not samples:
            self.history.append("consumer", queue=self.queue, tick=self.ticks, consumers=0)
        for s in samples:
            self.history.append("consumer", queue=self.queue, tick=self.ticks, consumers=len(samples),
                                consumer_tag=s.consumer, channel=s.channel, prefetch=s.prefetch, unacked=s.unacked)


# --- the work queue permuted (harness/permute.py: the seeded order and what it guarantees) -------------------------

async def _permute(amqp_url: str, queue: str, rng: random.Random, limit: int, timeout: float) -> dict:
    import aiormq

    from ..permute import job_of, permuted

    connection = await aiormq.connect(amqp_url)
    taken = []
    try:
        channel = await connection.channel(publisher_confirms=True)
        while len(taken) < limit:
            got = await channel.basic_get(queue, no_ack=False, timeout=timeout)
            if got.delivery_tag is None:  # Basic.GetEmpty: the queue has no ready message left
                break
            taken.append(got)
        order = permuted(taken, rng)
        published = 0
        try:
            for index in order:
                message = taken[index]
                await channel.basic_publish(message.body, exchange="", routing_key=queue,
                                            properties=message.header.properties, mandatory=True, timeout=timeout)
                published += 1
            for message in taken:
                await channel.basic_ack(message.delivery_tag)
        except BaseException:
            for message in taken:  # back where they were: never lose one (copies already confirmed may repeat)
                try:
                    await channel.basic_reject(message.delivery_tag, requeue=True)
                except Exception:
                    break  # the channel is gone: the broker returns every unacked delivery itself
            raise
        describe = [{"job_id": job_of(m.body).get("job_id"), "attachment_id": job_of(m.body).get("attachment_id"),
                     "attempt": job_of(m.body).get("attempt"), "redelivered": bool(m.redelivered)} for m in taken]
        return {"original": describe, "permuted": [describe[i] for i in order], "order": order,
                "published": published}
    finally:
        await connection.close()


def permute_queue(amqp_url: str, queue: str, seed_rng: random.Random, limit: int = 500, timeout: float = 5.0) -> dict:
    """Permute up to ``limit`` ready messages of ``queue`` (see the module docstring); raises on failure, after
    putting the originals back."""
    import asyncio

    return asyncio.run(asyncio.wait_for(_permute(amqp_url, queue, seed_rng, limit, timeout), timeout * 4 + limit * 0.2))
