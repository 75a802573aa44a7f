"""Episodes (docs/explanation/episodes.md): a row overdue again is a new episode, paged from #1.

An episode starts when the deadline passes while open_when holds and ends when
open_when turns false or the deadline value changes. Each shipped rule is walked
through recover -> overdue again, with the application clock frozen and moved.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time

from slawatch.actions.run import runner
from slawatch.config.rules import Backoff, Renotify
from slawatch.engine.claim import plan_claim
from slawatch.engine.migrate import migrate
from tests.integration.helpers import Conn, claim_all, episodes, plans, shop, tracking

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
# Inline tracking only: these read its columns, or its scans notice an episode's end
# sooner than track: table does (see test_track_table.py for that way).
INLINE = pytest.mark.parametrize("track", ["inline"])
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)


def naive(t: datetime) -> datetime:
    """UTC wall time, as jobs.heartbeat_at (a `timestamp`) holds it."""
    return t.astimezone(UTC).replace(tzinfo=None)


def test_a_hung_job_that_recovers_is_not_paged_and_pages_again_when_it_hangs(
    conn: Conn, track: str
) -> None:
    """job_hung: 15 min without a heartbeat, every 15 min, 4 at most."""
    plan = plans(conn, shop(conn, track))["job_hung"]
    conn.execute("INSERT INTO jobs VALUES (1, 'sync', 'w1', 'running', %s)", (naive(T0),))
    with freeze_time(T0 + 15 * M + S) as clock:
        assert claim_all(conn, plan) == 1  # episode 1, #1
        # The job recovers: its heartbeat moves on, and it keeps beating for a while.
        conn.execute("UPDATE jobs SET heartbeat_at = %s WHERE id = 1", (naive(T0 + 20 * M),))
        clock.move_to(T0 + 30 * M + S)  # when #2 would have been due
        assert claim_all(conn, plan) == 0
        if track == "inline":
            n, nxt, seen, ep = tracking(conn, "job_hung", "jobs", 1)
            assert (n, nxt, seen, ep) == (0, None, None, 1)  # the episode is closed
        # It hangs again: 15 minutes after its last heartbeat a new episode starts at #1.
        clock.move_to(T0 + 35 * M - S)
        assert claim_all(conn, plan) == 0
        clock.move_to(T0 + 35 * M + S)
        assert claim_all(conn, plan) == 1
        for _ in range(3):  # #2, #3, #4 every 15 minutes, then the cap
            clock.tick(15 * M + S)
            assert claim_all(conn, plan) == 1
        clock.tick(24 * H)
        assert claim_all(conn, plan) == 0
        # At its cap it is quiet; a later hang of the same job still pages from #1.
        conn.execute("UPDATE jobs SET heartbeat_at = %s WHERE id = 1", (naive(clock()),))
        assert claim_all(conn, plan) == 0  # closes episode 2
        clock.tick(15 * M + S)
        assert claim_all(conn, plan) == 1
    got = episodes(conn, "job_hung")  # in either shape of the outbox
    assert got == [
        ("1", 1, 1),
        ("1", 2, 1),
        ("1", 2, 2),
        ("1", 2, 3),
        ("1", 2, 4),
        ("1", 3, 1),
    ]
    assert len(set(got)) == 6  # every (rule, key, episode, n) once


@INLINE
def test_an_extended_deadline_ends_the_episode(conn: Conn, track: str) -> None:
    """order_unshipped (48 h, every 6 h): the deadline value changes, e.g. a re-payment."""
    plan = plans(conn, shop(conn, track))["order_unshipped"]
    conn.execute(
        "INSERT INTO orders VALUES (1, 7, 1000, 'paid', %(t)s), (2, 7, 1000, 'paid', %(t)s)",
        {"t": T0},
    )
    with freeze_time(T0 + 48 * H + S) as clock:
        assert claim_all(conn, plan) == 2
        # Order 1's deadline moves into the future; order 2's moves but stays overdue.
        conn.execute("UPDATE orders SET paid_at = %s WHERE id = 1", (T0 + 24 * H,))
        conn.execute("UPDATE orders SET paid_at = %s WHERE id = 2", (T0 - H,))
        assert claim_all(conn, plan) == 1  # order 2: a new episode at once
        clock.move_to(T0 + 54 * H + 2 * S)  # order 1's #2 would have been due
        assert claim_all(conn, plan) == 1  # only order 2's re-notification
        clock.move_to(T0 + 72 * H + S)  # order 1's new deadline passed
        assert claim_all(conn, plan) == 2  # and order 2's #3
    assert episodes(conn, "order_unshipped") == [
        ("1", 1, 1),
        ("1", 2, 1),
        ("2", 1, 1),
        ("2", 2, 1),
        ("2", 2, 2),
        ("2", 2, 3),
    ]


@INLINE
def test_a_reopened_row_is_a_new_episode(conn: Conn, track: str) -> None:
    """refund_unprocessed (3 d, backoff 12 h -> 2 d): processed, then reopened."""
    plan = plans(conn, shop(conn, track))["refund_unprocessed"]
    conn.execute("INSERT INTO refunds VALUES (1, 10, 500, 'requested', %s)", (T0,))
    due = T0 + 72 * H
    with freeze_time(due + S) as clock:
        assert claim_all(conn, plan) == 1
        clock.tick(12 * H + S)
        assert claim_all(conn, plan) == 1  # #2
        conn.execute("UPDATE refunds SET status = 'processed' WHERE id = 1")
        clock.tick(H)
        assert claim_all(conn, plan) == 0  # the scan sees the episode end
        assert tracking(conn, "refund_unprocessed", "refunds", 1)[:3] == (0, None, None)
        # The refund bounces and is requested again, with the same requested_at.
        conn.execute("UPDATE refunds SET status = 'requested' WHERE id = 1")
        assert claim_all(conn, plan) == 1  # still overdue: episode 2 at #1
        clock.tick(12 * H - S)  # (re-notifications are taken up to a second early)
        assert claim_all(conn, plan) == 0  # the backoff starts over at 12 h
        clock.tick(2 * S)
        assert claim_all(conn, plan) == 1
    assert episodes(conn, "refund_unprocessed") == [
        ("1", 1, 1),
        ("1", 1, 2),
        ("1", 2, 1),
        ("1", 2, 2),
    ]


@INLINE
def test_a_row_closed_and_reopened_between_two_scans_stays_in_its_episode(
    conn: Conn, track: str
) -> None:
    """The documented limit of inline tracking: slawatch sees an episode end at a scan.
    A row that closes and reopens with the same deadline in between goes on where it was."""
    plan = plans(conn, shop(conn, track))["order_unshipped"]
    conn.execute("INSERT INTO orders VALUES (1, 7, 1000, 'paid', %s)", (T0,))
    assert claim_all(conn, plan, T0 + 48 * H + S) == 1
    conn.execute("UPDATE orders SET status = 'cancelled' WHERE id = 1")
    conn.execute("UPDATE orders SET status = 'paid' WHERE id = 1")
    assert claim_all(conn, plan, T0 + 54 * H + 2 * S) == 1
    assert episodes(conn, "order_unshipped") == [("1", 1, 1), ("1", 1, 2)]


def test_a_receipt_redelivered_is_paged_once_more(conn: Conn, track: str) -> None:
    """receipt_unconfirmed (10 d, once): a parcel delivered again is a new deadline."""
    plan = plans(conn, shop(conn, track))["receipt_unconfirmed"]
    conn.execute("INSERT INTO shipments VALUES (1, 1, 'DHL', 'delivered', %s, NULL)", (T0,))
    assert claim_all(conn, plan, T0 + 240 * H + S) == 1
    assert claim_all(conn, plan, T0 + 500 * H) == 0  # once
    redelivered = T0 + 600 * H
    conn.execute("UPDATE shipments SET delivered_at = %s WHERE id = 1", (redelivered,))
    assert claim_all(conn, plan, redelivered + 240 * H - S) == 0
    assert claim_all(conn, plan, redelivered + 240 * H + S) == 1
    assert claim_all(conn, plan, redelivered + 2000 * H) == 0
    assert episodes(conn, "receipt_unconfirmed") == [("1", 1, 1), ("1", 2, 1)]


@INLINE
def test_ended_rows_leave_the_indexes_at_the_next_scan(conn: Conn, track: str) -> None:
    """A row whose episode ended is closed once: afterwards no index of the rule holds it,
    so later scans never look at it again, however many rows end."""
    plan = plans(conn, shop(conn, track))["order_unshipped"]
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 1000, 'paid', %s FROM generate_series(1, 300) g", (T0,)
    )
    assert claim_all(conn, plan, T0 + 48 * H + S) == 300
    conn.execute("UPDATE orders SET status = 'shipped'")
    assert claim_all(conn, plan, T0 + 49 * H) == 0
    held = conn.execute(
        "SELECT count(*) FILTER (WHERE sw_order_unshipped_seen IS NOT NULL),"
        " count(*) FILTER (WHERE sw_order_unshipped_next IS NOT NULL) FROM orders"
    ).fetchone()
    assert held == (0, 0)


@INLINE
def test_the_backoff_cap_is_applied_by_the_claim(conn: Conn, track: str) -> None:
    """refund-like backoff 12 h doubling, capped at 2 d: the 4th wait would be 96 h."""
    rules = shop(conn, track)
    renotify = Renotify(backoff=Backoff(first=12 * H, max=48 * H), max=6)
    rule = rules["refund_unprocessed"].model_copy(update={"renotify": renotify})
    migrate(conn, [rule])
    plan = plan_claim(rule, "timestamp with time zone", key=["id"])
    conn.execute("INSERT INTO refunds VALUES (1, 10, 500, 'requested', %s)", (T0,))
    fired = T0 + 72 * H + S
    waits = []
    for _ in range(6):
        assert claim_all(conn, plan, fired) == 1
        nxt = tracking(conn, "refund_unprocessed", "refunds", 1)[1]
        if nxt is None:
            break
        waits.append(nxt - fired)
        fired = nxt + S
    assert waits == [12 * H, 24 * H, 48 * H, 48 * H, 48 * H]


@INLINE
def test_recovered_rows_waiting_to_be_closed_are_never_paged(conn: Conn, track: str) -> None:
    """More rows end than one scan closes (batch 2, five jobs recover): those left for the
    next scans must not be re-notified meanwhile, though their re-notify time passed."""
    rules = shop(conn, track)
    rule = rules["job_hung"].model_copy(update={"batch": 2})
    plan = plan_claim(rule, "timestamp without time zone", key=["id"]).with_act(runner("off"))
    conn.execute(
        "INSERT INTO jobs SELECT g, 'sync', 'w1', 'running', %s FROM generate_series(1, 5) g",
        (naive(T0),),
    )
    now = T0 + 15 * M + S
    assert claim_all(conn, plan, now) == 5
    conn.execute("UPDATE jobs SET heartbeat_at = %s", (naive(now + M),))
    later = now + 15 * M + S  # every #2 is due; no new heartbeat is 15 minutes old
    assert [claim_all(conn, plan, later) for _ in range(4)] == [0, 0, 0, 0]
    open_episodes = conn.execute("SELECT count(*) FROM jobs WHERE sw_job_hung_seen IS NOT NULL")
    assert open_episodes.fetchone() == (0,)
    assert len(episodes(conn, "job_hung")) == 5


@INLINE
def test_a_backoff_without_a_cap_on_notifications_never_overflows(conn: Conn, track: str) -> None:
    """renotify: backoff without max: a row overdue for months reaches notification #70;
    first * 2^69 is no interval PostgreSQL can hold, so the exponent stops at the cap."""
    rules = shop(conn, track)
    renotify = Renotify(backoff=Backoff(first=12 * H, max=48 * H))
    rule = rules["refund_unprocessed"].model_copy(update={"renotify": renotify})
    migrate(conn, [rule])
    plan = plan_claim(rule, "timestamp with time zone", key=["id"])
    conn.execute("INSERT INTO refunds VALUES (1, 10, 500, 'requested', %s)", (T0,))
    now = T0 + 72 * H + S
    assert claim_all(conn, plan, now) == 1
    conn.execute("UPDATE refunds SET sw_refund_unprocessed_n = 69")  # months later
    assert claim_all(conn, plan, now + 13 * H) == 1
    n, nxt, _, _ = tracking(conn, "refund_unprocessed", "refunds", 1)
    assert (n, nxt - (now + 13 * H)) == (70, 48 * H)
