"""Event sources when things fail, per broker (RabbitMQ, Redis, NATS on 127.0.0.1):
the database away pauses consumption and loses nothing; the broker away is one line
each way and loses nothing; a bug while consuming is logged whole and the consumer
starts again (docs/explanation/events.md)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from slawatch.clock import Clock
from slawatch.db import Database
from slawatch.engine.migrate import migrate
from slawatch.events.sources import SourceRunner, build
from slawatch.events.sources.base import Message
from slawatch.events.sources.redis import RedisConsumer
from slawatch.runtime.scheduler import Runner
from tests.integration.source_helpers import (
    KNOWN,
    Broker,
    Counts,
    Redis,
    broker,
    count,
    errors,
    events_db,
    parcel_rule,
    serving,
    shipped,
    timers,
)
from tests.pgcluster import PgCluster
from tests.receivers import require_service
from tests.tcpproxy import TcpProxy
from tests.waiting import wait_until

__all__ = ["broker", "events_db"]


class FaultyClock(Clock):
    """A clock that raises (a stand-in for any bug) its first ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def now(self) -> datetime:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("clock broke")
        return super().now()


@contextmanager
def consuming(source: SourceRunner) -> Iterator[SourceRunner]:
    source.start()
    try:
        yield source
    finally:
        source.stop()
        source.db.close()


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def test_a_broker_outage_is_one_line_each_way_and_loses_nothing(
    broker: Broker, events_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slawatch")
    proxy = TcpProxy("127.0.0.1", broker.port)
    counts = Counts()
    config = broker.source(url=broker.url(proxy.port))
    source = SourceRunner(
        build(config),
        Database(events_db, size=2),
        Clock(),
        lambda: KNOWN,
        timedelta(days=30),
        counts,
        backoff_cap=0.2,
        poll=0.2,
    )
    kind = source.consumer.kind
    proxies = [proxy]
    with ExitStack() as stack:
        stack.callback(lambda: [p.close() for p in proxies])
        stack.enter_context(consuming(source))  # stopped before the proxies close
        broker.publish(shipped(range(0, 5), timedelta(0)))
        wait_until(lambda: counts.accepted == 5, "the first 5 events stored")
        proxy.close()  # the broker is gone: connections cut, nothing listens
        wait_until(lambda: lines(caplog, f"{kind} unreachable"), "the outage line")
        # (Else JetStream may give the next ones to the cut connection's last pull
        # request; they would come again only after the ack wait, 30 s.)
        wait_until(broker.idle, "the broker to see the consumer gone")
        broker.publish(shipped(range(5, 10), timedelta(0)))
        proxies.append(TcpProxy("127.0.0.1", broker.port, listen=proxy.port))  # back
        wait_until(lambda: counts.accepted == 10, "the 5 events sent meanwhile stored")
        wait_until(lambda: lines(caplog, f"{kind} reachable again"), "the recovery line")
        assert source.alive()
    # Each event stored once. An acknowledgement on its way when the connection was cut
    # is lost with it: the broker delivers that message again, a duplicate (same id).
    assert counts.accepted == 10 and counts.reasons == []
    assert timers(events_db) == 10
    assert count(events_db, "SELECT count(*) FROM slawatch.event_seen") == 10
    (down,) = lines(caplog, f"source {config.name}: {kind} unreachable: ")
    assert down.levelno == logging.ERROR and "\n" not in down.getMessage()
    assert len(lines(caplog, f"source {config.name}: {kind} reachable again after")) == 1
    assert errors(caplog, "unreachable") == []


def test_a_bug_while_consuming_is_logged_and_the_consumer_starts_again(
    broker: Broker, events_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slawatch")
    counts = Counts()
    config = broker.source()
    source = SourceRunner(
        build(config),
        Database(events_db, size=2),
        FaultyClock(2),  # the first two batches fail in the middle of their handling
        lambda: KNOWN,
        timedelta(days=30),
        counts,
        backoff_cap=0.2,
        poll=0.2,
    )
    broker.publish(shipped(range(3), timedelta(0)))
    with consuming(source):
        # Well before JetStream's ack wait (30 s): the failed batch was given back (+NAK).
        wait_until(lambda: counts.accepted == 3, "the events stored after two failures", 20)
        wait_until(lambda: lines(caplog, "working again"), "the recovery line")
        assert source.alive()
    (failing,) = lines(caplog, f"source {config.name} failing: unexpected RuntimeError")
    assert failing.levelno == logging.ERROR and failing.exc_info is not None
    assert counts.duplicates == 0 and counts.reasons == [] and broker.dead() == []
    assert timers(events_db) == 3 and broker.waiting() == 0


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
    # Redis: a second process takes over what a stopped one held after this.
    config = broker.source(batch=batch, **({"reclaim_after": "1s"} if broker.port == 6379 else {}))

    def runner() -> Runner:
        return Runner(
            dsn,
            [parcel_rule()],
            [],
            timeout=0.5,
            poll=0.2,
            backoff_cap=0.2,
            sources=[config],
            recorder=counts,
        )

    first = runner()
    (source,) = first.sources.values()
    with serving(first):
        broker.publish(shipped(range(0, 5), timedelta(0)))
        wait_until(lambda: counts.accepted == 5, "the first 5 events stored")
        cluster.stop()
        try:
            broker.publish(shipped(range(5, 15), timedelta(0)))
            # One batch in hand (what had come when it was read), tried again and again;
            # the rest not taken from the broker.
            wait_until(lambda: source.held >= 1 and source.holds >= 1, "a batch held")
            waiting = broker.waiting()
            assert waiting >= 10 - batch
            wait_until(lambda: source.holds >= 2, "another attempt")
            assert broker.waiting() == waiting
            assert counts.accepted == 5
        finally:
            cluster.start()
        wait_until(lambda: counts.accepted == 15, "the events stored after the outage")
        # Stopped while the database is away: what it held goes back to the broker.
        cluster.stop()
        try:
            broker.publish(shipped(range(15, 20), timedelta(0)))
            wait_until(lambda: source.held >= 1 and source.holds >= 1, "a batch held again")
        except BaseException:
            cluster.start()
            raise
    cluster.start()
    with serving(runner()):  # another process
        wait_until(lambda: counts.accepted == 20, "every event stored, by the next process")
    assert counts.duplicates == 0 and counts.reasons == []
    assert timers(dsn) == 20
    assert count(dsn, "SELECT count(*) FROM slawatch.event_seen") == 20
    assert broker.dead() == [] and broker.waiting() == 0
    down = [r for r in caplog.records if "database unreachable" in r.getMessage()]
    assert len(down) == 2  # one line per outage


def test_redis_takes_over_what_a_dead_consumer_left_only_after_reclaim_after() -> None:
    require_service("Redis", 6379)
    stream = Redis(uuid.uuid4().hex[:8])
    held = RedisConsumer(stream.source(consumer="died"))
    other = RedisConsumer(stream.source(consumer="alive", reclaim_after="1s"))
    try:
        stream.publish(shipped(range(3)))
        held.connect()
        assert len(held.fetch(10, 0.1)) == 3  # read, never acknowledged: the process died
        other.connect()
        assert other.fetch(10, 0.01) == []  # not idle a second yet: not taken

        def idle_ms() -> int:
            return min(p["time_since_delivered"] for p in pending(stream))

        wait_until(lambda: idle_ms() >= 1000, "the entries idle for reclaim_after")
        taken: list[Message] = []
        wait_until(lambda: bool(taken.extend(other.fetch(10, 0.05)) or taken), "the takeover")
        assert len(taken) == 3
        assert {p["consumer"] for p in pending(stream)} == {b"alive"}
        # Held for a database that is away: keepalive claims them again, so that no
        # other consumer takes them over meanwhile.
        wait_until(lambda: idle_ms() >= 1000, "the taken entries idle again")
        other.keepalive(taken)
        assert idle_ms() < 1000
        other.ack(taken)
        assert pending(stream) == []
    finally:
        held.close()
        other.close()
        stream.cleanup()


def pending(stream: Redis) -> list[dict[str, Any]]:
    return list(stream.client.xpending_range(stream.stream, "slawatch", "-", "+", 100))
