"""Brokers, runners and counts for the event source tests (test_sources.py,
test_source_faults.py): a queue or stream of its own per test on the real RabbitMQ,
Redis or NATS on 127.0.0.1, skipped when the broker is absent unless
SLAWATCH_REQUIRE_SERVICES=1 (CI), where it fails."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import nats.js.errors
import pika
import pika.exceptions
import psycopg
import pytest
import redis
import redis.exceptions
import yaml

from slawatch.config.notifiers import WebhookConfig
from slawatch.config.rules import Rule
from slawatch.config.sources import AmqpSource, NatsSource, RedisSource, SourceConfig
from slawatch.engine.migrate import migrate
from slawatch.events.ingest import Ingested
from slawatch.runtime.scheduler import Runner
from tests.receivers import WebhookReceiver, require_service

AMQP = "amqp://guest:guest@127.0.0.1:5672/"
KNOWN = ("shipped", "delivered")  # the event types of parcel_rule()

RULE = """\
name: parcel
events: {start: shipped, stop: delivered, within: 1h}
every: 1  # the least slawatch accepts (docs/reference/rules.md)
notify: [hook]
"""


def parcel_rule() -> Rule:
    return Rule.model_validate(yaml.safe_load(RULE))


def hook(receiver: WebhookReceiver) -> WebhookConfig:
    return WebhookConfig.model_validate(
        {"name": "hook", "type": "webhook", "url": receiver.url, "timeout": "2s"}
    )


def event(kind: str, key: str, ago: timedelta = timedelta(0), **more: Any) -> bytes:
    at = (datetime.now(UTC) - ago).isoformat()
    return json.dumps({"type": kind, "key": key, "at": at, "id": f"{kind}-{key}", **more}).encode()


def shipped(keys: range, ago: timedelta = timedelta(hours=2)) -> list[bytes]:
    return [event("shipped", f"p{k}", ago) for k in keys]


# --- the brokers -----------------------------------------------------------------------


class Broker:
    """One broker's queue or stream for one test: publish, read the dead place, look."""

    port = 0
    service = ""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def source(self, batch: int = 100, **more: Any) -> SourceConfig:
        raise NotImplementedError

    def publish(self, bodies: list[bytes]) -> None:
        raise NotImplementedError

    def dead(self) -> list[tuple[bytes, str]]:
        """What was set aside: (body, reason), in order."""
        raise NotImplementedError

    def waiting(self) -> int:
        """Messages not delivered to any consumer yet."""
        raise NotImplementedError

    def consumers(self) -> int:
        """Consumers connected and asking for messages."""
        raise NotImplementedError

    def idle(self) -> bool:
        """No consumer is asking for messages (one whose connection was cut is gone)."""
        return self.consumers() == 0

    def unsettled(self) -> int:
        """Messages delivered to a consumer and not acknowledged."""
        raise NotImplementedError

    def big(self) -> int:
        """The size of the too-big message this broker takes."""
        return 10 * 1024 * 1024

    def url(self, port: int) -> str:
        """The broker's URL at another port (a proxy's)."""
        raise NotImplementedError

    def cleanup(self) -> None:
        raise NotImplementedError


