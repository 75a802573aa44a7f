"""Storms: more than a notifier's ``storm.threshold`` notifications of one rule due at
once go to it as one summary, while every alert is recorded (slawatch/delivery/storm.py).

Real PostgreSQL, real HTTP receivers (and the local Slack / PagerDuty / Alertmanager
services that check bodies as those services do)."""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from slawatch.config.notifiers import BY_TYPE, ConsoleConfig, WebhookConfig, load_notifiers
from slawatch.config.rules import Rule
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import (
    Dispatcher,
    claim_deliveries,
    deliver_due,
    deliver_notifier,
    replay,
)
from slawatch.delivery.notifiers import build
from slawatch.delivery.notifiers.base import BaseNotifier
from slawatch.delivery.notifiers.console import ConsoleNotifier
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.delivery.storm import summarize
from slawatch.engine.claim import claim_batch, plan_claim
from slawatch.engine.migrate import migrate, schema_current
from slawatch.engine.queries import queries
from slawatch.errors import ConfigError
from slawatch.operate.lifecycle import add_silence
from slawatch.operate.metrics import Metrics
from tests.integration.helpers import (
    Conn,
    FixedClock,
    claim_all,
    plan_nodes,
    shop,
    unversioned,
)
from tests.integration.test_admin import Start, start
from tests.integration.test_cli import slawatch
from tests.integration.test_email import notifier as mail_notifier
from tests.integration.test_email import smtp
from tests.receivers import Reply, WebhookReceiver
from tests.services import (
    AlertmanagerService,
    OpsgenieService,
    PagerDutyService,
    SlackService,
    TeamsService,
)
from tests.waiting import lock_waits, wait_until

__all__ = ["smtp", "start"]

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CLAIMED = T0 + timedelta(days=3)  # every order paid at T0 is overdue here
WAIT = timedelta(seconds=10)  # storm.wait's default
SENT_AT = CLAIMED + WAIT
ADMIN = "https://slawatch.example.com"
# This module's subject is the storm fold of today's deliveries, one by one (summarized,
# summary_id): pinned to "alerts". The rows' storms: test_outbox_rows_storm.py.
OUTBOX: Outbox = "alerts"


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    with Database(dsn, size=4, timeout=10) as d:
        yield d


@pytest.fixture
def hook_a() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as r:
        yield r


@pytest.fixture
def hook_b() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as r:
        yield r


def hook(name: str, receiver: WebhookReceiver, storm: Any = 100, **kw: Any) -> WebhookNotifier:
    config = {"name": name, "type": "webhook", "url": receiver.url, "storm": storm} | kw
    return WebhookNotifier(WebhookConfig.model_validate(config))


def orders(conn: Conn, count: int, notify: list[str], batch: int = 10_000, **kw: Any) -> Rule:
    """``count`` orders (ids 1..count) paid at T0, all overdue at CLAIMED; the rule."""
    rule = shop(conn)["order_unshipped"].model_copy(update={"notify": notify, "batch": batch} | kw)
    conn.execute(
        "INSERT INTO orders SELECT g, 7 + g %% 2, 990, 'paid', %s"
        " FROM generate_series(1, %s::int) g",
        (T0, count),
    )
    return rule


def claim(conn: Conn, rule: Rule, at: datetime = CLAIMED) -> int:
    return claim_all(conn, plan_claim(rule, "timestamp with time zone", outbox_in=OUTBOX), at)


def statuses(conn: Conn, notifier: str | None = None) -> dict[str, int]:
    return dict(
        conn.execute(
            "SELECT status, count(*) FROM slawatch.delivery"
            " WHERE %(n)s::text IS NULL OR notifier = %(n)s GROUP BY 1",
            {"n": notifier},
        )
    )


def summaries(receiver: WebhookReceiver) -> list[dict[str, Any]]:
    return [a for r in receiver.requests for a in r.alerts if a["status"] == "summary"]


def singles(receiver: WebhookReceiver) -> list[dict[str, Any]]:
    return [a for r in receiver.requests for a in r.alerts if a["status"] != "summary"]


