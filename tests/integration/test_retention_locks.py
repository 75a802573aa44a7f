"""Retention beside the claims (docs/explanation/outbox-rows.md, "Retention"): the prune
of the episode history never waits for a history row a claim holds, so the two cannot
wait for each other; what it skipped goes with a later batch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.engine.abandon import give_up
from slawatch.engine.claim import ClaimPlan, drain
from slawatch.engine.migrate import migrate
from slawatch.engine.queries import queries
from slawatch.engine.ready import prepare
from slawatch.operate.lifecycle import ack
from slawatch.runtime.maintain import prune, prune_batch
from tests.integration.helpers import Conn, FixedClock
from tests.integration.test_explain import nodes
from tests.integration.test_outbox_rows_claim import DUE, SWEPT, T0, H, both, elements, orders, pair

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
RETENTION = timedelta(days=30)
CUTOFF = NOW - RETENTION
NO_ALERTS = (0, 0)  # an empty id range: the batch's outbox part reads nothing


def ended_episodes(conn: Conn, count: int) -> None:
    """``count`` episodes of rule 'late', keys '0', '1', ..., ended before the cutoff
    (key '0' first) and given up: what a claim's resolved notice in rows probes."""
    conn.execute(
        "INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at,"
        " ended_at, abandoned, resolved_notice_at)"
        " SELECT 'late', g::text, 1, %(old)s, %(old)s, %(old)s,"
        " %(cutoff)s - interval '1 day' + g * interval '1 second', true, %(old)s"
        " FROM generate_series(0, %(count)s - 1) g",
        {"old": CUTOFF - timedelta(days=9), "cutoff": CUTOFF, "count": count},
    )


def keys(conn: Conn) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT key FROM slawatch.episode").fetchall()}


def test_a_prune_batch_passes_over_a_history_row_a_claim_holds(conn: Conn, dsn: str) -> None:
    """A claim's FOR KEY SHARE probe of an ended, given-up history row (_RESOLVED_ROWS in
    slawatch/engine/outbox.py) is held by an open transaction: a prune batch deletes the
    other old rows without waiting for it (a lock_timeout makes a wait an error, not a
    hang); once the claim commits, the next batch deletes it."""
    migrate(conn, [])
    ended_episodes(conn, 4)
    with (
        psycopg.connect(dsn) as claim,
        psycopg.connect(dsn, autocommit=True) as pruner,
    ):
        held = claim.execute(
            "SELECT 1 FROM slawatch.episode"
            " WHERE rule = 'late' AND key = '0' AND episode = 1 FOR KEY SHARE"
        ).fetchall()
        assert held == [(1,)]
        pruner.execute("SET lock_timeout = '3s'")
        first = prune_batch(pruner, CUTOFF, 10, NO_ALERTS)
        assert first.episodes == 3
        assert keys(conn) == {"0"}
        claim.commit()
        second = prune_batch(pruner, CUTOFF, 10, NO_ALERTS)
    assert second.episodes == 1
    assert keys(conn) == set()


def test_a_held_row_does_not_shorten_a_batch(conn: Conn, dsn: str) -> None:
    """The rows a batch passes over do not count towards its size: a batch of 2 beside a
    held oldest row still deletes 2, so the batches go on while they come back full."""
    migrate(conn, [])
    ended_episodes(conn, 5)
    with (
        psycopg.connect(dsn) as claim,
        psycopg.connect(dsn, autocommit=True) as pruner,
    ):
        claim.execute("SELECT 1 FROM slawatch.episode WHERE key = '0' FOR KEY SHARE")
        pruner.execute("SET lock_timeout = '3s'")
        sizes = [prune_batch(pruner, CUTOFF, 2, NO_ALERTS).episodes for _ in range(3)]
    assert sizes == [2, 2, 0]
    assert keys(conn) == {"0"}


