"""Resolved notices (rule `resolve: true`): one per notified episode that ends, in the
claim that ends it, to the notifiers that episode paged; walked through time."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from slawatch.actions.run import runner
from slawatch.config.rules import Rule, Tier
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due
from slawatch.engine.claim import ClaimPlan, plan_claim
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from tests.integration.helpers import (
    Conn,
    FixedClock,
    alerts_of,
    batch_with_nested_loops,
    claim_all,
    episodes,
    shop,
)
from tests.integration.lifecycle_helpers import Inbox

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
DUE = T0 + 48 * H + S  # order_unshipped: paid at T0, overdue from here
# A sweep (track: table) runs at most every 10 minutes; scans this far apart both sweep.
SWEPT = 11 * M


def notices(conn: Conn, rule: str) -> list[tuple[str, int, str, list[str], datetime, datetime]]:
    """(key, episode, severity, [notifiers], deadline, due_at) of every resolved notice of
    ``rule``, in either shape of the outbox (docs/explanation/outbox-rows.md)."""
    rows = alerts_of(
        conn, rule, "key", "episode", "severity", "notifiers", "deadline", "due_at", kind="resolved"
    )
    return [(k, e, s, ns, d, due) for k, e, s, ns, d, due in rows]


def resolved(conn: Conn, rule: str = "order_unshipped") -> list[tuple[str, int, str, list[str]]]:
    """(key, episode, severity, [notifiers]) of every resolved notice of ``rule``."""
    return [(k, e, s, sorted(ns)) for k, e, s, ns, _, _ in notices(conn, rule)]


def resolving(conn: Conn, track: str, resolve: bool = True, **update: object) -> ClaimPlan:
    """order_unshipped (48 h, every 6 h, 5 at most, critical from #3) with ``resolve``."""
    rule = shop(conn, track)["order_unshipped"].model_copy(update={"resolve": resolve, **update})
    migrate(conn, [rule])
    return prepare(conn, rule)


@pytest.mark.parametrize("resolve", [True, False])
def test_a_completed_row_gets_one_resolved_notice(
    conn: Conn, dsn: str, track: str, resolve: bool
) -> None:
    plan = resolving(conn, track, resolve)
    conn.execute(
        "INSERT INTO orders VALUES (1, 7, 100, 'paid', %(t)s), (2, 7, 200, 'paid', %(t)s),"
        " (3, 8, 300, 'paid', %(later)s)",
        {"t": T0, "later": T0 + 10 * H},
    )
    assert claim_all(conn, plan, DUE) == 2  # orders 1 and 2; order 3 is not due yet
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id IN (1, 3)")
    # Order 3 completes before it was ever notified: no episode, no notice.
    for t in (DUE + SWEPT, DUE + 2 * SWEPT, DUE + 6 * H + S, DUE + 3 * SWEPT + 6 * H):
        claim_all(conn, plan, t)
    if not resolve:
        assert resolved(conn) == []
        return
    assert resolved(conn) == [("1", 1, "warning", ["console"])]
    assert episodes(conn, "order_unshipped") == [("1", 1, 0), ("1", 1, 1), ("2", 1, 1), ("2", 1, 2)]
    # Receivers see it as "resolved", with an id of its own.
    inbox = Inbox()
    with Database(dsn, size=1) as db:
        deliver_due(db, {"console": inbox}, FixedClock(DUE + 7 * H))
    notice = [a for a in inbox.got if a["status"] == "resolved"]
    assert [a["id"] for a in notice] == ["order_unshipped:1:e1:resolved"]
    assert notice[0]["n"] == 0 and notice[0]["row"]["id"] == 1
    assert notice[0]["deadline"] == "2026-03-01T12:00:00Z"  # the episode's deadline
    assert {a["status"] for a in inbox.got if a["status"] != "resolved"} == {"firing"}


def test_a_moved_deadline_ends_the_episode(conn: Conn, track: str) -> None:
    """Order 1's deadline moves to the future: its episode ends (resolved). Order 2's
    moves to a time already due: the same claim resolves episode 1 and pages episode 2."""
    plan = resolving(conn, track)
    conn.execute(
        "INSERT INTO orders VALUES (1, 7, 100, 'paid', %(t)s), (2, 7, 200, 'paid', %(t)s)",
        {"t": T0},
    )
    assert claim_all(conn, plan, DUE) == 2
    # Within track: table's look-back, so its scan (not only the sweep) finds it.
    conn.execute("UPDATE orders SET paid_at = %s WHERE id = 2", (T0 + 30 * S,))
    assert claim_all(conn, plan, DUE + M) == 1  # order 2, episode 2, #1
    assert resolved(conn) == [("2", 1, "warning", ["console"])]
    assert ("2", 2, 1) in episodes(conn, "order_unshipped")
    conn.execute("UPDATE orders SET paid_at = %s WHERE id = 1", (T0 + 24 * H,))
    claim_all(conn, plan, DUE + SWEPT)
    claim_all(conn, plan, DUE + 2 * SWEPT)
    assert resolved(conn) == [("1", 1, "warning", ["console"]), ("2", 1, "warning", ["console"])]
    # Order 1 is due again from its new deadline: a new episode, not resolved again.
    assert claim_all(conn, plan, T0 + 72 * H + S) >= 1
    assert ("1", 2, 1) in episodes(conn, "order_unshipped")
    assert len(resolved(conn)) == 2


def test_the_notice_goes_to_the_notifiers_that_were_paged(conn: Conn, track: str) -> None:
    """From #3 the pager is paged instead: a row resolved after #2 tells only the console,
    a row resolved after #3 tells both, at the severity it ended at."""
    tier = Tier.model_validate({"from": 3, "severity": "critical", "notify": ["pager"]})
    plan = resolving(conn, track, escalate=[tier])
    conn.execute(
        "INSERT INTO orders VALUES (1, 7, 100, 'paid', %(t)s), (2, 7, 200, 'paid', %(t)s)",
        {"t": T0},
    )
    t = DUE
    for _ in range(2):  # #1 and #2 for both
        assert claim_all(conn, plan, t) == 2
        t += 6 * H + S
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    assert claim_all(conn, plan, t) == 1  # order 2's #3 (pager); order 1 closed
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 2")
    claim_all(conn, plan, t + SWEPT)
    claim_all(conn, plan, t + 2 * SWEPT)
    assert resolved(conn) == [
        ("1", 1, "warning", ["console"]),
        ("2", 1, "critical", ["console", "pager"]),
    ]


def test_no_notice_for_a_quiet_rule_or_an_episode_never_notified(conn: Conn, track: str) -> None:
    """A row overdue and completed between two scans was never notified: no notice."""
    plan = resolving(conn, track)
    conn.execute("INSERT INTO orders VALUES (1, 7, 100, 'paid', %s)", (T0,))
    claim_all(conn, plan, DUE - M)  # not due yet
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    for t in (DUE, DUE + SWEPT, DUE + 2 * SWEPT):
        assert claim_all(conn, plan, t) == 0
    assert resolved(conn) == []


@pytest.mark.parametrize("instances", [4])
def test_concurrent_claims_resolve_each_episode_exactly_once(
    conn: Conn, dsn: str, track: str, instances: int
) -> None:
    rows = 300
    plan = resolving(conn, track, batch=50)
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 100, 'paid', %s FROM generate_series(1, %s::int) g",
        (T0, rows),
    )
    assert claim_all(conn, plan, DUE) == rows
    conn.execute("UPDATE orders SET status = 'shipped'")
    barrier = threading.Barrier(instances)
    errors: list[BaseException] = []

    def scanner(rule: Rule) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                mine = prepare(c, rule)
                barrier.wait()
                for k in range(3):
                    claim_all(c, mine, DUE + (k + 1) * SWEPT)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=scanner, args=(plan.rule,)) for _ in range(instances)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    got = resolved(conn)
    assert sorted(int(k) for k, *_ in got) == list(range(1, rows + 1))
    assert all(notifiers == ["console"] for *_, notifiers in got)  # one delivery each