def test_a_storm_sends_one_summary_per_notifier_and_records_every_alert(
    conn: Conn, db: Database, hook_a: WebhookReceiver, hook_b: WebhookReceiver
) -> None:
    """The issue's done-when: a storm of 20,000 due rows sends one summary per notifier
    and records 20,000 alerts. The scan writes it in 4 claim batches; about 1 s here."""
    count = 20_000
    rule = orders(conn, count, ["hook-a", "hook-b"], batch=count // 4)
    a, b = hook("hook-a", hook_a), hook("hook-b", hook_b, {"threshold": 1000, "listed": 5})
    notifiers = {"hook-a": a, "hook-b": b}
    started = time.monotonic()
    assert claim(conn, rule) == count
    claimed = time.monotonic()
    first = deliver_due(db, notifiers, FixedClock(CLAIMED), admin_url=ADMIN)
    assert (first.sent, first.summarized, first.summaries) == (0, 2 * count, 2)
    assert hook_a.requests == hook_b.requests == []  # the summaries wait for the storm's rest
    done = deliver_due(db, notifiers, FixedClock(SENT_AT), {"order_unshipped": "late"}, ADMIN)
    elapsed = time.monotonic() - claimed
    assert (done.sent, done.summarized) == (2, 0)
    assert [len(r.alerts) for r in hook_a.requests + hook_b.requests] == [1, 1]
    (sa,), (sb,) = summaries(hook_a), summaries(hook_b)
    assert singles(hook_a) == singles(hook_b) == []
    (first_a,) = conn.execute("SELECT min(id) FROM slawatch.alert WHERE kind = 'firing'")
    assert sa["id"] == f"order_unshipped:storm:hook-a:{first_a[0]}"
    assert sb["id"] == f"order_unshipped:storm:hook-b:{first_a[0]}"
    assert (sa["count"], sa["listed"], sb["count"], sb["listed"]) == (count, 20, count, 5)
    assert [f["id"] for f in sa["first"]] == [f"order_unshipped:{k}:e1:n1" for k in range(1, 21)]
    assert sa["first"][0]["row"]["user_id"] == 8 and sa["first"][0]["description"] == "late"
    assert sa["description"] == (
        f"{count:,} rows overdue for order_unshipped (late), first 20 listed, see "
        f"{ADMIN}/v1/alerts?rule=order_unshipped&status=summarized&since=2026-03-04T12%3A00%3A00Z"
    )
    assert (sa["severity"], sa["n"], sa["since"]) == ("warning", 0, "2026-03-04T12:00:00Z")
    # Every alert is recorded; each notifier's deliveries point at its own summary.
    assert conn.execute(
        "SELECT kind, count(*) FROM slawatch.alert GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("firing", count), ("summary", 2)]
    assert statuses(conn) == {"summarized": 2 * count, "sent": 2}
    pointers = conn.execute(
        "SELECT d.notifier, s.key, count(*) FROM slawatch.delivery d"
        " JOIN slawatch.alert s ON s.id = d.summary_id GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    assert pointers == [
        ("hook-a", f"storm:hook-a:{first_a[0]}", count),
        ("hook-b", f"storm:hook-b:{first_a[0]}", count),
    ]
    print(f"\n{count:,} rows: claimed in {claimed - started:.2f} s, delivered in {elapsed:.2f} s")


def test_at_the_threshold_alerts_go_one_by_one_and_one_more_is_a_storm(
    conn: Conn, db: Database, hook_a: WebhookReceiver
) -> None:
    """``threshold`` is the most notifications of a rule sent one by one."""
    rule = orders(conn, 100, ["hook-a"])
    a = hook("hook-a", hook_a, {"threshold": 100, "wait": "0s"})
    assert claim(conn, rule) == 100
    assert deliver_notifier(db, a, FixedClock(CLAIMED)).sent == 100
    assert summaries(hook_a) == [] and len(singles(hook_a)) == 100
    # 101 more orders (the first 100 are not due again for 6 hours)
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(101, 201) g", (T0,)
    )
    assert claim(conn, rule) == 101
    result = deliver_notifier(db, a, FixedClock(CLAIMED))
    assert (result.sent, result.summarized, result.summaries) == (1, 101, 1)
    (summary,) = summaries(hook_a)
    assert summary["count"] == 101 and len(singles(hook_a)) == 100


def test_a_storm_over_several_claim_batches_is_one_summary(
    conn: Conn, db: Database, hook_a: WebhookReceiver
) -> None:
    """Delivery passes between the claim batches of one drain: the first batch makes the
    summary, the later ones (however small) fold into it until it is first sent."""
    rule = orders(conn, 450, ["hook-a"], batch=200)
    plan = plan_claim(rule, "timestamp with time zone", outbox_in=OUTBOX)
    a = hook("hook-a", hook_a)
    assert claim_batch(conn, plan, CLAIMED) == 200
    assert deliver_notifier(db, a, FixedClock(CLAIMED)).summaries == 1
    assert claim_batch(conn, plan, CLAIMED) == 200
    grown = deliver_notifier(db, a, FixedClock(CLAIMED + timedelta(seconds=2)))
    assert (grown.summaries, grown.summarized) == (0, 200)
    assert claim_batch(conn, plan, CLAIMED) == 50  # below the threshold: folded all the same
    assert deliver_notifier(db, a, FixedClock(CLAIMED + timedelta(seconds=4))).summarized == 50
    assert deliver_notifier(db, a, FixedClock(SENT_AT)).sent == 1
    (summary,) = summaries(hook_a)
    assert summary["count"] == 450 and singles(hook_a) == []
    row = conn.execute("SELECT row_data FROM slawatch.alert WHERE kind = 'summary'").fetchone()
    assert row == ({"notifier": "hook-a", "count": 450},)


def test_re_notifications_storm_again_and_a_sent_summary_is_not_grown(
    conn: Conn, db: Database, hook_a: WebhookReceiver
) -> None:
    rule = orders(conn, 150, ["hook-a"])
    a = hook("hook-a", hook_a)
    assert claim(conn, rule) == 150
    deliver_notifier(db, a, FixedClock(CLAIMED))
    deliver_notifier(db, a, FixedClock(SENT_AT))
    # Five more orders fall due after the summary went: one by one.
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(151, 155) g",
        (T0 + timedelta(minutes=1),),
    )
    later = SENT_AT + timedelta(minutes=1)
    assert claim(conn, rule, later) == 5
    assert deliver_notifier(db, a, FixedClock(later)).sent == 5
    # Six hours on, the 150 re-notifications are a storm of their own.
    again = CLAIMED + timedelta(hours=6, seconds=1)
    assert claim(conn, rule, again) == 150
    deliver_notifier(db, a, FixedClock(again))
    deliver_notifier(db, a, FixedClock(again + WAIT))
    assert [s["count"] for s in summaries(hook_a)] == [150, 150]
    assert len({s["id"] for s in summaries(hook_a)}) == 2
    assert [f["n"] for f in summaries(hook_a)[1]["first"]] == [2] * 20
    assert len(singles(hook_a)) == 5