class Rabbit(Broker):
    port, service = 5672, "RabbitMQ"

    def __init__(self, tag: str) -> None:
        super().__init__(tag)
        self.queue = f"slawatch_test_{tag}"
        self.conn = pika.BlockingConnection(pika.URLParameters(AMQP))
        self.channel = self.conn.channel()

    def source(self, batch: int = 100, **more: Any) -> SourceConfig:
        return AmqpSource(name="rabbit", type="amqp", queue=self.queue, batch=batch, **more)

    def url(self, port: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{port}/"

    def publish(self, bodies: list[bytes]) -> None:
        self.channel.queue_declare(self.queue, durable=True)
        for body in bodies:
            self.channel.basic_publish("", self.queue, body)

    def dead(self) -> list[tuple[bytes, str]]:
        out = []
        while True:
            method, props, body = self.channel.basic_get(f"{self.queue}.dead", auto_ack=True)
            if method is None:
                return out
            out.append((body, props.headers["x-slawatch-reason"]))

    def _declared(self) -> Any:
        try:
            return self.channel.queue_declare(self.queue, passive=True).method
        except pika.exceptions.ChannelClosedByBroker:  # not declared yet
            self.channel = self.conn.channel()
            return None

    def waiting(self) -> int:
        return int(self._declared().message_count)

    def consumers(self) -> int:
        declared = self._declared()
        return 0 if declared is None else int(declared.consumer_count)

    def unsettled(self) -> int:
        # Unacknowledged deliveries go back to the queue when their connection closes,
        # where waiting() counts them; AMQP does not tell how many a live one holds.
        return 0

    def cleanup(self) -> None:
        for queue in (self.queue, f"{self.queue}.dead"):
            self.channel.queue_delete(queue)
        self.conn.close()


class Redis(Broker):
    port, service = 6379, "Redis"

    def __init__(self, tag: str) -> None:
        super().__init__(tag)
        self.stream = f"slawatch_test:{tag}"
        self.client = redis.Redis()

    def source(self, batch: int = 100, **more: Any) -> SourceConfig:
        return RedisSource(name="stream", type="redis", stream=self.stream, batch=batch, **more)

    def url(self, port: int) -> str:
        return f"redis://127.0.0.1:{port}/0"

    def publish(self, bodies: list[bytes]) -> None:
        for body in bodies:
            self.client.xadd(self.stream, {"event": body})

    def dead(self) -> list[tuple[bytes, str]]:
        entries = self.client.xrange(f"{self.stream}.dead")
        return [(f[b"event"], f[b"slawatch_reason"].decode()) for _, f in entries]

    def waiting(self) -> int:
        (group,) = self.client.xinfo_groups(self.stream)
        return int(group["lag"])

    def consumers(self) -> int:
        try:
            return len(self.client.xinfo_consumers(self.stream, "slawatch"))
        except redis.exceptions.ResponseError:  # no stream or group yet
            return 0

    def idle(self) -> bool:
        return True  # a read blocked on a connection that was cut ends with it

    def unsettled(self) -> int:
        return int(self.client.xpending(self.stream, "slawatch")["pending"])

    def cleanup(self) -> None:
        self.client.delete(self.stream, f"{self.stream}.dead")
        self.client.close()


class Nats(Broker):
    port, service = 4222, "NATS"

    def __init__(self, tag: str) -> None:
        super().__init__(tag)
        self.stream = f"SLAWATCH_TEST_{tag}"
        self.subject = f"slawatch_test.{tag}"
        self.run(lambda js: js.add_stream(name=self.stream, subjects=[self.subject]))

    @staticmethod
    def run(work: Callable[[Any], Any]) -> Any:
        async def go() -> Any:
            nc = await nats.connect("nats://127.0.0.1:4222")
            try:
                return await work(nc.jetstream())
            finally:
                await nc.close()

        return asyncio.run(go())

    def source(self, batch: int = 100, **more: Any) -> SourceConfig:
        return NatsSource(
            name="jet", type="nats", stream=self.stream, subject=self.subject, batch=batch, **more
        )

    def publish(self, bodies: list[bytes]) -> None:
        async def publish(js: Any) -> None:
            for body in bodies:
                await js.publish(self.subject, body)

        self.run(publish)

    def dead(self) -> list[tuple[bytes, str]]:
        async def read(js: Any) -> list[tuple[bytes, str]]:
            try:
                info = await js.stream_info(f"{self.stream}_dead")
            except nats.js.errors.NotFoundError:
                return []
            out = []
            for seq in range(1, info.state.messages + 1):
                msg = await js.get_msg(f"{self.stream}_dead", seq)
                out.append((msg.data or b"", msg.headers["Slawatch-Reason"]))
            return out

        return list(self.run(read))

    def _consumer(self) -> Any:
        return self.run(lambda js: js.consumer_info(self.stream, "slawatch"))

    def waiting(self) -> int:
        return int(self._consumer().num_pending)

    def unsettled(self) -> int:
        return int(self._consumer().num_ack_pending)

    def consumers(self) -> int:
        try:
            return int(self._consumer().num_waiting)  # pull requests waiting for messages
        except nats.js.errors.NotFoundError:  # no consumer yet
            return 0

    def big(self) -> int:
        # This server takes at most 1 MiB per message (max_payload): as big as it goes.
        return 1_000_000

    def url(self, port: int) -> str:
        return f"nats://127.0.0.1:{port}"

    def cleanup(self) -> None:
        async def delete(js: Any) -> None:
            for name in (self.stream, f"{self.stream}_dead"):
                with suppress(nats.js.errors.NotFoundError):
                    await js.delete_stream(name)

        self.run(delete)


@pytest.fixture(params=[Rabbit, Redis, Nats], ids=["amqp", "redis", "nats"])
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    kind: type[Broker] = request.param
    require_service(kind.service, kind.port)
    b = kind(uuid.uuid4().hex[:8])
    try:
        yield b
    finally:
        b.cleanup()


# --- the runner ------------------------------------------------------------------------


@dataclass
class Counts:
    """A Recorder that remembers what it was told."""

    accepted: int = 0
    duplicates: int = 0
    reasons: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ingested(self, source: str, got: Ingested) -> None:
        with self.lock:
            self.accepted += got.accepted
            self.duplicates += got.duplicates

    def set_aside(self, source: str, reason: str) -> None:
        with self.lock:
            self.reasons.append(reason)


@contextmanager
def serving(runner: Runner) -> Iterator[Runner]:
    thread = threading.Thread(target=runner.serve, name="serve", daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop()
        thread.join(60)
        runner.close()
    assert not thread.is_alive()


def count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def timers(dsn: str) -> int:
    return count(dsn, "SELECT count(*) FROM slawatch.parcel_timers")


def errors(caplog: pytest.LogCaptureFixture, *allowed: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR
        and r.name.startswith("slawatch")
        and not any(a in r.getMessage() for a in allowed)
    ]


@pytest.fixture
def events_db(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [parcel_rule()])
    return dsn
