"""Many scanners, one database: every due row claimed exactly once per notification."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.types.json import Jsonb

from slawatch.config.rules import Rule
from slawatch.engine.claim import ClaimPlan, claim_batch, plan_claim
from slawatch.engine.migrate import migrate
from slawatch.engine.outbox import DEFAULT_OUTBOX, Outbox
from slawatch.engine.timers import prune_timers
from tests.integration.helpers import Conn, alerts, episodes

N = 10_000
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def scan_together(dsn: str, plan: ClaimPlan, now: datetime) -> list[int]:
    """Four scanners claim ``plan`` at ``now`` together until none finds work; each's count."""
    counts = [0] * 4
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(i: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                start.wait()
                empty = 0
                while empty < 3:  # rows skipped as locked by others come back later
                    got = claim_batch(c, plan, now)
                    counts[i] += got
                    empty = empty + 1 if got == 0 else 0
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return counts


def test_four_scanners_claim_each_row_once_per_notification(conn: Conn, dsn: str) -> None:
    conn.execute(
        "CREATE TABLE tasks (id bigint PRIMARY KEY, state text NOT NULL, started_at timestamptz)"
    )
    conn.execute(
        "INSERT INTO tasks SELECT g, 'running', %s - g * interval '1 second'"
        " FROM generate_series(1, %s::int) g",
        (T0, N),
    )
    # Finished rows the scanners must never touch.
    conn.execute(
        "INSERT INTO tasks SELECT g, 'done', %s FROM generate_series(%s::int, %s::int) g",
        (T0, N + 1, N + 500),
    )
    rule = Rule.model_validate(
        {
            "name": "stuck",
            "table": "tasks",
            "key": "id",
            "deadline": "started_at",
            "after": "1m",
            "open_when": "state = 'running'",
            "batch": 250,
            "renotify": {"every": "1h", "max": 2},
            "notify": ["a", "b"],
        }
    )
    migrate(conn, [rule])
    plan = plan_claim(rule, "timestamp with time zone")

    counts = scan_together(dsn, plan, T0 + timedelta(minutes=2))
    assert sum(counts) == N
    assert sum(1 for c in counts if c > 0) >= 2, f"the work was not shared: {counts}"
    assert claim_batch(conn, plan, T0 + timedelta(minutes=2)) == 0  # none left behind

    counts = scan_together(dsn, plan, T0 + timedelta(hours=2))
    assert sum(counts) == N
    counts = scan_together(dsn, plan, T0 + timedelta(hours=10))
    assert sum(counts) == 0  # the cap of 2 is reached

    got = alerts(conn, "stuck")  # either shape of the outbox
    for n in (1, 2):
        keys = sorted(int(k) for k, m, _, _ in got if m == n)
        assert keys == list(range(1, N + 1)), f"notification {n}"
    assert len(got) == 2 * N
    assert all(ns == ["a", "b"] for _, _, _, ns in got)  # each alert to both notifiers
    untouched = conn.execute("SELECT count(*) FROM tasks WHERE state = 'done' AND sw_stuck_n > 0")
    assert untouched.fetchone() == (0,)


def two_running_tasks(conn: Conn, outbox: Outbox = DEFAULT_OUTBOX, **fields: object) -> ClaimPlan:
    """Table tasks with two tasks running since T0, and rule stuck migrated for it,
    claimed into the outbox's shape ``outbox``."""
    conn.execute("CREATE TABLE tasks (id bigint PRIMARY KEY, state text, started_at timestamptz)")
    conn.execute("INSERT INTO tasks VALUES (1, 'running', %s), (2, 'running', %s)", (T0, T0))
    base = {
        "name": "stuck",
        "table": "tasks",
        "deadline": "started_at",
        "open_when": "state = 'running'",
        "notify": ["a"],
    }
    rule = Rule.model_validate(base | fields)
    migrate(conn, [rule])
    return plan_claim(rule, "timestamp with time zone", key=["id"], outbox_in=outbox)


def test_a_row_locked_by_the_application_is_skipped_not_waited_for(conn: Conn, dsn: str) -> None:
    plan = two_running_tasks(conn)
    with psycopg.connect(dsn) as app:  # an application transaction holds row 1
        app.execute("UPDATE tasks SET state = 'done' WHERE id = 1")
        conn.execute("SET lock_timeout = '2s'")  # a wait would fail the test, not hang it
        assert claim_batch(conn, plan, T0 + timedelta(minutes=1)) == 1  # row 2 only
        app.commit()
    assert claim_batch(conn, plan, T0 + timedelta(minutes=1)) == 0  # row 1 completed meanwhile


def test_a_row_whose_child_the_application_is_inserting_is_still_claimed(
    conn: Conn, dsn: str
) -> None:
    """Inserting a child row takes KEY SHARE on its parent (the foreign key check). The
    claim's NO KEY UPDATE lock does not conflict with it: a hung job whose worker keeps
    a transaction open on its log rows is still paged, and the worker is not blocked."""
    plan = two_running_tasks(conn)
    conn.execute("CREATE TABLE task_log (task_id bigint REFERENCES tasks, line text)")
    with psycopg.connect(dsn) as worker:  # open transaction, holding KEY SHARE on task 1
        worker.execute("INSERT INTO task_log VALUES (1, 'still working')")
        conn.execute("SET lock_timeout = '2s'")
        assert claim_batch(conn, plan, T0 + timedelta(minutes=1)) == 2
        worker.execute("SET lock_timeout = '2s'")
        worker.execute("INSERT INTO task_log VALUES (1, 'more')")  # not blocked by us
        worker.commit()


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_a_notification_that_exists_already_does_not_stop_the_rule(
    conn: Conn, caplog: pytest.LogCaptureFixture, outbox: Outbox
) -> None:
    """Tracking state lost (restored from an older backup, an upgrade cut short): the
    claim meets an alert it wrote before. It skips it and goes on; nothing is paged twice.
    The claim is sent without its guards first (docs/explanation/architecture.md): only
    the claim that meets the alert is sent again with them, and says so."""
    plan = two_running_tasks(conn, outbox, renotify={"every": "1h"})
    with caplog.at_level(logging.WARNING, logger="slawatch.engine.outbox"):
        assert claim_batch(conn, plan, T0 + timedelta(minutes=1)) == 2
        assert not caplog.records  # nothing there yet: one statement, unguarded
        conn.execute("UPDATE tasks SET sw_stuck_seen = NULL, sw_stuck_ep = 0 WHERE id = 1")
        assert claim_batch(conn, plan, T0 + timedelta(minutes=2)) == 0  # #1 of task 1: exists
        assert [r.getMessage().split(":")[0] for r in caplog.records] == ["claim for rule stuck"]
        assert claim_batch(conn, plan, T0 + timedelta(hours=2)) == 2  # both go on at #2
        assert len(caplog.records) == 1
    got = episodes(conn, "stuck")
    assert got == [("1", 1, 1), ("1", 1, 2), ("2", 1, 1), ("2", 1, 2)]


def test_four_scanners_page_each_event_timer_once(conn: Conn, dsn: str) -> None:
    """An event rule's timers are claimed like a table's rows: each deadline once."""
    rule = Rule.model_validate(
        {
            "name": "parcel",
            "events": {"start": "shipped", "stop": "delivered", "within": "1h"},
            "batch": 100,
            "notify": ["a"],
        }
    )
    migrate(conn, [rule])
    n = 2_000
    shipped = [
        {"type": "shipped", "key": f"p{k}", "at": (T0 + k * timedelta(seconds=1)).isoformat()}
        for k in range(n)
    ]
    # Every tenth parcel was delivered in time: never paged.
    delivered = [
        {"type": "delivered", "key": f"p{k}", "at": (T0 + timedelta(minutes=50)).isoformat()}
        for k in range(0, n, 10)
    ]
    conn.execute(
        "SELECT count(*) FROM slawatch.events(%s, %s)",
        (Jsonb(shipped + delivered), T0 + timedelta(hours=1)),
    )
    plan = plan_claim(rule, "timestamp with time zone")
    counts = scan_together(dsn, plan, T0 + timedelta(hours=2))
    assert sum(counts) == n - n // 10
    assert sum(1 for c in counts if c > 0) >= 2, f"the work was not shared: {counts}"
    pages = episodes(conn, "parcel")  # either shape of the outbox
    assert len(pages) == n - n // 10
    assert len({k for k, _, _ in pages}) == n - n // 10


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
@pytest.mark.parametrize("ended", [True, False], ids=["ended", "deleted_overdue"])
def test_a_key_inserted_again_is_paged_as_a_new_episode(
    conn: Conn, outbox: Outbox, ended: bool
) -> None:
    """An inline rule's tracking columns are on the row: a row deleted (after its episode
    ended, or while still overdue) and its key inserted again starts over at episode 0.
    Its new overdue stretch is paged as the key's next episode, not passed over as the
    first one seen again (0027_next_episode.sql); a restored backup still is."""
    plan = two_running_tasks(conn, outbox)
    assert claim_batch(conn, plan, T0 + timedelta(minutes=1)) == 2
    if ended:
        conn.execute("UPDATE tasks SET state = 'done' WHERE id = 1")
        claim_batch(conn, plan, T0 + timedelta(minutes=2))  # closes task 1's episode
    conn.execute("DELETE FROM tasks WHERE id = 1")
    conn.execute("INSERT INTO tasks VALUES (1, 'running', %s)", (T0 + timedelta(minutes=3),))
    assert claim_batch(conn, plan, T0 + timedelta(minutes=5)) == 1
    assert conn.execute("SELECT sw_stuck_ep FROM tasks WHERE id = 1").fetchone() == (2,)
    history = conn.execute(
        "SELECT key, episode, ended_at IS NOT NULL FROM slawatch.episode ORDER BY 1, 2"
    ).fetchall()
    # The episode before is ended by the next one where the deletion left it open.
    assert history == [("1", 1, True), ("1", 2, False), ("2", 1, False)]
    assert episodes(conn, "stuck") == [("1", 1, 1), ("1", 2, 1), ("2", 1, 1)]


def test_a_key_inserted_again_after_its_history_was_pruned_is_paged(conn: Conn) -> None:
    """Retention removes an ended episode's history row before the range that holds its
    alerts is dropped (docs/how-to/operate.md): the alerts alone number the key's next
    episode, and tell a restored backup's repeat (the same deadline) from a new one.
    Today's outbox only: rows keep no entry per alert to find the key by, and give this
    up once the history row is gone (docs/explanation/outbox-rows.md, alerted once)."""
    plan = two_running_tasks(conn, "alerts")
    assert claim_batch(conn, plan, T0 + timedelta(minutes=1)) == 2
    conn.execute("UPDATE tasks SET state = 'done' WHERE id = 1")
    claim_batch(conn, plan, T0 + timedelta(minutes=2))
    conn.execute("DELETE FROM slawatch.episode WHERE ended_at IS NOT NULL")
    conn.execute("DELETE FROM tasks WHERE id = 1")
    conn.execute("INSERT INTO tasks VALUES (1, 'running', %s)", (T0 + timedelta(minutes=3),))
    # Task 2's tracking state as before its #1, its history row gone too: a repeat.
    conn.execute("DELETE FROM slawatch.episode")
    conn.execute(
        "UPDATE tasks SET sw_stuck_ep = 0, sw_stuck_n = 0, sw_stuck_seen = NULL,"
        " sw_stuck_next = NULL WHERE id = 2"
    )
    assert claim_batch(conn, plan, T0 + timedelta(minutes=5)) == 1  # task 1 only
    assert episodes(conn, "stuck") == [("1", 1, 1), ("1", 2, 1), ("2", 1, 1)]


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_an_event_key_started_again_after_its_timer_was_pruned_is_paged(
    conn: Conn, outbox: Outbox
) -> None:
    """Retention removes a stopped timer (prune_timers) before its episode's alerts: the
    key started again is paged as its next episode (0027_next_episode.sql)."""
    rule = Rule.model_validate(
        {
            "name": "parcel",
            "events": {"start": "shipped", "stop": "delivered", "within": "1h"},
            "notify": ["a"],
        }
    )
    migrate(conn, [rule])
    plan = plan_claim(rule, "timestamp with time zone", outbox_in=outbox)

    def event(kind: str, at: datetime) -> None:
        conn.execute(
            "SELECT count(*) FROM slawatch.events(%s, %s)",
            (Jsonb([{"type": kind, "key": "p1", "at": at.isoformat()}]), at),
        )

    event("shipped", T0)
    assert claim_batch(conn, plan, T0 + timedelta(hours=2)) == 1
    event("delivered", T0 + timedelta(hours=3))
    claim_batch(conn, plan, T0 + timedelta(hours=3))  # ends the episode
    assert prune_timers(conn, rule, T0 + timedelta(days=9), T0 + timedelta(days=9), 100) == 1
    event("shipped", T0 + timedelta(days=10))
    assert claim_batch(conn, plan, T0 + timedelta(days=10, hours=2)) == 1
    assert episodes(conn, "parcel") == [("p1", 1, 1), ("p1", 2, 1)]