class Inbox(BaseNotifier):
    """Keeps what it is sent; ``during`` runs inside the first send of a summary."""

    def __init__(self, storm: Any, during: Any = None) -> None:
        super().__init__(ConsoleConfig(name="hook", type="console", storm=storm))
        self.got: list[dict[str, Any]] = []
        self.during = during

    def send(self, alerts: list[dict[str, Any]]) -> None:
        if self.during is not None and any(a["status"] == "summary" for a in alerts):
            during, self.during = self.during, None
            during()
        self.got.extend(alerts)


def test_what_comes_due_while_a_summary_is_in_flight_is_not_folded_into_it(
    conn: Conn, db: Database
) -> None:
    """The summary is leased and being sent; five more alerts come due and another
    worker claims: they go one by one (folded, they would be in no message)."""
    rule = orders(conn, 150, ["hook"])
    other = Inbox({"threshold": 100, "wait": "0s"})

    def more() -> None:
        conn.execute(
            "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(151, 155) g",
            (T0,),
        )
        assert claim(conn, rule) == 5
        assert deliver_notifier(db, other, FixedClock(CLAIMED)).sent == 5

    first = Inbox({"threshold": 100, "wait": "0s"}, during=more)
    assert claim(conn, rule) == 150
    assert deliver_notifier(db, first, FixedClock(CLAIMED)).sent == 1
    ((summary,), singles_) = (first.got, other.got)
    assert summary["count"] == 150 and len(singles_) == 5
    assert statuses(conn) == {"summarized": 150, "sent": 6}


def test_a_receiver_failing_the_summary_retries_it_then_dead_letters_it(
    conn: Conn, db: Database, hook_a: WebhookReceiver
) -> None:
    rule = orders(conn, 300, ["hook-a"])
    retry = {"first": "1s", "max": "1s", "attempts": 3}
    a = hook("hook-a", hook_a, retry=retry)
    hook_a.default = Reply(status=503)
    assert claim(conn, rule) == 300
    deliver_notifier(db, a, FixedClock(CLAIMED))
    at = SENT_AT
    outcomes = []
    for step in range(3):
        result = deliver_notifier(db, a, FixedClock(at))
        outcomes.append((result.retried, result.dead))
        if step == 0:  # more of the storm after the first attempt: not folded into it
            conn.execute(
                "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(301, 310) g",
                (T0,),
            )
            assert claim(conn, rule, at) == 10
        at += timedelta(seconds=2)
    # The summary (attempts 1, 2, 3: dead) and, from the second pass, the 10 later ones
    assert outcomes == [(1, 0), (11, 0), (10, 1)]
    attempts = [a for r in hook_a.requests for a in r.alerts if a["status"] == "summary"]
    assert len(attempts) == 3
    assert {json.dumps(x, sort_keys=True) for x in attempts} == {
        json.dumps(attempts[0], sort_keys=True)
    }  # each attempt carries the same summary
    assert attempts[0]["count"] == 300
    (dead,) = conn.execute(
        "SELECT d.status, d.attempts, d.last_error FROM slawatch.delivery d"
        " JOIN slawatch.alert a ON a.id = d.alert_id WHERE a.kind = 'summary'"
    ).fetchall()
    assert dead[:2] == ("dead", 3) and dead[2].startswith("HTTP 503")
    assert statuses(conn)["summarized"] == 300
    # Replayed, it is sent (once), still standing for the same 300: what came due since
    # is not folded into a summary that was tried already.
    assert replay(conn, at, None, "hook-a") == 1
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(311, 315) g", (T0,)
    )
    assert claim(conn, rule, at) == 5
    hook_a.default = Reply()
    deliver_notifier(db, a, FixedClock(at + timedelta(minutes=1)))
    assert summaries(hook_a)[-1]["count"] == 300
    assert statuses(conn) == {"summarized": 300, "sent": 16}
    assert statuses(conn).get("dead") is None