@pytest.mark.parametrize("track", ["inline"])
def test_a_prune_batch_passes_over_the_rows_a_real_claim_holds(
    conn: Conn, db: Database, dsn: str, track: str
) -> None:
    """The claim itself, not a stand-in: `rowed` (SLAWATCH_OUTBOX=rows, resolve) gave up
    orders 1 to 3, then orders 1 and 2 ship; its claim, left open, ends their given-up
    history rows again to write their resolved notices (FOR NO KEY UPDATE, in key
    order). A prune batch a window later deletes what no claim holds (order 3's row
    and `today`'s three) without waiting, and the held two once the claim commits."""
    plans = pair(conn, track, resolve=True, give_up_after="1d")
    orders(conn, range(1, 4), T0)
    both(db, plans, DUE)
    given_up = DUE + 2 * 24 * H
    assert give_up(db, list(plans), given_up) == {"today": 3, "rowed": 3}
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id IN (1, 2)")
    claiming = plans[1]
    cutoff = given_up + timedelta(minutes=1)
    with (
        psycopg.connect(dsn) as claim,
        psycopg.connect(dsn, autocommit=True) as pruner,
    ):
        claim.execute(claiming.statement, claiming.params(given_up + SWEPT)).fetchone()
        pruner.execute("SET lock_timeout = '3s'")
        first = prune_batch(pruner, cutoff, 100, NO_ALERTS)
        assert first.episodes == 4
        assert history_keys(conn) == {("rowed", "1"), ("rowed", "2")}
        claim.commit()
        second = prune_batch(pruner, cutoff, 100, NO_ALERTS)
    assert second.episodes == 2
    assert history_keys(conn) == set()
    assert [(k, e, n) for k, e, n, *_ in elements(conn, "resolved")] == [("1", 1, 0), ("2", 1, 0)]


def history_keys(conn: Conn) -> set[tuple[str, str]]:
    rows = conn.execute("SELECT rule, key FROM slawatch.episode").fetchall()
    return {(str(r[0]), str(r[1])) for r in rows}


def test_the_episode_prune_walks_episode_ended(conn: Conn) -> None:
    """The batch finds its rows in ended_at order through episode_ended, locks them as it
    goes (LockRows, skipping those held) and deletes them by ctid: no scan of the table."""
    migrate(conn, [])
    conn.execute(
        "INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at,"
        " ended_at) SELECT 'late', g::text, 1, %(t)s, %(t)s, %(t)s,"
        " CASE WHEN mod(g, 10) = 0 THEN NULL ELSE %(t)s + g * interval '1 minute' END"
        " FROM generate_series(1, 20000) g",
        {"t": NOW - timedelta(days=60)},
    )
    conn.execute("ANALYZE slawatch.episode")
    statement = "EXPLAIN (FORMAT JSON) " + queries()["prune_episodes"]
    with conn.transaction(force_rollback=True):
        row = conn.execute(statement, {"cutoff": CUTOFF, "batch": 5000}).fetchone()
    assert row is not None
    tree = nodes(row[0][0]["Plan"])
    scans = {
        (n["Node Type"], n.get("Index Name"))
        for n in tree
        if "Relation Name" in n and n["Node Type"] != "ModifyTable"
    }
    assert scans == {("Index Scan", "episode_ended"), ("Tid Scan", None)}, scans
    assert "LockRows" in {n["Node Type"] for n in tree}


# ---------------------------------------------------------------- acks of alerts in rows

ROWS_RETENTION = timedelta(days=1)
EVERY = timedelta(days=3)  # longer than the window: an alert is old before its #2 is due
ROWS_TABLE = (
    "CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, paid_at timestamptz)"
)


def rowed(conn: Conn) -> ClaimPlan:
    """A paid order ships within an hour, reminded every 3 days, kept in rows."""
    conn.execute(ROWS_TABLE)
    rule = Rule.model_validate(
        {
            "name": "rowed",
            "table": "public.orders",
            "key": "id",
            "deadline": "paid_at",
            "after": "1h",
            "open_when": "status = 'paid'",
            "renotify": {"every": "3d", "max": 3},
            "notify": ["console"],
        }
    )
    migrate(conn, [rule])
    return prepare(conn, rule, outbox="rows")