def test_a_timestamp_deadline_in_a_zone(conn: Conn, track: str) -> None:
    """job_hung's heartbeat is a `timestamp` in UTC: the notice's deadline is that instant."""
    rule = shop(conn, track)["job_hung"].model_copy(update={"resolve": True})
    migrate(conn, [rule])
    plan = plan_claim(rule, "timestamp without time zone") if track == "inline" else None
    # job_hung restarts its job: recorded would_run here, so the row stays as set.
    plan = (plan or prepare(conn, rule)).with_act(runner("off"))
    conn.execute(
        "INSERT INTO jobs VALUES (1, 'sync', 'w1', 'running', %s)", (T0.replace(tzinfo=None),)
    )
    assert claim_all(conn, plan, T0 + 15 * M + S) == 1
    conn.execute("UPDATE jobs SET status = 'done'")
    claim_all(conn, plan, T0 + 30 * M)
    claim_all(conn, plan, T0 + 45 * M)
    assert [(d, due) for *_, d, due in notices(conn, "job_hung")] == [(T0, T0 + 15 * M)]


@pytest.mark.parametrize("track", ["table"])
def test_table_an_end_seen_at_the_re_notification_time(conn: Conn, track: str) -> None:
    """track: table notices an ended episode when its re-notification comes due (before
    the next sweep, a day away here): resolved there, in the same statement."""
    plan = resolving(conn, track, sweep=timedelta(days=1))
    conn.execute("INSERT INTO orders VALUES (1, 7, 100, 'paid', %s)", (T0,))
    assert claim_all(conn, plan, DUE) == 1
    conn.execute("UPDATE orders SET status = 'shipped'")
    assert claim_all(conn, plan, DUE + 6 * H + S) == 0
    assert resolved(conn) == [("1", 1, "warning", ["console"])]


def test_a_wave_of_ended_episodes_is_paired_in_one_pass_whatever_the_estimates(
    conn: Conn, track: str
) -> None:
    """A batch pairs what it wrote with what it read (episodes opened, notices and their
    episodes' notification counts) in one pass: joined, those CTEs were planned on their
    estimates, and statistics from before a wave (every deadline moved, every episode
    ended) put them at 1 row, a nested loop comparing each row with every other (a
    batch of 10,000 took 22 s in bench/scale.py's drain). Nested loops forced here."""
    plan = resolving(conn, track, batch=5000)
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 100, 'paid', %s + g * interval '1 ms'"
        " FROM generate_series(1, 2000) g",
        (T0,),
    )
    assert claim_all(conn, plan, DUE + 2 * S) == 2000
    # 1,000 deadlines move to a time still due (episode 2 opens, 1 ends), 1,000 ship.
    conn.execute("UPDATE orders SET paid_at = paid_at + interval '1 hour' WHERE id <= 1000")
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id > 1000")
    now = DUE + 2 * H
    if plan.table is None:
        statement, params = plan.statement, plan.params(now)
    else:  # the sweep closes the shipped ones; the batch opens the moved ones
        statement, params = plan.table.claim, plan.params(now) | {"since": "-infinity"}
    wrote, quadratic = batch_with_nested_loops(conn, statement, params)
    assert wrote["CTE resolved"] >= 1000  # the wave happened in this batch
    assert quadratic == []