def test_concurrent_workers_in_two_dispatchers_make_exactly_one_summary(
    conn: Conn, dsn: str, hook_a: WebhookReceiver
) -> None:
    """Concurrency 4 in each of two Dispatchers (two processes' worth of workers): the
    storm lock lets one claim fold the storm; no alert is sent one by one."""
    rule = orders(conn, 2_000, ["hook-a"])
    assert claim(conn, rule) == 2_000
    dispatchers = []
    for _ in range(2):
        db = Database(dsn, size=5, timeout=10)
        notifier = hook("hook-a", hook_a, {"threshold": 50, "wait": "0s"}, batch=100)
        dispatchers.append(
            (
                db,
                Dispatcher(
                    db, {"hook-a": notifier}, FixedClock(CLAIMED), concurrency={"hook-a": 4}
                ),
            )
        )
    try:
        for _, d in dispatchers:
            d.start()
        wait_until(lambda: not statuses(conn).get("pending"), "every delivery settled")
        # No sleep for "a second summary, if one were coming": stop() below returns when
        # every worker of both dispatchers has finished what it had in hand.
    finally:
        for db, d in dispatchers:
            d.stop()
            db.close()
    assert singles(hook_a) == []
    assert [s["count"] for s in summaries(hook_a)] == [2_000]
    assert statuses(conn) == {"summarized": 2_000, "sent": 1}


def test_a_summary_counts_exactly_what_it_replaces_while_another_claim_runs(
    conn: Conn, db: Database, dsn: str, hook_a: WebhookReceiver
) -> None:
    """Another worker (any process) is in the middle of a claim: it holds the storm lock
    and has leased 100 of the storm's deliveries. A claim here waits for it, and then
    its summary stands for exactly the 1,900 it replaces (without the lock it would
    count the 100 the other sends one by one)."""
    rule = orders(conn, 2_000, ["hook-a"])
    assert claim(conn, rule) == 2_000
    lease = {"now": CLAIMED, "owner": uuid.uuid4(), "lease": timedelta(minutes=1)}
    lease |= {"limit": 100, "notifier": "hook-a", "sent": [], "sent_alerts": [], "sent_owner": None}
    with psycopg.connect(dsn) as other:
        other.execute(queries()["storm_lock"], {"notifier": "hook-a"})
        assert len(other.execute(queries()["claim_deliveries"], lease).fetchall()) == 100
        a = hook("hook-a", hook_a, {"threshold": 50, "wait": "0s"})
        done: list[Any] = []
        worker = threading.Thread(
            target=lambda: done.append(deliver_notifier(db, a, FixedClock(CLAIMED)))
        )
        worker.start()
        # The claim is blocked on the lock the other holds (not merely started): only
        # then is its count taken after the other's commit.
        wait_until(lambda: lock_waits(conn) == ["advisory"], "the claim to wait for the lock")
        other.commit()
    worker.join(30)
    assert (done[0].summarized, done[0].sent) == (1_900, 1)
    (summary,) = summaries(hook_a)
    assert summary["count"] == 1_900
    pointing = conn.execute("SELECT count(*) FROM slawatch.delivery WHERE summary_id IS NOT NULL")
    assert pointing.fetchone() == (1_900,)


