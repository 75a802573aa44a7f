"""Event sources against the real RabbitMQ, Redis and NATS on 127.0.0.1
(docs/explanation/events.md).

Each test runs once per broker, on a queue or stream of its own (deleted after):
events in become timers and a due one pages; poisoned messages go to the dead place
and the good ones around them are stored; two runners on one database and one source
share it as competing consumers and page each timer once. Faults (the database or the
broker away, a bug) are in test_source_faults.py.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from slawatch.clock import Clock
from slawatch.db import Database
from slawatch.engine.migrate import migrate
from slawatch.events.sources import Drained, SourceRunner, build
from slawatch.runtime.scheduler import Runner
from tests.integration.helpers import episodes
from tests.integration.source_helpers import (
    KNOWN,
    RULE,
    Broker,
    Counts,
    Nats,
    Redis,
    broker,
    count,
    errors,
    event,
    events_db,
    hook,
    parcel_rule,
    serving,
    shipped,
    timers,
)
from tests.integration.test_cli import slawatch
from tests.receivers import WebhookReceiver, require_service
from tests.waiting import wait_until

__all__ = ["broker", "events_db"]

DAYS_30 = timedelta(days=30)


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
        # A runner given no recorder counts what its sources stored in its metrics.
        labels = {"source": broker.source().name, "outcome": "accepted"}
        counted = runner.metrics.registry.get_sample_value
        assert counted("slawatch_events_total", labels | {"type": "shipped"}) == 3
        assert counted("slawatch_events_total", labels | {"type": "delivered"}) == 1
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
    assert broker.waiting() == 0 and broker.unsettled() == 0


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
    with psycopg.connect(dsn) as c:  # the alerts, in either shape of the outbox
        paged = episodes(c, "parcel")
    assert (len(paged), len(set(paged))) == (n, n)
    assert sorted(receiver.alert_ids) == sorted(f"parcel:p{k}:e1:n1" for k in range(n))
    assert broker.waiting() == 0 and broker.unsettled() == 0 and broker.dead() == []
    assert errors(caplog) == []


def test_a_drain_goes_on_while_the_broker_counts_messages_waiting(
    broker: Broker, events_db: str
) -> None:
    """``run --once`` stops when a fetch came back empty *and* the broker counts nothing
    waiting: a fetch that waits (almost) nothing, as on a slow broker, ends no drain."""
    broker.publish(shipped(range(30), timedelta(0)))
    db = Database(events_db, size=2)
    source = SourceRunner(build(broker.source(batch=5)), db, Clock(), lambda: KNOWN, DAYS_30)
    try:
        assert source.drain(wait=0.001) == Drained(accepted=30)
    finally:
        db.close()
    assert broker.waiting() == 0 and timers(events_db) == 30


def test_nats_messages_a_fetch_was_given_after_it_gave_up_are_counted_as_waiting() -> None:
    """nats-py keeps what the server sends a fetch that has stopped waiting (a drain's
    fetches wait almost nothing) for the next fetch, and the server counts those messages
    delivered, not pending: ``run --once`` must not end its drain with them held."""
    require_service("NATS", 4222)
    broker = Nats(uuid.uuid4().hex[:8])
    consumer = build(broker.source(batch=5))
    try:
        broker.publish(shipped(range(5), timedelta(0)))
        consumer.connect()
        sub, nc = consumer._sub, consumer._nc  # type: ignore[attr-defined]
        # A fetch's request whose answer no fetch waits for, as one that timed out.
        request = json.dumps({"batch": 5, "no_wait": True}).encode()
        consumer._run(nc.publish(sub._nms, request, sub._deliver))  # type: ignore[attr-defined]

        def arrived() -> bool:
            consumer._run(nc.flush())  # type: ignore[attr-defined]  # lets the loop read them
            return bool(sub.pending_msgs >= 5)

        wait_until(arrived, "the five messages in the subscription's queue")
        assert broker.waiting() == 0  # the server: delivered, none pending
        assert consumer.waiting() == 5
        assert len(consumer.fetch(5, 0.001)) == 5
        assert consumer.waiting() == 0
    finally:
        consumer.close()
        broker.cleanup()


def test_an_event_of_a_rule_not_migrated_yet_is_set_aside_saying_so(
    broker: Broker, events_db: str
) -> None:
    """A type of a rule in the files that waits for a migrate (a reload left it out) is
    told so, as POST /v1/events tells it: not "no rule uses this type"."""
    broker.publish([event("picked", "p1", timedelta(0))])
    db = Database(events_db, size=2)
    source = SourceRunner(
        build(broker.source(batch=5)),
        db,
        Clock(),
        lambda: KNOWN,
        DAYS_30,
        unmigrated=lambda: {"picked"},
    )
    try:
        assert source.drain(wait=0.001) == Drained(set_aside=1)
    finally:
        db.close()
    ((_, reason),) = broker.dead()
    assert "'picked': no running rule uses this type; its rule is in the rule files but" in reason
    assert "run 'slawatch migrate' (then reload)" in reason


# --- the command line ----------------------------------------------------------------


def config_dirs(tmp_path: Path, source: str | None, rule: str = RULE) -> list[str]:
    """rules/, notifiers/ (console) and, unless None, sources/ with ``source`` in it."""
    for name in ("rules", "notifiers", "sources"):
        (tmp_path / name).mkdir()
    (tmp_path / "rules" / "parcel.yaml").write_text(rule.replace("[hook]", "[console]"))
    (tmp_path / "notifiers" / "console.yaml").write_text("type: console\n")
    args = ["--rules", str(tmp_path / "rules"), "--notifiers", str(tmp_path / "notifiers")]
    if source is not None:
        (tmp_path / "sources" / "stream.yaml").write_text(source)
        args += ["--sources", str(tmp_path / "sources")]
    return args


def test_check_counts_the_sources(tmp_path: Path) -> None:
    args = config_dirs(tmp_path, "type: redis\nstream: parcels\nmap: cloudevents\n")
    result = slawatch(*args, "check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: 1 rules, 1 notifiers, 1 sources (files only")


def test_run_once_drains_the_sources_first(tmp_path: Path, dsn: str) -> None:
    require_service("Redis", 6379)
    stream = Redis(uuid.uuid4().hex[:8])
    try:
        args = config_dirs(tmp_path, f"type: redis\nstream: '{stream.stream}'\n")
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn, [parcel_rule()])  # what `slawatch migrate` does, without a process
        stream.publish([*shipped(range(2)), b"{"])  # due an hour ago; and a bad one
        result = slawatch(*args, "run", "--once", "--json", dsn=dsn)
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["sources"] == {"stream": {"accepted": 2, "duplicates": 0, "set_aside": 1}}
        assert summary["rules"] == {"parcel": {"claimed": 2, "closed": 0}}  # paged at once
        assert "source stream: set aside entry " in result.stderr
        assert len(stream.dead()) == 1
    finally:
        stream.cleanup()
