"""The event metrics (slawatch/operate/metrics.py) against a real database:
``slawatch_timers_open{rule}`` read at scrape time, ``slawatch_events_total`` counted
through the methods the ways in call."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import yaml
from prometheus_client import generate_latest
from psycopg import sql

from slawatch.clock import Clock
from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare_all
from slawatch.events.ingest import Event, Ingested, ingest
from slawatch.operate.inspect import open_timers_statement
from slawatch.operate.metrics import Metrics
from tests.integration.helpers import Conn, FixedClock, claim_all

NOW = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)


def rule(name: str, events: str) -> Rule:
    return Rule.model_validate({"name": name, "events": yaml.safe_load(events), "notify": ["c"]})


PARCEL = rule("parcel", "{start: shipped, stop: delivered, within: 1h}")
NIGHTLY = rule("nightly", "{beat: nightly_ping, schedule: '0 2 * * *', grace: 1h}")
TABLE = Rule.model_validate(
    {
        "name": "orders",
        "table": "public.orders",
        "key": "id",
        "deadline": "paid_at",
        "open_when": "true",
        "notify": ["c"],
    }
)


def gauge(metrics: Metrics, rule: str) -> float | None:
    return metrics.registry.get_sample_value("slawatch_timers_open", {"rule": rule})


def test_open_timers_per_event_rule(conn: Conn, dsn: str) -> None:
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY, paid_at timestamptz)")
    rules = [PARCEL, NIGHTLY, TABLE]
    migrate(conn, rules)
    shown = list(rules)
    with Database(dsn, size=2, timeout=5) as db:
        metrics = Metrics(db, Clock(), lambda: ["c"], lambda: shown)
        assert gauge(metrics, "parcel") == 0 and gauge(metrics, "nightly") == 0
        assert gauge(metrics, "orders") is None  # a table rule has no timers

        early = NOW - timedelta(hours=3)
        events = [Event("shipped", f"p{i}", at=early) for i in range(1, 6)]
        events += [Event("delivered", "p1", at=early + timedelta(minutes=5))]
        events += [Event("nightly_ping", "db1"), Event("nightly_ping", "db2")]
        ingest(db, events, NOW)
        assert (gauge(metrics, "parcel"), gauge(metrics, "nightly")) == (4, 2)

        # Notified (an open episode, in the re-notify index): still open.
        plan = prepare_all(conn, rules)["parcel"]
        assert claim_all(conn, plan, NOW) == 4
        ingest(db, [Event("delivered", "p2", at=NOW)], NOW)
        assert gauge(metrics, "parcel") == 3
        # The scheduled beats given their deadline (not yet notified): still open.
        conn.execute("UPDATE slawatch.nightly_timers SET due_at = %s", (NOW,))
        assert gauge(metrics, "nightly") == 2
        conn.execute(
            "UPDATE slawatch.nightly_timers SET sw_nightly_seen = due_at WHERE key = 'db1'"
        )
        assert gauge(metrics, "nightly") == 2

        # A rule added by a reload before its migrate: left out, the rest still read.
        shown.append(rule("late", "{beat: late_ping, within: 1h}"))
        text = generate_latest(metrics.registry).decode()
        assert 'slawatch_timers_open{rule="parcel"} 3.0' in text
        assert 'rule="late"' not in text
        assert "slawatch_outbox_up 1.0" in text


def test_open_timers_are_counted_through_partial_indexes(conn: Conn) -> None:
    """However many closed timers wait for retention, a scrape reads only the indexes."""
    migrate(conn, [PARCEL, NIGHTLY])
    for r in (PARCEL, NIGHTLY):
        with conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")
            plan = conn.execute(sql.SQL("EXPLAIN ") + open_timers_statement(r)).fetchall()
        text = "\n".join(row[0] for row in plan)
        assert "Seq Scan" not in text, text
        used = {f"sw_{r.name}_first", f"sw_{r.name}_again", f"{r.name}_timers_unscheduled"}
        assert all(f" {index} " in text for index in used), text


def test_events_counted_per_type_source_and_outcome(dsn: str, conn: Conn) -> None:
    migrate(conn, [PARCEL])
    with Database(dsn, size=1, timeout=5) as db:
        metrics = Metrics(db, FixedClock(NOW), lambda: [], lambda: [PARCEL])
        got = Ingested(3, 1, Counter({("shipped", "accepted"): 2, ("delivered", "accepted"): 1}))
        got.by_type[("shipped", "duplicate")] += 1
        metrics.events_ingested("amqp", got)
        metrics.events_rejected("amqp", ["shipped", "nope", None, 7, {"x": 1}])
        metrics.events_rejected("http")

        def count(kind: str, source: str, outcome: str) -> float | None:
            labels = {"type": kind, "source": source, "outcome": outcome}
            return metrics.registry.get_sample_value("slawatch_events_total", labels)

        assert count("shipped", "amqp", "accepted") == 2
        assert count("delivered", "amqp", "accepted") == 1
        assert count("shipped", "amqp", "duplicate") == 1
        assert count("shipped", "amqp", "rejected") == 1
        # Types no rule uses are one series, whatever producers send.
        assert count("-", "amqp", "rejected") == 4
        assert count("-", "http", "rejected") == 1
        text = generate_latest(metrics.registry).decode()
        assert "nope" not in text