def test_a_summary_takes_the_highest_severity_of_what_it_stands_for(
    conn: Conn, db: Database, hook_a: WebhookReceiver
) -> None:
    shop(conn)

    def due(severities: list[str]) -> None:
        for severity in severities:
            conn.execute(
                "WITH a AS (INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at,"
                " row_data) VALUES ('order_unshipped', gen_random_uuid()::text, 1, 1, %s, %s,"
                " '{}') RETURNING id) INSERT INTO slawatch.delivery (alert_id, notifier,"
                " next_attempt_at) SELECT id, 'hook-a', %s FROM a",
                (severity, CLAIMED, CLAIMED),
            )

    a = hook("hook-a", hook_a, {"threshold": 2})
    due(["info", "critical", "warning"])
    deliver_notifier(db, a, FixedClock(CLAIMED))
    due(["info"])  # folded: stays critical
    deliver_notifier(db, a, FixedClock(CLAIMED))
    deliver_notifier(db, a, FixedClock(SENT_AT))
    due(["info", "info", "info"])
    deliver_notifier(db, a, FixedClock(SENT_AT))
    due(["warning"])  # folded: raises it
    deliver_notifier(db, a, FixedClock(SENT_AT))
    deliver_notifier(db, a, FixedClock(SENT_AT + WAIT))
    got = [(x["severity"], x["count"]) for x in summaries(hook_a)]
    assert got == [("critical", 4), ("warning", 4)]


def test_silences_win_over_storms(conn: Conn, db: Database, hook_a: WebhookReceiver) -> None:
    """A silenced delivery is silenced, not counted: 150 due, 75 silenced, 75 sent one by
    one (threshold 100); then 300 due, 150 silenced, a summary of the other 150."""
    rule = orders(conn, 150, ["hook-a"])
    rules = {"order_unshipped": rule}
    add_silence(
        db, rule="order_unshipped", key=None, matchers={"user_id": 8}, until=CLAIMED + 99 * WAIT,
        comment="", author="t", now=CLAIMED, rules=rules,
    )  # fmt: skip
    a = hook("hook-a", hook_a, {"threshold": 100, "wait": "0s"})
    assert claim(conn, rule) == 150
    result = deliver_notifier(db, a, FixedClock(CLAIMED))
    assert (result.sent, result.silenced, result.summarized) == (75, 75, 0)
    conn.execute(
        "INSERT INTO orders SELECT g, 7 + g %% 2, 990, 'paid', %s FROM generate_series(151, 450) g",
        (T0,),
    )
    assert claim(conn, rule) == 300
    result = deliver_notifier(db, a, FixedClock(CLAIMED))
    assert (result.silenced, result.summarized, result.summaries) == (150, 150, 1)
    assert summaries(hook_a)[0]["count"] == 150
    assert all(f["row"]["user_id"] == 7 for f in summaries(hook_a)[0]["first"])


def test_acks_win_over_storms(conn: Conn, db: Database, hook_a: WebhookReceiver) -> None:
    """A notification of an acknowledged episode still pending (written by a claim that
    raced the ack, or replayed) is settled 'acknowledged', not counted into a storm."""
    rule = orders(conn, 150, ["hook-a"])
    assert claim(conn, rule) == 150
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " SELECT rule, key, episode, id, %s, 't' FROM slawatch.alert"
        " WHERE (row_data->>'user_id')::int = 8",
        (CLAIMED,),
    )
    a = hook("hook-a", hook_a, {"threshold": 100, "wait": "0s"})
    result = deliver_notifier(db, a, FixedClock(CLAIMED))
    assert (result.sent, result.acknowledged, result.summarized) == (75, 75, 0)
    assert summaries(hook_a) == []


def test_resolved_notices_go_one_by_one(conn: Conn, db: Database, hook_a: WebhookReceiver) -> None:
    rule = orders(conn, 120, ["hook-a"], resolve=True)
    a = hook("hook-a", hook_a, {"threshold": 100, "wait": "0s"})
    assert claim(conn, rule) == 120
    deliver_notifier(db, a, FixedClock(CLAIMED))
    conn.execute("UPDATE orders SET status = 'shipped'")
    claim(conn, rule, CLAIMED + timedelta(minutes=1))  # the claim finds the episodes ended
    result = deliver_notifier(db, a, FixedClock(CLAIMED + timedelta(minutes=1)))
    assert (result.sent, result.summarized) == (120, 0)
    assert [s["count"] for s in summaries(hook_a)] == [120]
    assert sum(1 for x in singles(hook_a) if x["status"] == "resolved") == 120


