"""Storms fold the outbox in rows (0022_outbox_rows_storm.sql; slawatch/delivery/storm.py):
a row's send due and never attempted counts by its alerts towards its rule's storm, is
settled 'summarized' pointing at the summary, and the summary lists its alerts. The rows
are written by hand, as the claim writes them; a real HTTP receiver takes the sends."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from slawatch.config.notifiers import WebhookConfig
from slawatch.db import Database
from slawatch.delivery.dispatcher import Dispatcher, deliver_notifier, lease_row_send
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.engine.claim import plan_claim
from slawatch.engine.queries import queries
from slawatch.operate.metrics import Metrics
from tests.integration.helpers import Conn, FixedClock, claim_all, shop
from tests.integration.test_outbox_rows_deliver import NOW, RULE, T0, insert_row, send_of
from tests.receivers import WebhookReceiver
from tests.waiting import wait_until

WAIT = timedelta(seconds=10)  # storm.wait's default


def hook(receiver: WebhookReceiver, storm: Any = 100, **fields: Any) -> WebhookNotifier:
    config = {"name": "hook", "type": "webhook", "url": receiver.url, "storm": storm}
    return WebhookNotifier(WebhookConfig.model_validate(config | fields))


def keys(start: int, count: int) -> list[str]:
    return [str(i) for i in range(start, start + count)]


def summaries(receiver: WebhookReceiver) -> list[dict[str, Any]]:
    return [a for r in receiver.requests for a in r.alerts if a["status"] == "summary"]


def singles(receiver: WebhookReceiver) -> list[dict[str, Any]]:
    return [a for r in receiver.requests for a in r.alerts if a["status"] != "summary"]


def summary_ids(conn: Conn) -> list[int]:
    return [i for (i,) in conn.execute("SELECT id FROM slawatch.alert WHERE kind = 'summary'")]


def folded_into(conn: Conn, row_id: int) -> tuple[str, int | None]:
    status, summary = conn.execute(
        "SELECT status, summary_id FROM slawatch.outbox_send WHERE row_id = %s", (row_id,)
    ).fetchone()  # type: ignore[misc]
    return status, summary


def alerts(conn: Conn, count: int, start: int = 1000) -> list[int]:
    """``count`` firing notifications in today's outbox (keys from ``start``), each with a
    delivery to hook due at NOW; their alert ids."""
    got = conn.execute(
        "WITH a AS (INSERT INTO slawatch.alert"
        " (rule, key, episode, n, severity, deadline, due_at, fired_at, row_data)"
        " SELECT %s, g::text, 1, 1, 'warning', %s, %s, %s, jsonb_build_object('id', g::text)"
        " FROM generate_series(%s::int, %s::int) g RETURNING id)"
        " INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)"
        " SELECT id, 'hook', %s FROM a RETURNING alert_id",
        (RULE, T0, T0, T0 + timedelta(days=2), start, start + count - 1, NOW),
    )
    return sorted(i for (i,) in got)


def test_rows_storm_into_one_summary_that_lists_their_alerts(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """Three rows of 100 due at once: one summary of 300, listing the first row's first
    alerts with today's payload; every send settled 'summarized' pointing at it; the
    readers show each alert summarized, and the metrics count them."""
    conn = schema
    rows = [insert_row(conn, keys(100 * k, 100)) for k in range(3)]
    notifier = hook(receiver, {"threshold": 100, "listed": 5})
    metrics = Metrics(db, FixedClock(NOW), lambda: ["hook"])
    metrics.notifier_added("hook")
    result = deliver_notifier(db, notifier, FixedClock(NOW), metrics=metrics)
    assert (result.sent, result.summarized, result.summaries) == (0, 300, 1)
    (summary_id,) = summary_ids(conn)
    assert [folded_into(conn, r) for r in rows] == [("summarized", summary_id)] * 3
    assert receiver.requests == []
    sample = metrics.registry.get_sample_value
    assert sample("slawatch_deliveries_total", {"notifier": "hook", "outcome": "summarized"}) == 300
    assert sample("slawatch_storm_summaries_total", {"notifier": "hook"}) == 1

    result = deliver_notifier(db, notifier, FixedClock(NOW + WAIT))
    assert result.sent == 1
    (summary,) = summaries(receiver)
    assert singles(receiver) == []
    first_id = -(rows[0] * 128 + 1)  # the first row's first alert (alert_by_id)
    assert summary["id"] == f"{RULE}:storm:hook:{first_id}"
    assert (summary["count"], summary["listed"]) == (300, 5)
    assert [a["id"] for a in summary["first"]] == [f"{RULE}:{k}:e1:n1" for k in keys(0, 5)]
    assert summary["first"][0]["fired_at"] == "2026-03-03T12:00:00Z"
    assert summary["first"][0]["due_at"] == "2026-03-02T12:00:00Z"
    assert summary["first"][0]["row"] == {"id": "0"}

    # Each alert reads as summarized, pointing at the summary (deliveries_of, list_alerts).
    element = -(rows[1] * 128 + 7)
    (of,) = conn.execute(queries()["deliveries_of"], {"ids": [element]}).fetchall()
    assert (of[2], of[3], of[8]) == ("hook", "summarized", summary_id)
    params = {"rule": RULE, "since": None, "before": None, "status": "summarized", "limit": 1000}
    assert len(conn.execute(queries()["list_alerts"], params).fetchall()) == 300


def test_at_the_threshold_a_row_goes_one_by_one_and_one_more_alert_is_a_storm(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """A send counts by its alerts, not as one: a row of 100 is at the threshold."""
    conn = schema
    whole = insert_row(conn, keys(0, 100))
    notifier = hook(receiver, {"threshold": 100, "wait": "0s"})
    assert deliver_notifier(db, notifier, FixedClock(NOW)).sent == 100
    assert send_of(conn, whole)["status"] == "sent" and summary_ids(conn) == []
    more = [insert_row(conn, keys(100, 100)), insert_row(conn, keys(200, 1))]
    result = deliver_notifier(db, notifier, FixedClock(NOW))
    assert (result.sent, result.summarized, result.summaries) == (1, 101, 1)
    assert [s["count"] for s in summaries(receiver)] == [101]
    assert {folded_into(conn, r)[0] for r in more} == {"summarized"}


def test_what_a_send_has_done_or_skipped_is_not_counted(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """A send counts its alerts from `done` on (a replayed send) that are not skipped, nor
    acked, nor silenced (they win): 110 alerts in two rows, of which 5 done, 3 acked and 2
    silenced, are 100, at the threshold; one more is a storm of 101, the acked and
    silenced recorded."""
    conn = schema
    row = insert_row(conn, keys(0, 100))
    insert_row(conn, keys(100, 10))
    conn.execute("UPDATE slawatch.outbox_send SET done = 5 WHERE row_id = %s", (row,))
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " SELECT %s, k, 1, 0, %s, 't' FROM unnest(%s::text[]) k",
        (RULE, NOW, ["10", "11", "12"]),
    )
    for key in ("20", "21"):
        conn.execute(
            "INSERT INTO slawatch.silence"
            " (rule, key, matchers, starts_at, ends_at, created_at, author)"
            " VALUES (%s, %s, '{}', %s, %s, %s, 't')",
            (RULE, key, NOW, NOW + timedelta(hours=1), NOW),
        )
    notifier = hook(receiver, {"threshold": 100, "wait": "0s"})
    probe = conn.execute(
        queries()["summarize_storms"],
        {
            "notifier": "hook",
            "now": NOW,
            "threshold": 100,
            "wait": timedelta(0),
            "severities": ["info", "warning", "critical"],
        },
    ).fetchall()
    assert probe == []  # 100: no storm
    extra = insert_row(conn, ["999"])
    result = deliver_notifier(db, notifier, FixedClock(NOW))
    assert (result.summarized, result.summaries, result.sent) == (101, 1, 1)
    (summary,) = summaries(receiver)
    assert summary["count"] == 101
    assert [a["key"] for a in summary["first"][:2]] == ["5", "6"]  # from `done` on
    send = send_of(conn, row)
    assert send["status"] == "summarized" and send["done"] == 5
    skipped = send["skipped"]
    assert len(skipped) == 100
    assert [i for i, s in enumerate(skipped) if s == "acknowledged"] == [10, 11, 12]
    assert [i for i, s in enumerate(skipped) if s == "silenced"] == [20, 21]
    assert folded_into(conn, extra)[0] == "summarized"


def test_deliveries_and_rows_of_a_rule_storm_together(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """60 notifications in today's outbox and a row of 50 (the setting switched) are one
    storm of 110; the summary is named after the least alert id and lists the deliveries'
    alerts first, then the row's."""
    conn = schema
    ids = alerts(conn, 60)
    row = insert_row(conn, keys(0, 50))
    notifier = hook(receiver, {"threshold": 100, "wait": "0s", "listed": 70})
    result = deliver_notifier(db, notifier, FixedClock(NOW))
    assert (result.summarized, result.summaries, result.sent) == (110, 1, 1)
    (summary,) = summaries(receiver)
    assert summary["id"] == f"{RULE}:storm:hook:{ids[0]}"
    assert summary["count"] == 110 and summary["listed"] == 70
    listed = [a["key"] for a in summary["first"]]
    assert listed == [str(k) for k in range(1000, 1060)] + keys(0, 10)
    assert folded_into(conn, row)[0] == "summarized"


