"""Metrics (slawatch/operate/metrics.py) and Runner.health against a real database and receiver."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry, generate_latest

from slawatch.clock import Clock
from slawatch.config.notifiers import WebhookConfig
from slawatch.config.rules import Rule
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_notifier, replay
from slawatch.engine.claim import drain
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare_all
from slawatch.operate.lifecycle import ack, add_silence
from slawatch.operate.metrics import SCRAPE_BUDGET, Metrics
from slawatch.runtime.scheduler import Runner
from tests.integration.helpers import Conn
from tests.integration.test_outage import logged, wait_for
from tests.receivers import Reply, WebhookReceiver
from tests.tcpproxy import TcpProxy

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)

RULE = """\
table: public.orders
key: id
deadline: paid_at
after: 1h
every: 1s
open_when: "status = 'paid'"
renotify: {every: 1h, max: 3}
severity: warning
escalate: [{from: 2, severity: critical}]
notify: [hook]
"""


class MovableClock(Clock):
    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at


def late_rule() -> Rule:
    return Rule.model_validate(yaml.safe_load(RULE) | {"name": "late"})


def hook(receiver: WebhookReceiver) -> WebhookConfig:
    return WebhookConfig.model_validate(
        {
            "name": "hook",
            "type": "webhook",
            "url": receiver.url,
            "timeout": "2s",
            "retry": {"first": "1s", "max": "1s", "attempts": 5},
        }
    )


def orders(conn: Conn, rows: int, paid_at: datetime) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS orders"
        " (id bigint PRIMARY KEY, status text, paid_at timestamptz)"
    )
    migrate(conn, [late_rule()])
    conn.execute(
        "INSERT INTO orders SELECT g, 'paid', %s FROM generate_series(1, %s) g", (paid_at, rows)
    )


def value(runner: Runner, name: str, **labels: str) -> float | None:
    return runner.registry.get_sample_value(name, labels)


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_counters_histograms_and_gauges_after_scans_and_deliveries(
    conn: Conn, dsn: str, receiver: WebhookReceiver, outbox: Outbox
) -> None:
    """In either shape of the outbox: the metrics count one delivery per alert."""
    orders(conn, 3, T0 - timedelta(days=1))
    clock = MovableClock(T0)
    runner = Runner(dsn, [late_rule()], [hook(receiver)], clock=clock, outbox=outbox)
    try:
        notifier = runner.notifiers["hook"]
        # Every outcome is there from the start, at 0.
        assert value(runner, "slawatch_deliveries_total", notifier="hook", outcome="dead") == 0

        assert runner.scan("late") is not None  # 3 alerts, #1: warning
        clock.at = T0 + HOUR + timedelta(seconds=1)
        assert runner.scan("late") is not None  # 3 more, #2: critical (escalated)
        claimed = "slawatch_alerts_claimed_total"
        assert value(runner, claimed, rule="late", severity="warning") == 3
        assert value(runner, claimed, rule="late", severity="critical") == 3
        assert value(runner, "slawatch_scan_duration_seconds_count", rule="late") == 2
        assert value(runner, "slawatch_outbox_up") == 1
        assert value(runner, "slawatch_deliveries_pending", notifier="hook") == 6
        age = value(runner, "slawatch_oldest_pending_delivery_age_seconds", notifier="hook")
        assert age == 3601  # the first alerts fired at T0

        receiver.replies = [Reply(status=500)]
        deliver_notifier(runner.db, notifier, clock, metrics=runner.metrics)
        # The failed request ends the pass: one batch of all 6, or the first scan's row
        # of 3 (each scan wrote a row of its own).
        retried = 6 if outbox == "alerts" else 3
        assert (
            value(runner, "slawatch_deliveries_total", notifier="hook", outcome="retry") == retried
        )
        assert value(runner, "slawatch_deliveries_total", notifier="hook", outcome="sent") == 0

        clock.at = T0 + 2 * HOUR
        deliver_notifier(runner.db, notifier, clock, metrics=runner.metrics)
        assert value(runner, "slawatch_deliveries_total", notifier="hook", outcome="sent") == 6
        latency = "slawatch_delivery_latency_seconds"
        assert value(runner, f"{latency}_count", notifier="hook") == 6
        # From each alert's fired_at (T0, and T0 + 1h 1s) to the moment it was accepted.
        assert value(runner, f"{latency}_sum", notifier="hook") == 3 * 7200 + 3 * 3599
        assert value(runner, f"{latency}_bucket", notifier="hook", le="3600.0") == 3
        assert value(runner, "slawatch_deliveries_pending", notifier="hook") == 0
        assert value(runner, "slawatch_oldest_pending_delivery_age_seconds", notifier="hook") == 0

        clock.at = T0 + 3 * HOUR
        assert runner.scan("late") is not None  # #3, critical
        receiver.replies = [Reply(status=410)]  # permanent: dead at once
        deliver_notifier(runner.db, notifier, clock, metrics=runner.metrics)
        assert value(runner, "slawatch_deliveries_total", notifier="hook", outcome="dead") == 3
        assert value(runner, "slawatch_deliveries_dead", notifier="hook") == 3
        assert value(runner, claimed, rule="late", severity="critical") == 6
        assert value(runner, "slawatch_database_outage") == 0
        assert value(runner, "slawatch_database_outages_total") == 0
        text = generate_latest(runner.registry).decode()
        assert 'slawatch_deliveries_dead{notifier="hook"} 3.0' in text

        # A silenced delivery is settled unsent: its own outcome.
        conn.execute("INSERT INTO orders VALUES (4, 'paid', %s)", (T0 - timedelta(days=1),))
        add_silence(
            runner.db,
            rule="late",
            key="4",
            matchers=None,
            until=T0 + 5 * HOUR,
            comment="known",
            author="test",
            now=clock.at,
            rules=runner.rules,
        )
        assert runner.scan("late") is not None
        deliver_notifier(runner.db, notifier, clock, metrics=runner.metrics)
        assert value(runner, "slawatch_deliveries_total", notifier="hook", outcome="silenced") == 1
        assert value(runner, "slawatch_deliveries_total", notifier="hook", outcome="sent") == 6
    finally:
        runner.close()


def test_serve_counts_and_reports_its_health(
    conn: Conn, dsn: str, receiver: WebhookReceiver
) -> None:
    """The wiring: the scan job and the delivery workers count into the runner's registry."""
    orders(conn, 2, datetime.now(UTC) - timedelta(days=1))
    runner = Runner(dsn, [late_rule()], [hook(receiver)], poll=0.2)
    assert runner.health()["ok"] is False  # not serving yet
    serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
    serving.start()
    try:
        wait_for(
            lambda: (
                value(runner, "slawatch_deliveries_total", notifier="hook", outcome="sent") == 2
            ),
            "2 deliveries counted",
        )
        assert value(runner, "slawatch_alerts_claimed_total", rule="late", severity="warning") == 2
        assert value(runner, "slawatch_delivery_latency_seconds_count", notifier="hook") == 2
        wait_for(lambda: runner.health()["listener"] is True, "the listener")
        assert runner.health() == {
            "ok": True,  # last in order (see Runner.health)
            "scheduler": True,
            "workers": {"hook": True},
            "listener": True,
            "definition": {"late": True},  # the recorded one (docs/how-to/rolling-deploys.md)
        }
        assert value(runner, "slawatch_rule_generation_mismatch", rule="late") == 0
        serving_scheduler = runner._scheduler
        runner._scheduler = BackgroundScheduler()  # never started: as if it had died
        assert (runner.health()["ok"], runner.health()["scheduler"]) == (False, False)
        runner._scheduler = serving_scheduler
    finally:
        runner.stop()
        serving.join(30)
        runner.close()
    health = runner.health()
    assert (health["ok"], health["scheduler"], health["workers"]) == (False, False, {"hook": False})