def test_summarized_deliveries_are_visible_in_the_cli_the_api_and_the_metrics(
    conn: Conn, db: Database, dsn: str, hook_a: WebhookReceiver, start: Start
) -> None:
    rule = orders(conn, 120, ["hook-a"])
    a = hook("hook-a", hook_a, {"threshold": 100, "wait": "0s"})
    metrics = Metrics(db, FixedClock(CLAIMED), lambda: ["hook-a"])
    metrics.notifier_added("hook-a")
    assert claim(conn, rule) == 120
    deliver_notifier(db, a, FixedClock(CLAIMED), metrics=metrics)
    sample = metrics.registry.get_sample_value
    assert (
        sample("slawatch_deliveries_total", {"notifier": "hook-a", "outcome": "summarized"}) == 120
    )
    assert sample("slawatch_storm_summaries_total", {"notifier": "hook-a"}) == 1
    assert sample("slawatch_deliveries_total", {"notifier": "hook-a", "outcome": "sent"}) == 1
    (summary_id,) = conn.execute("SELECT id FROM slawatch.alert WHERE kind = 'summary'").fetchone()
    # The CLI
    out = slawatch("alerts", "--status", "summarized", "--limit", "5", dsn=dsn)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 7 and lines[-1].startswith("more: add --cursor")
    assert all(line.endswith(f"hook-a:summarized(in {summary_id})") for line in lines[1:6])
    listed = slawatch("alerts", "--status", "summarized", "--limit", "1000", "--json", dsn=dsn)
    page = json.loads(listed.stdout)
    assert len(page["alerts"]) == 120
    assert {d["summary_id"] for x in page["alerts"] for d in x["deliveries"]} == {summary_id}
    # The admin API: the same filter, and the summary itself as an alert of kind summary.
    client: httpx.Client = start([rule])
    got = client.get("/v1/alerts", params={"status": "summarized", "limit": 1000}).json()
    assert len(got["alerts"]) == 120
    one = client.get(f"/v1/alerts/{summary_id}").json()
    assert (one["kind"], one["idempotency_id"]) == (
        "summary",
        f"order_unshipped:storm:hook-a:{page['alerts'][-1]['id']}",
    )
    assert [(d["notifier"], d["status"]) for d in one["deliveries"]] == [("hook-a", "sent")]
    refused = client.post(f"/v1/alerts/{summary_id}/ack", json={"by": "alice"})
    assert refused.status_code == 400
    assert refused.json()["error"].startswith(f"alert {summary_id} is a storm summary: ack the")
    bad = client.get("/v1/alerts", params={"status": "summarised"})
    assert bad.status_code == 422 or bad.status_code == 400


@pytest.mark.parametrize("service", ["slack", "pagerduty", "alertmanager", "teams", "opsgenie"])
def test_summaries_pass_the_services_checks(conn: Conn, db: Database, service: str) -> None:
    """A storm of 150 listing 100 to Slack, PagerDuty and Alertmanager, as those services
    check a message: one message, incident or alert for the storm."""
    rule = orders(conn, 150, [service])
    storm = {"threshold": 100, "listed": 100, "wait": "0s"}
    svc: Any = {
        "slack": SlackService,
        "pagerduty": PagerDutyService,
        "teams": TeamsService,
        "opsgenie": OpsgenieService,
    }.get(service, AlertmanagerService)()
    with svc:
        config: dict[str, Any] = {"name": service, "type": service, "storm": storm}
        if service == "slack":
            config["url"] = svc.url
        elif service == "pagerduty":
            config |= {"base_url": svc.base, "routing_key": "a" * 32}
        elif service == "opsgenie":
            # As many tags as a config may have: with slawatch's own, Opsgenie's 20.
            config |= {"url": svc.base, "api_key": svc.KEY, "tags": [f"t{i}" for i in range(16)]}
        else:
            config["url"] = svc.url
        notifier = build(_config(config))
        assert claim(conn, rule) == 150
        result = deliver_notifier(db, notifier, FixedClock(CLAIMED), {}, admin_url=ADMIN)
        assert (result.sent, result.summarized, result.dead) == (1, 150, 0)
        if service == "slack":
            (message,) = svc.messages
            assert message["blocks"][0]["text"]["text"].startswith("order_unshipped: 150 overdue")
            assert f"<{ADMIN}/v1/alerts?" in json.dumps(message)
        elif service == "pagerduty":
            (incident,) = svc.incidents
            (event,) = incident.alerts
            summary_id = event["payload"]["custom_details"]["id"]
            assert incident.dedup_key == summary_id  # an incident per storm
            assert summary_id.startswith("order_unshipped:storm:pagerduty:")
            assert event["payload"]["class"] == "storm" and event["links"][0]["href"].startswith(
                ADMIN
            )
            assert len(event["payload"]["custom_details"]["first"]) == 100
        elif service == "teams":
            (card,) = svc.cards()
            assert card["body"][0]["text"].startswith("order_unshipped: 150 overdue")
            assert f"]({ADMIN}/v1/alerts?" in json.dumps(card)
        elif service == "opsgenie":
            (alert,) = svc.alerts  # an Opsgenie alert per storm
            assert alert.alias.startswith("order_unshipped:storm:opsgenie:")
            assert "storm" in alert.create["tags"]
            assert alert.create["message"] == "order_unshipped: 150 overdue (storm)"
            assert len(alert.create["details"]["first"].split(", ")) == 100
        else:
            (alert,) = svc.active()
            assert alert.labels["storm"].startswith("storm:alertmanager:")
            assert "key" not in alert.labels and alert.annotations["count"] == "150"
        notifier.close()


