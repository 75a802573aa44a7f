"""Each example rule through its whole life, with the application clock frozen and moved."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time

from slawatch.actions.run import runner
from slawatch.config.rules import Tier
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due
from slawatch.engine.claim import plan_claim
from slawatch.engine.migrate import migrate
from slawatch.engine.outbox import Outbox
from slawatch.engine.ready import prepare
from tests.integration.helpers import Conn, FixedClock, alerts, alerts_of, claim_all, plans, shop
from tests.integration.lifecycle_helpers import Inbox

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
S = timedelta(seconds=1)


def times(conn: Conn, rule: str) -> list[tuple[int, datetime, datetime, datetime]]:
    """(n, deadline, due_at, fired_at) of every alert of ``rule``, by n, in either shape
    of the outbox."""
    return [
        (n, d, due, f)
        for n, d, due, f in alerts_of(conn, rule, "n", "deadline", "due_at", "fired_at")
    ]


def test_order_unshipped_every_6h_capped_at_5_escalating_at_3(conn: Conn, track: str) -> None:
    rules = shop(conn, track)
    plan = plans(conn, rules)["order_unshipped"]
    conn.execute(
        "INSERT INTO orders VALUES (1, 7, 1000, 'paid', %(t)s), (2, 7, 1000, 'paid', %(t)s),"
        " (3, 7, 1000, 'shipped', %(t)s), (4, 7, 1000, 'paid', NULL)",
        {"t": T0},
    )
    with freeze_time(T0 + 48 * H - S) as clock:
        assert claim_all(conn, plan) == 0  # one second before the deadline
        clock.move_to(T0 + 48 * H + S)
        assert claim_all(conn, plan) == 2  # orders 1 and 2; 3 shipped, 4 never paid
        assert claim_all(conn, plan) == 0  # claimed rows are not due again at once
        # Order 2 ships between notifications: never notified again.
        conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 2")
        last = T0 + 48 * H + S
        for n in range(2, 6):  # every 6h after the previous notification
            clock.move_to(last + 6 * H - S)
            assert claim_all(conn, plan) == 0, f"notification {n} came early"
            last += 6 * H + S
            clock.move_to(last)
            assert claim_all(conn, plan) == 1, f"notification {n} missing"
        clock.move_to(T0 + 100 * 24 * H)
        assert claim_all(conn, plan) == 0  # the cap of 5 is reached
    assert alerts(conn, "order_unshipped") == [
        ("1", 1, "warning", ["console"]),
        ("1", 2, "warning", ["console"]),
        ("1", 3, "critical", ["console"]),
        ("1", 4, "critical", ["console"]),
        ("1", 5, "critical", ["console"]),
        ("2", 1, "warning", ["console"]),
    ]
    if track == "table":
        return
    # The capped row left both partial indexes: n > 0 and no next time.
    row = conn.execute(
        "SELECT sw_order_unshipped_n, sw_order_unshipped_next FROM orders WHERE id = 1"
    )
    assert row.fetchone() == (5, None)


def test_refund_backoff_doubles_to_its_cap(conn: Conn, track: str) -> None:
    rules = shop(conn, track)
    plan = plans(conn, rules)["refund_unprocessed"]
    conn.execute("INSERT INTO refunds VALUES (1, 10, 500, 'requested', %s)", (T0,))
    due = T0 + 72 * H
    # First notice once due; then after 12h, 24h, then 2d (48h, the cap); 4 in all.
    waits = [12 * H, 24 * H, 48 * H]
    fire_times = [due + S]
    with freeze_time(due - S) as clock:
        assert claim_all(conn, plan) == 0
        clock.move_to(fire_times[0])
        assert claim_all(conn, plan) == 1
        for i, wait in enumerate(waits, start=2):
            clock.move_to(fire_times[-1] + wait - S)
            assert claim_all(conn, plan) == 0, f"notification {i} came early"
            fire_times.append(fire_times[-1] + wait + S)
            clock.move_to(fire_times[-1])
            assert claim_all(conn, plan) == 1, f"notification {i} missing"
        clock.move_to(due + 365 * 24 * H)
        assert claim_all(conn, plan) == 0
    assert [n for _, n, _, _ in alerts(conn, "refund_unprocessed")] == [1, 2, 3, 4]
    fired = times(conn, "refund_unprocessed")
    assert [f for *_, f in fired] == fire_times
    assert {d for _, _, d, _ in fired} == {due}  # due_at: when the row became overdue


def test_receipt_unconfirmed_is_notified_once(conn: Conn, track: str) -> None:
    rules = shop(conn, track)
    plan = plans(conn, rules)["receipt_unconfirmed"]
    conn.execute(
        "INSERT INTO shipments VALUES (1, 1, 'DHL', 'delivered', %(t)s, NULL),"
        " (2, 2, 'UPS', 'delivered', %(t)s, %(t)s), (3, 3, 'GLS', 'in_transit', NULL, NULL)",
        {"t": T0},
    )
    with freeze_time(T0 + 240 * H + S) as clock:
        assert claim_all(conn, plan) == 1
        clock.move_to(T0 + 1000 * 24 * H)
        assert claim_all(conn, plan) == 0
    assert alerts(conn, "receipt_unconfirmed") == [("1", 1, "info", ["console"])]


def test_job_hung_reads_a_timestamp_without_zone_as_utc(conn: Conn, track: str) -> None:
    rules = shop(conn, track)
    plan = plans(conn, rules)["job_hung"]
    naive = T0.replace(tzinfo=None)
    conn.execute(
        "INSERT INTO jobs VALUES (1, 'sync', 'w1', 'running', %s), (2, 'sync', 'w2', 'done', %s)",
        (naive, naive),
    )
    # Whatever the session's TimeZone, the deadline is UTC wall time.
    conn.execute("SET TimeZone = 'America/New_York'")
    with freeze_time(T0 + 15 * 60 * S - S) as clock:
        assert claim_all(conn, plan) == 0
        clock.move_to(T0 + 15 * 60 * S + S)
        assert claim_all(conn, plan) == 1
        # The job comes back to life (heartbeat); it is still running but a
        # renotification is only sent while it stays silent, so finish it.
        conn.execute("UPDATE jobs SET status = 'done' WHERE id = 1")
        clock.move_to(T0 + 10 * H)
        assert claim_all(conn, plan) == 0
    assert [(n, d) for n, d, _, _ in times(conn, "job_hung")] == [(1, T0)]


def test_timestamp_deadline_in_another_zone(conn: Conn, track: str) -> None:
    rules = shop(conn, track)
    rule = rules["job_hung"].model_copy(update={"timezone": "Europe/Berlin"})
    migrate(conn, [rule])  # a timezone decides when rows are due: part of the definition
    plan = plan_claim(rule, "timestamp without time zone").with_act(runner("off"))
    # 13:00 Berlin wall time (winter, UTC+1) is 12:00 UTC.
    conn.execute(
        "INSERT INTO jobs VALUES (1, 'sync', 'w1', 'running', %s)",
        (datetime(2026, 3, 1, 13, 0),),
    )
    assert claim_all(conn, plan, T0 + 15 * 60 * S - S) == 0
    assert claim_all(conn, plan, T0 + 15 * 60 * S + S) == 1


def test_escalation_switches_notifiers(conn: Conn, track: str) -> None:
    rules = shop(conn, track)
    base = rules["order_unshipped"]
    pager_tier = Tier.model_validate({"from": 4, "notify": ["pager", "console"]})
    rule = base.model_copy(update={"escalate": [*base.escalate, pager_tier]})
    migrate(conn, [rule])
    plan = plan_claim(rule, "timestamp with time zone")
    conn.execute("INSERT INTO orders VALUES (1, 7, 1000, 'paid', %s)", (T0,))
    for n in range(1, 6):
        assert claim_all(conn, plan, T0 + 48 * H + S + (n - 1) * 7 * H) == 1
    assert alerts(conn, "order_unshipped") == [
        ("1", 1, "warning", ["console"]),
        ("1", 2, "warning", ["console"]),
        ("1", 3, "critical", ["console"]),
        ("1", 4, "critical", ["console", "pager"]),
        ("1", 5, "critical", ["console", "pager"]),
    ]


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_an_infinite_deadline_is_paged_without_breaking_delivery(
    conn: Conn, db: Database, track: str, outbox: Outbox
) -> None:
    """'-infinity' is a valid timestamp (always due) that Python cannot hold: the alert
    keeps it in its row and leaves deadline/due_at empty, so the delivery can read it
    (and the receiver gets it), in either shape of the outbox."""
    rule = shop(conn, track)["order_unshipped"]
    plan = prepare(conn, rule, outbox=outbox)
    conn.execute("INSERT INTO orders VALUES (1, 7, 1000, 'paid', '-infinity')")
    assert claim_all(conn, plan, T0) == 1
    assert [(n, d, due) for n, d, due, _ in times(conn, "order_unshipped")] == [(1, None, None)]
    inbox = Inbox()
    assert deliver_due(db, {"console": inbox}, FixedClock(T0)).sent == 1
    [payload] = inbox.got
    assert payload["id"] == "order_unshipped:1:e1:n1"
    assert payload["deadline"] is None and payload["row"]["paid_at"] == "-infinity"
