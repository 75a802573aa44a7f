"""Event sources against the real RabbitMQ, Redis and NATS on 127.0.0.1 (DESIGN.md §7).

Each test runs once per broker, on a queue or stream of its own (deleted after):
events in become timers and a due one pages; poisoned messages go to the dead place
and the good ones around them are stored; a database outage pauses consumption and
loses nothing; two runners on one database and one source share it as competing
consumers and page each timer once. Without a broker its tests skip, unless
SLAWATCH_REQUIRE_SERVICES=1 (CI), where they fail.
"""

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
from slawatch.events.sources import Drained
from slawatch.runtime.scheduler import Runner
from tests.pgcluster import PgCluster
from tests.receivers import WebhookReceiver, receiver, require_service
from tests.waiting import wait_until

__all__ = ["receiver"]

AMQP = "amqp://guest:guest@127.0.0.1:5672/"

RULE = """\
name: parcel
events: {start: shipped, stop: delivered, within: 1h}
every: 0.2
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

    def big(self) -> int:
        """The size of the too-big message this broker takes."""
        return 10 * 1024 * 1024

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

    def consumers(self) -> int:
        try:
            return int(self._consumer().num_waiting)  # pull requests waiting for messages
        except nats.js.errors.NotFoundError:  # no consumer yet
            return 0

    def big(self) -> int:
        # This server takes at most 1 MiB per message (max_payload): as big as it goes.
        return 1_000_000

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


# --- the tests -------------------------------------------------------------------------


def test_cloudevents_in_become_timers_and_a_due_one_pages(
    broker: Broker, events_db: str, receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = events_db

    def cloudevent(kind: str, key: str, ago: timedelta) -> bytes:
        at = (datetime.now(UTC) - ago).isoformat().replace("+00:00", "Z")
        return json.dumps(
            {
                "specversion": "1.0",
                "type": kind,
                "source": "/carrier",
                "id": f"{kind}-{key}",
                "subject": key,
                "time": at,
                "data": {"carrier": "ups"},
            }
        ).encode()

    broker.publish(
        [
            cloudevent("shipped", "late", timedelta(hours=2)),  # due an hour ago: pages
            cloudevent("shipped", "fresh", timedelta(0)),  # due in an hour
            # Out of order: the stop first, then its start; never pages.
            cloudevent("delivered", "done", timedelta(minutes=90)),
            cloudevent("shipped", "done", timedelta(hours=2)),
        ]
    )
    runner = Runner(
        dsn,
        [parcel_rule()],
        [hook(receiver)],
        poll=0.2,
        backoff_cap=0.5,
        sources=[broker.source(map="cloudevents")],
    )
    with serving(runner):
        wait_until(lambda: timers(dsn) == 3, "3 timers")
        stored = datetime.now(UTC)
        wait_until(lambda: receiver.alert_ids == ["parcel:late:e1:n1"], "the late parcel's page")
        wait_until(lambda: _scanned_after(dsn, stored), "a scan after every event was stored")
        assert runner.health()["sources"] == {broker.source().name: True}
    assert receiver.alert_ids == ["parcel:late:e1:n1"]
    (request,) = receiver.requests
    assert request.alerts[0]["row"]["data"] == {"carrier": "ups"}
    assert broker.dead() == []
    assert errors(caplog) == []


def _scanned_after(dsn: str, at: datetime) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT last_at FROM slawatch.scan WHERE rule = 'parcel'").fetchone()
    return row is not None and row[0] > at


def test_poisoned_messages_are_set_aside_and_the_good_ones_around_them_stored(
    broker: Broker, events_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="slawatch")
    dsn = events_db
    big = b'{"type": "shipped", "key": "big", "data": {"blob": "' + b"x" * broker.big() + b'"}}'
    poison = [
        b"this is not JSON",
        event("shiped", "typo"),  # a type no rule uses
        json.dumps({"type": "shipped", "id": "no-key"}).encode(),
        big,
    ]
    good = shipped(range(1, 4), timedelta(0))
    broker.publish([good[0], *poison[:2], good[1], *poison[2:], good[2]])
    counts = Counts()
    runner = Runner(dsn, [parcel_rule()], [], poll=0.2, sources=[broker.source()], recorder=counts)
    try:
        result = runner.once()  # run --once: what waits in the source is drained first
    finally:
        runner.close()
    name = broker.source().name
    assert result.errors == []
    assert result.sources == {name: Drained(accepted=3, duplicates=0, set_aside=4)}
    assert f"source {name}: 3 accepted, 0 duplicates, 4 set aside" in result.lines()
    assert timers(dsn) == 3
    dead = broker.dead()
    assert [body for body, _ in dead] == poison  # whole, in order
    reasons = [reason for _, reason in dead]
    assert reasons[0].startswith("not JSON: ")
    assert reasons[1].startswith("type: 'shiped': no rule uses this type")
    assert reasons[2] == "key: is required"
    assert reasons[3] == f"{len(big):,} bytes, more than 262,144"
    assert counts.reasons == reasons
    # One line each, naming the source and the reason.
    lines = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(lines) == 4
    assert all(line.startswith(f"source {name}: set aside ") for line in lines)
    assert all(reason in line for reason, line in zip(reasons, lines, strict=True))
    assert broker.waiting() == 0


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    with PgCluster() as c:
        yield c


def test_a_database_outage_pauses_consumption_and_loses_nothing(
    broker: Broker, cluster: PgCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slawatch")
    dsn = cluster.database(f"sources_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [parcel_rule()])
    counts = Counts()
    batch = 5
    runner = Runner(
        dsn,
        [parcel_rule()],
        [],
        timeout=0.5,
        poll=0.2,
        backoff_cap=0.2,
        sources=[broker.source(batch=batch)],
        recorder=counts,
    )
    (source,) = runner.sources.values()
    with serving(runner):
        broker.publish(shipped(range(0, 5), timedelta(0)))
        wait_until(lambda: counts.accepted == 5, "the first 5 events stored")
        cluster.stop()
        try:
            broker.publish(shipped(range(5, 20), timedelta(0)))
            # One batch in hand (what had come when it was read), tried again and again;
            # the rest not taken from the broker.
            wait_until(lambda: source.held >= 1 and source.holds >= 1, "a batch held")
            waiting = broker.waiting()
            assert waiting >= 15 - batch
            wait_until(lambda: source.holds >= 3, "more attempts")
            assert broker.waiting() == waiting
            assert counts.accepted == 5
        finally:
            cluster.start()
        wait_until(lambda: counts.accepted == 20, "every event stored after the outage")
    assert counts.duplicates == 0 and counts.reasons == []
    assert timers(dsn) == 20
    assert count(dsn, "SELECT count(*) FROM slawatch.event_seen") == 20
    assert broker.dead() == [] and broker.waiting() == 0
    down = [r for r in caplog.records if "database unreachable" in r.getMessage()]
    assert len(down) == 1


def test_two_runners_share_a_source_and_page_each_timer_once(
    broker: Broker, events_db: str, receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = events_db
    n = 60
    counts = [Counts(), Counts()]
    runners = [
        Runner(
            dsn,
            [parcel_rule()],
            [hook(receiver)],
            poll=0.2,
            backoff_cap=0.5,
            sources=[broker.source(batch=5)],
            recorder=c,
        )
        for c in counts
    ]
    with serving(runners[0]), serving(runners[1]):
        wait_until(lambda: broker.consumers() == 2, "both runners consuming")
        broker.publish(shipped(range(n)))  # all due an hour ago
        wait_until(lambda: sum(c.accepted for c in counts) == n, f"{n} events stored")
        wait_until(lambda: len(receiver.alert_ids) >= n, f"{n} pages")
    assert all(c.accepted > 0 for c in counts), [c.accepted for c in counts]
    assert sum(c.duplicates for c in counts) == 0
    assert count(dsn, "SELECT count(*) FROM slawatch.event_seen") == n
    assert timers(dsn) == n
    alerts = count(dsn, "SELECT count(*) FROM slawatch.alert")
    distinct = count(
        dsn, "SELECT count(*) FROM (SELECT DISTINCT rule, key, episode, n FROM slawatch.alert) a"
    )
    assert (alerts, distinct) == (n, n)
    assert sorted(receiver.alert_ids) == sorted(f"parcel:p{k}:e1:n1" for k in range(n))
    assert broker.waiting() == 0 and broker.dead() == []
    assert errors(caplog) == []