def _config(data: dict[str, Any]) -> Any:

    return BY_TYPE[data["type"]].model_validate(data)


def test_an_outbox_from_before_storms_is_upgraded(conn: Conn) -> None:
    rules = list(shop(conn).values())
    conn.execute("""
        DROP INDEX slawatch.delivery_summary;
        ALTER TABLE slawatch.delivery DROP COLUMN summary_id;
        ALTER TABLE slawatch.delivery DROP CONSTRAINT delivery_status;
        ALTER TABLE slawatch.delivery ADD CONSTRAINT delivery_status
            CHECK (status IN ('pending', 'sent', 'dead', 'silenced'));
        ALTER TABLE slawatch.alert DROP CONSTRAINT alert_kind;
        ALTER TABLE slawatch.alert ADD CONSTRAINT alert_kind
            CHECK (kind IN ('firing', 'resolved'));
    """)
    unversioned(conn)  # as the release from before storms left it
    assert not schema_current(conn)
    migrate(conn, rules)
    assert schema_current(conn)
    conn.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, kind, severity, fired_at, row_data)"
        " VALUES ('r', 'storm:x:1', 0, 0, 'summary', 'info', now(), '{}')"
    )
    conn.execute(
        "INSERT INTO slawatch.delivery (alert_id, notifier, status, next_attempt_at, summary_id)"
        " VALUES (1, 'x', 'summarized', now(), 1)"
    )
    migrate(conn, rules)  # idempotent
    assert schema_current(conn)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("true", "storm: True is neither a threshold (storm: 100) nor a mapping"),
        ("'100'", "storm: '100' is neither a threshold"),
        ("1.5", "storm: 1.5 is neither"),
        ("0", "storm.threshold: 0: Input should be greater than or equal to 1"),
        ("1000001", "storm.threshold: 1000001: Input should be less than or equal to 1000000"),
        ("{listed: 5}", "storm.threshold: is required"),
        ("{threshold: 5, listed: 101}", "storm.listed: 101: Input should be less than or equal"),
        ("{threshold: 5, wait: 11m}", "storm.wait: '11m' is longer than 10m"),
        ("{threshold: 5, wait: -1s}", "storm.wait: '-1s' is not a duration"),
        ("{threshold: 5, every: 1}", "storm.every: unknown field"),
    ],
)
def test_bad_storm_config_is_one_line(tmp_path: Any, value: str, error: str) -> None:
    (tmp_path / "n.yaml").write_text(f"type: console\nstorm: {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_notifiers(tmp_path)
    assert f"n.yaml: {error}" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_storm_config(tmp_path: Any) -> None:
    def load(storm: str) -> Any:
        (tmp_path / "n.yaml").write_text(f"type: console\nstorm: {storm}\n")
        return load_notifiers(tmp_path)[0].storm

    assert load("100").threshold == 100
    full = load("{threshold: 5, listed: 0, wait: 1m}")
    assert (full.threshold, full.listed, full.wait) == (5, 0, timedelta(minutes=1))
    assert load("null") is None
    assert (load("{threshold: 7}").listed, load("7").wait) == (20, WAIT)


def test_email_and_console_show_the_storm(conn: Conn, db: Database, smtp: tuple[Any, int]) -> None:
    """A storm of 150 to an e-mail digest (a real SMTP server) and to the console."""
    rule = orders(conn, 150, ["ops-mail", "console"])
    storm = {"threshold": 100, "listed": 2, "wait": "0s"}
    inbox, port = smtp
    mail = mail_notifier(port, storm=storm)
    out = io.StringIO()
    console = ConsoleNotifier(ConsoleConfig(name="console", type="console", storm=storm), out)
    assert claim(conn, rule) == 150
    about = {"order_unshipped": "late"}
    assert (
        deliver_due(
            db, {"ops-mail": mail, "console": console}, FixedClock(CLAIMED), about, ADMIN
        ).sent
        == 2
    )
    ((_, _, message),) = inbox.envelopes
    assert message["Subject"] == "[slawatch] 150 overdue (storm): order_unshipped"
    text = message.get_body(("plain",)).get_content()
    assert text.startswith(
        "STORM: 150 rows overdue for order_unshipped (late), first 2 listed, see "
    )
    assert "  [warning] key 1 #1 due 2026-03-03T12:00:00Z" in text
    html = message.get_body(("html",)).get_content()
    assert f"<a href='{ADMIN}/v1/alerts?rule=order_unshipped&amp;status=summarized" in html
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(
        "[warning] order_unshipped storm: 150 rows overdue for order_unshipped"
    )
    assert [line.split()[3] for line in lines[1:]] == ["key=1", "key=2"]


def due_indexes(conn: Conn) -> set[str]:
    """delivery_due and its partitions' copies: every pending delivery, by notifier."""
    due = {
        str(name)
        for (name,) in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'slawatch'"
            " AND indexdef LIKE '%%ON slawatch.delivery%%' AND indexdef LIKE %s",
            ("%WHERE (status = 'pending'::text)",),
        )
    }
    assert due
    return due