def scrape(registry: CollectorRegistry) -> str:
    """The exposition text, in a thread: a scrape that hangs fails the test, not CI."""
    text: list[str] = []
    started = time.monotonic()
    thread = threading.Thread(target=lambda: text.append(generate_latest(registry).decode()))
    thread.daemon = True
    thread.start()
    thread.join(SCRAPE_BUDGET + 2)
    assert text, "the scrape hangs"
    assert time.monotonic() - started < SCRAPE_BUDGET + 1
    return text[0]


def test_a_scrape_while_the_database_is_away_answers_at_once(dsn: str) -> None:
    """Through a proxy of our own: first it forwards nothing (a partitioned network:
    no error, no answer), then its port closes (the server is gone)."""
    from psycopg import connect

    with connect(dsn, autocommit=True) as c:
        migrate(c, [])
    proxy, via = TcpProxy.for_dsn(dsn)
    # A short timeout: the outage record's grace after a success is one timeout.
    db = Database(via, size=2, timeout=0.5)
    try:
        registry = Metrics(db, Clock(), lambda: ["hook"]).registry
        assert registry.get_sample_value("slawatch_outbox_up") == 1
        assert registry.get_sample_value("slawatch_deliveries_pending", {"notifier": "hook"}) == 0

        proxy.blackhole()
        for _ in range(2):  # the second finds the first read still hanging
            text = scrape(registry)
            assert "slawatch_outbox_up 0.0" in text
            # No stale or made-up outbox numbers: none at all.
            assert not any(ln.startswith("slawatch_deliveries_pending{") for ln in text.split("\n"))

        proxy.close()
        # The hung read ends with its connection; the next scrapes ask the pool again.
        wait_for(
            lambda: not [t for t in threading.enumerate() if t.name == "metrics-read"],
            "the hung read to end",
            timeout=10,
        )
        assert "slawatch_outbox_up 0.0" in scrape(registry)
        # Not getting a connection within a scrape's short wait is no outage (the pool
        # may only be busy): the workers, which wait the full timeout, say when it is.
        assert "slawatch_database_outage 0.0" in scrape(registry)
    finally:
        proxy.close()
        db.close()


