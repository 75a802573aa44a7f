"""Concurrent batches of events over the same keys never deadlock: ``slawatch.events``
takes its row locks in one order (ids by type and id, then timers by key), and
:func:`slawatch.events.ingest.ingest` tries a deadlock with another writer (the
application's own transactions) again before it answers.

Each test makes the deadlock certain without that order: batches of many keys in
opposite orders, started together from a barrier, or an application transaction that
holds one key and asks for another that the batch holds.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
import pytest

from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.engine.migrate import migrate
from slawatch.errors import DatabaseError
from slawatch.events import ingest as ingest_module
from slawatch.events.ingest import Event, Ingested, ingest
from tests.integration.helpers import Conn
from tests.waiting import lock_waits, wait_until

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
KEYS = 3000  # per batch: two batches in opposite orders meet in the middle
BATCHES = 4

RULE = Rule.model_validate(
    {
        "name": "parcel",
        "events": {"start": "parcel_shipped", "stop": "parcel_delivered", "within": "72h"},
        "notify": ["hook"],
    }
)


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    with Database(dsn, size=BATCHES, pooler="none") as database:
        yield database


def together(work: list[Callable[[], Any]]) -> list[BaseException]:
    """Run each of ``work`` in a thread of its own, all released at once; the errors."""
    barrier = threading.Barrier(len(work))
    errors: list[BaseException] = []

    def run(job: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            job()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(job,)) for job in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    return errors


def batch(keys: list[str], *, ids: bool) -> list[dict[str, Any]]:
    """A start and a stop of each key, in the keys' order (the same ids in every batch
    with ``ids``: producers sending the same events)."""
    out: list[dict[str, Any]] = []
    for k in keys:
        for kind in ("parcel_shipped", "parcel_delivered"):
            event: dict[str, Any] = {"type": kind, "key": k, "at": NOW.isoformat()}
            if ids:
                event["id"] = f"{kind}-{k}"
            out.append(event)
    return out


@pytest.mark.parametrize("ids", [False, True], ids=["timers", "event-ids"])
def test_batches_in_opposite_orders_all_commit(dsn: str, conn: Conn, ids: bool) -> None:
    """slawatch.events itself orders its writes: every caller (HTTP, brokers, the CLI, a
    script of the operator's) is covered, without the ingest's retry."""
    migrate(conn, [RULE])
    keys = [f"k{i:05d}" for i in range(KEYS)]
    bodies = [
        orjson.dumps(batch(keys if n % 2 == 0 else keys[::-1], ids=ids)).decode()
        for n in range(BATCHES)
    ]
    sessions = [psycopg.connect(dsn, autocommit=True) for _ in bodies]
    outcomes: list[list[tuple[Any, ...]]] = []

    def send(session: psycopg.Connection[Any], body: str) -> Callable[[], None]:
        def job() -> None:
            rows = session.execute(
                "SELECT type, outcome, events FROM slawatch.events(%s::jsonb, %s)", (body, NOW)
            ).fetchall()
            outcomes.append(rows)

        return job

    try:
        errors = together([send(s, b) for s, b in zip(sessions, bodies, strict=True)])
    finally:
        for s in sessions:
            s.close()
    assert errors == []
    counted: dict[str, int] = {}
    for rows in outcomes:
        for _, outcome, n in rows:
            counted[outcome] = counted.get(outcome, 0) + int(n)
    if ids:  # each event stored once, the same one in the other batches a repeat
        assert counted == {"accepted": 2 * KEYS, "duplicate": 2 * KEYS * (BATCHES - 1)}
    else:
        assert counted == {"accepted": 2 * KEYS * BATCHES}
    assert conn.execute("SELECT count(*) FROM slawatch.parcel_timers").fetchone() == (KEYS,)


def test_concurrent_ingests_in_random_orders_all_succeed(db: Database, conn: Conn) -> None:
    """As HTTP, the brokers and ``slawatch event`` store batches: overlapping keys, each
    batch in an order of its own."""
    migrate(conn, [RULE])
    rng = random.Random(24)
    keys = [f"k{i:05d}" for i in range(KEYS)]
    batches = []
    for n in range(BATCHES):
        order = keys[::-1] if n % 2 else list(keys)
        if n >= 2:
            rng.shuffle(order)
        batches.append([Event(e["type"], e["key"], NOW) for e in batch(order, ids=False)])
    got: list[Ingested] = []
    errors = together([lambda b=b: got.append(ingest(db, b, NOW)) for b in batches])
    assert errors == []
    assert sorted(g.accepted for g in got) == [2 * KEYS] * BATCHES


def _app_deadlock(dsn: str, db: Database, conn: Conn) -> tuple[list[Any], psycopg.Connection[Any]]:
    """An application transaction holds key b and, once a batch of [a, b] holds a and
    waits for b, asks for a: a deadlock PostgreSQL breaks by failing the batch (its wait
    began first, so its deadlock check runs first). Returns what the batch's thread got
    (its result or its error) and the application's connection, its transaction open."""
    migrate(conn, [RULE])
    app = psycopg.connect(dsn)  # not autocommit: the application's transaction
    app.execute("SET deadlock_timeout = '30s'")  # the batch's check comes first
    app.execute("SELECT slawatch.event('parcel_shipped', 'b')")
    result: list[Any] = []

    def store() -> None:
        events = [Event("parcel_shipped", "a", NOW), Event("parcel_shipped", "b", NOW)]
        try:
            result.append(ingest(db, events, NOW))
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=store)
    thread.start()
    wait_until(lambda: "transactionid" in lock_waits(conn), "the batch waiting for key b")
    app.execute("SELECT slawatch.event('parcel_shipped', 'a')")  # waits until the batch fails
    app.commit()
    thread.join(60)
    assert not thread.is_alive()
    return result, app


def test_a_deadlock_with_the_application_is_tried_again(dsn: str, db: Database, conn: Conn) -> None:
    result, app = _app_deadlock(dsn, db, conn)
    app.close()
    assert isinstance(result[0], Ingested) and result[0].accepted == 2
    rows = conn.execute("SELECT key FROM slawatch.parcel_timers ORDER BY key").fetchall()
    assert rows == [("a",), ("b",)]


def test_a_deadlock_that_persists_is_logged_and_refused(
    dsn: str, db: Database, conn: Conn, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setattr(ingest_module, "TRIES", 1)  # the first deadlock is the last try
    with caplog.at_level(logging.WARNING, logger="slawatch.events.ingest"):
        result, app = _app_deadlock(dsn, db, conn)
    app.close()
    assert isinstance(result[0], DatabaseError) and "deadlock detected" in str(result[0])
    assert any(
        "storing 2 events: deadlock 1 times in a row, the batch is refused" in r.getMessage()
        for r in caplog.records
    )
    # The application's transaction went on and committed.
    rows = conn.execute("SELECT key FROM slawatch.parcel_timers ORDER BY key").fetchall()
    assert rows == [("a",), ("b",)]