def test_folding_a_fresh_storm_finds_each_delivery_by_its_own_entries(conn: Conn) -> None:
    """A storm fills the outbox faster than autoanalyze. On those statistics the fold's
    UPDATE, had its recheck of ``status = 'pending'`` let delivery_due qualify, ANDed
    that partial index (every pending delivery of the notifier) into each folded row's
    lookup: 20,000 folded took 12.5 s instead of 0.1 (the test above). The plan of the
    fold must not read delivery_due at all."""
    count = 5_000
    rule = orders(conn, count, ["hook-a"], batch=count)
    assert claim(conn, rule) == count
    params = {
        "notifier": "hook-a",
        "now": CLAIMED,
        "threshold": 100,
        "wait": WAIT,
        "severities": ["info", "warning", "critical"],
    }
    (plan,) = (
        conn.execute("EXPLAIN (FORMAT JSON) " + queries()["summarize_storms"], params).fetchone()
        or ()
    )
    (fold,) = [
        n
        for n in plan_nodes(plan[0]["Plan"])
        if n["Node Type"] == "ModifyTable"
        and n.get("Operation") == "Update"
        and n.get("Relation Name") == "delivery"
    ]
    used = {n["Index Name"] for n in plan_nodes(fold) if "Index Name" in n}
    assert used and not used & due_indexes(conn), used


def test_retrying_a_batch_on_a_fresh_outbox_finds_each_delivery_by_its_own_entries(
    conn: Conn,
) -> None:
    """mark_retry settles a batch that its owner's lease fences: on the statistics of a
    burst (before autoanalyze), a recheck of ``status = 'pending'`` would let
    delivery_due into each row's lookup, as it did in the storm's fold."""
    count = 5_000
    assert claim(conn, orders(conn, count, ["hook-a"], batch=count)) == count
    rows = conn.execute("SELECT id, alert_id FROM slawatch.delivery LIMIT 100").fetchall()
    params = {
        "ids": [r[0] for r in rows],
        "alerts": [r[1] for r in rows],
        "nexts": [CLAIMED] * len(rows),
        "error": "HTTP 503",
        "owner": uuid.uuid4(),
    }
    (plan,) = (
        conn.execute("EXPLAIN (FORMAT JSON) " + queries()["mark_retry"], params).fetchone() or ()
    )
    used = {n["Index Name"] for n in plan_nodes(plan[0]["Plan"]) if "Index Name" in n}
    assert not used & due_indexes(conn), used


def test_a_delivery_in_flight_is_never_folded_so_its_owner_settles_it(
    conn: Conn, db: Database
) -> None:
    """The fold takes first attempts only (attempts = 0) and a lease raises attempts: a
    delivery in flight is never folded, even once its lease ran out, so mark_sent and
    mark_retry, fenced by the lease owner alone, never turn a 'summarized' row (counted in
    a summary) into a sent or a retried one."""
    rule = orders(conn, 1, ["hook"])
    inbox = Inbox({"threshold": 100, "wait": "0s"})
    assert claim(conn, rule) == 1
    flying = claim_deliveries(db, inbox, CLAIMED)
    assert [r["attempts"] for r in flying.rows] == [1]
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(2, 151) g", (T0,)
    )
    assert claim(conn, rule) == 150
    late = CLAIMED + timedelta(hours=1)  # the lease long run out: due again
    assert inbox.storm is not None
    with conn.transaction():  # the fold alone (a claim would lease the due one again)
        (folded,) = summarize(conn, "hook", inbox.storm, late)
    assert (folded.folded, statuses(conn)) == (150, {"summarized": 150, "pending": 2})
    # The first owner's receiver took it after all: its settle still lands.
    conn.execute(
        queries()["mark_sent"],
        {
            "ids": [r["id"] for r in flying.rows],
            "alerts": [r["alert_id"] for r in flying.rows],
            "owner": flying.owner,
            "now": late,
        },
    )
    assert statuses(conn) == {"summarized": 150, "pending": 1, "sent": 1}