def test_a_drain_counts_closed_episodes_and_alerts_per_severity(
    conn: Conn, dsn: str, track: str
) -> None:
    """What the scan's log line and the metrics read, with either way to track."""
    conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at timestamptz)")
    # track: table closes ended episodes when their re-notification is due, and in the
    # sweep: a day apart here, so each is seen on its own.
    sweep = {"sweep": timedelta(days=1)} if track == "table" else {}
    late = late_rule().model_copy(update={"track": track, **sweep})
    migrate(conn, [late])
    conn.execute(
        "INSERT INTO orders SELECT g, 'paid', %s FROM generate_series(1, 4) g",
        (T0 - timedelta(days=1),),
    )
    with Database(dsn, size=2) as db:
        with db.connection("test") as c:
            plan = prepare_all(c, [late])["late"]
        first = drain(db, plan, MovableClock(T0))
        assert (first.claimed, first.closed, first.severities) == (4, 0, {"warning": 4})
        conn.execute("UPDATE orders SET status = 'shipped' WHERE id <= 3")
        # An hour on: order 4 is re-notified (#2, escalated); 1-3 ended and are closed.
        again = drain(db, plan, MovableClock(T0 + HOUR + timedelta(minutes=10)))
        assert (again.claimed, again.closed, again.severities) == (1, 3, {"critical": 1})
        conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 4")
        swept = drain(db, plan, MovableClock(T0 + timedelta(days=1, minutes=1)))
        assert (swept.claimed, swept.closed, swept.severities) == (0, 1, {})


def test_a_rule_whose_claims_fail_is_counted_and_logged_once(
    conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim the database refuses (here its deadline column renamed away; once, an
    action's ``on`` moved mid-episode: test_action_once.py) fails on every scan, the
    database reachable: one ERROR line when it starts, slawatch_scan_failures_total
    counts each failed scan."""
    caplog.set_level(logging.INFO)
    orders(conn, 2, T0 - timedelta(days=1))
    clock = BreakableClock(T0)
    runner = Runner(dsn, [late_rule()], [], clock=clock, backoff_cap=0.01)
    failures = "slawatch_scan_failures_total"
    try:
        assert value(runner, failures, rule="late") == 0  # from the start, not the 1st scan
        assert runner.scan("late") is not None
        assert value(runner, failures, rule="late") == 0
        conn.execute("ALTER TABLE orders RENAME COLUMN paid_at TO paid")
        clock.at = T0 + HOUR + timedelta(seconds=1)  # re-notifications due: a claim runs
        wait_for(
            lambda: runner.scan("late") is None and value(runner, failures, rule="late") == 3,
            "three failed scans",
        )
        conn.execute("ALTER TABLE orders RENAME COLUMN paid TO paid_at")
        wait_for(lambda: runner.scan("late") is not None, "a scan that works again")
        assert value(runner, failures, rule="late") == 3
        assert value(runner, "slawatch_database_outages_total") == 0
        clock.broken = True  # a bug: counted too
        wait_for(lambda: runner.scan("late") is None, "a scan that raises")
        assert value(runner, failures, rule="late") == 4
    finally:
        runner.close()
    assert logged(caplog, "rule late: scans failing", logging.ERROR) == 2
    assert logged(caplog, "unexpected RuntimeError: clock broke", logging.ERROR) == 1
    assert logged(caplog, "rule late: scans working again") == 1


class BreakableClock(MovableClock):
    broken = False

    def now(self) -> datetime:
        if self.broken:
            raise RuntimeError("clock broke")
        return super().now()


def test_acknowledged_and_orphaned_deliveries_have_outcomes_of_their_own(
    conn: Conn, dsn: str, receiver: WebhookReceiver
) -> None:
    """Pinned to today's outbox: it replays deliveries and orphans one it writes into
    slawatch.delivery, one by one."""
    orders(conn, 2, T0 - timedelta(days=1))
    clock = MovableClock(T0)
    runner = Runner(dsn, [late_rule()], [hook(receiver)], clock=clock, outbox="alerts")
    try:
        notifier = runner.notifiers["hook"]
        for outcome in ("acknowledged", "orphaned"):
            assert value(runner, "slawatch_deliveries_total", notifier="hook", outcome=outcome) == 0
        assert runner.scan("late") is not None
        receiver.replies = [Reply(status=410)]  # both dead at once
        deliver_notifier(runner.db, notifier, clock, metrics=runner.metrics)
        ack(runner.db, "late:1:e1:n1", by="test", comment="", now=clock.at)
        # Replayed, order 1's delivery is settled by the claim instead of sent.
        with runner.db.connection("replay") as c:
            assert replay(c, clock.at, None, None) == 2
        deliver_notifier(runner.db, notifier, clock, metrics=runner.metrics)
        assert receiver.alert_ids[-1:] == ["late:2:e1:n1"]
        outcome = "acknowledged"
        assert value(runner, "slawatch_deliveries_total", notifier="hook", outcome=outcome) == 1
        # A delivery to a notifier no longer configured.
        conn.execute(
            "INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)"
            " SELECT min(id), 'gone', now() FROM slawatch.alert"
        )
        assert runner.settle_orphans() == {"gone": 1}
        assert value(runner, "slawatch_deliveries_total", notifier="gone", outcome="orphaned") == 1
    finally:
        runner.close()