def test_rows_due_after_the_summary_was_made_fold_into_it_at_their_lease(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """Until the summary is first sent, every row send of the rule that comes due folds
    into it, also where a worker leases rows without a claim of deliveries first: the
    lease folds under the storm lock as the claim does."""
    conn = schema
    insert_row(conn, keys(0, 100))
    insert_row(conn, keys(100, 50))
    notifier = hook(receiver)
    assert deliver_notifier(db, notifier, FixedClock(NOW)).summaries == 1
    (summary_id,) = summary_ids(conn)
    later = insert_row(conn, keys(200, 3), due=NOW + timedelta(seconds=2))
    leased = lease_row_send(db, notifier, NOW + timedelta(seconds=2))
    assert leased.row_id is None
    assert [(f.summary_id, f.made, f.folded) for f in leased.folded] == [(summary_id, False, 3)]
    assert folded_into(conn, later) == ("summarized", summary_id)
    assert deliver_notifier(db, notifier, FixedClock(NOW + WAIT)).sent == 1
    assert [s["count"] for s in summaries(receiver)] == [153] and singles(receiver) == []


def test_resolved_rows_and_sends_attempted_already_go_one_by_one(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """Only first attempts of firing rows count: a resolved row, and a send waiting to
    retry, are sent as they are (no summary for them)."""
    conn = schema
    resolved = insert_row(conn, keys(0, 100), kind="resolved", episodes=[2] * 100)
    retrying = insert_row(conn, keys(100, 100))
    conn.execute("UPDATE slawatch.outbox_send SET attempts = 1 WHERE row_id = %s", (retrying,))
    notifier = hook(receiver, {"threshold": 10, "wait": "0s"})
    result = deliver_notifier(db, notifier, FixedClock(NOW))
    assert (result.sent, result.summarized, result.summaries) == (200, 0, 0)
    assert {send_of(conn, r)["status"] for r in (resolved, retrying)} == {"sent"}


def test_a_storm_claimed_into_rows_by_the_claim_goes_as_one_summary_per_notifier(
    conn: Conn, db: Database, receiver: WebhookReceiver, track: str
) -> None:
    """End to end: the claim of 450 overdue orders with SLAWATCH_OUTBOX=rows (rows of
    100), a delivery pass that folds them, and a Dispatcher's workers: one summary of 450
    to the storm notifier, while a notifier without storm gets every alert."""
    rule = shop(conn, track)["order_unshipped"].model_copy(
        update={"notify": ["hook", "plain"], "batch": 300}
    )
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(1, 450) g", (T0,)
    )
    plan = plan_claim(rule, "timestamp with time zone", outbox_in="rows")
    with WebhookReceiver() as plain_receiver:
        stormy = hook(receiver)
        plain = WebhookNotifier(
            WebhookConfig.model_validate(
                {"name": "plain", "type": "webhook", "url": plain_receiver.url}
            )
        )
        assert claim_all(conn, plan, NOW) == 450
        assert conn.execute("SELECT count(*) FROM slawatch.alert").fetchone() == (0,)
        assert deliver_notifier(db, stormy, FixedClock(NOW)).summaries == 1
        clock = FixedClock(NOW + WAIT)
        dispatcher = Dispatcher(db, {"hook": stormy, "plain": plain}, clock, poll=0.05)
        dispatcher.start()
        try:
            wait_until(lambda: len(summaries(receiver)) == 1, "the summary")
            wait_until(lambda: len(singles(plain_receiver)) == 450, "every alert to plain")
        finally:
            dispatcher.stop()
    (summary,) = summaries(receiver)
    assert summary["count"] == 450 and singles(receiver) == []
    assert len(summary["first"]) == 20
    statuses = dict(
        conn.execute(
            "SELECT status, count(*) FROM slawatch.outbox_send WHERE notifier = 'hook' GROUP BY 1"
        ).fetchall()
    )
    assert set(statuses) == {"summarized"}