def fired(conn: Conn) -> list[tuple[str, int, int]]:
    """(key, episode, n) of every firing alert of `rowed` kept in rows."""
    rows = conn.execute(
        "SELECT u.key, u.episode, u.n FROM slawatch.outbox_row r,"
        " unnest(r.keys, r.episodes, r.ns) AS u(key, episode, n)"
        " WHERE r.rule = 'rowed' AND r.kind = 'firing'"
    ).fetchall()
    return sorted((str(k), int(e), int(n)) for k, e, n in rows)


@pytest.mark.parametrize("how", ["dropped", "row by row"])
def test_an_ack_of_an_alert_in_a_row_outlives_its_row_and_still_quiets_the_episode(
    conn: Conn, db: Database, how: str
) -> None:
    """docs/explanation/outbox-rows.md, "Retention": an ack of an alert kept in a row
    keeps no row. Order 1's #1 is acked a day after the window passed it; retention
    then removes its row (its range dropped whole, or row by row beside a pending send
    of another rule that keeps the range), and keeps the ack, which is younger than the
    window. At the episode's next re-notification the claim reads the ack (by rule,
    key and episode; it needs no alert) and writes no #2; order 2, not acked, gets its #2."""
    plan = rowed(conn)
    start = datetime.now(UTC).replace(microsecond=0)
    conn.execute("INSERT INTO orders VALUES (1, 'paid', %(t)s), (2, 'paid', %(t)s)", {"t": start})
    due = start + timedelta(hours=1, minutes=5)
    drain(db, plan, FixedClock(due))
    assert fired(conn) == [("1", 1, 1), ("2", 1, 1)]
    conn.execute("UPDATE slawatch.outbox_send SET status = 'sent'")
    (row_id, place) = conn.execute(
        "SELECT r.id, array_position(r.keys, '1') FROM slawatch.outbox_row r"
    ).fetchone() or (0, 0)
    if how == "row by row":  # another rule's pending send keeps the range from its drop
        conn.execute(
            "WITH w AS (INSERT INTO slawatch.outbox_row (rule, kind, fired_at, after, notifiers,"
            " keys, episodes, ns, severities, deadlines, row_data) VALUES ('other', 'firing',"
            " %(t)s, interval '1 hour',"
            " '{console}', '{x}', '{1}', '{1}', '{warning}', ARRAY[%(t)s::timestamptz],"
            " ARRAY['{}'::jsonb]) RETURNING id)"
            " INSERT INTO slawatch.outbox_send (row_id, notifier, status, next_attempt_at)"
            " SELECT id, 'console', 'pending', %(t)s FROM w",
            {"t": due},
        )
    # The range closes a day in; the ack comes two days in, when #1 is a day past the window.
    (closed,) = conn.execute(
        "SELECT slawatch.history_rotate(%s, %s)", (start + timedelta(days=1), timedelta(hours=1))
    ).fetchone() or (None,)
    assert closed == 1
    acked_at = start + timedelta(days=2)
    got = ack(db, str(-(row_id * 128 + place)), by="ana", comment="", now=acked_at)
    assert (got.alert, got.state) == ("rowed:1:e1:n1", "acknowledged")

    pruned = prune(db, FixedClock(acked_at + timedelta(hours=1)), ROWS_RETENTION)
    assert (pruned.ranges, pruned.rows) == ((1, 0) if how == "dropped" else (0, 1))
    left = conn.execute("SELECT count(*) FROM slawatch.outbox_row WHERE rule = 'rowed'")
    assert left.fetchone() == (0,)
    acks = conn.execute("SELECT rule, key, episode FROM slawatch.ack").fetchall()
    assert acks == [("rowed", "1", 1)]

    drain(db, plan, FixedClock(due + EVERY + timedelta(minutes=1)))
    assert fired(conn) == [("2", 1, 2)]
    # The ack goes by its own age, a window after it was made.
    later = prune(db, FixedClock(acked_at + ROWS_RETENTION + timedelta(hours=1)), ROWS_RETENTION)
    assert (later.acks, later.orphans) == (1, 1)
    assert conn.execute("SELECT count(*) FROM slawatch.ack").fetchone() == (0,)
