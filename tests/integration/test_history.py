"""Episode history (slawatch.episode, docs/how-to/report.md): one row per episode, written when
its first notification is claimed, acknowledged by an ack, ended where the episode
ends (closed by a claim or a sweep, or replaced by the next episode)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from slawatch.db import Database
from slawatch.operate.lifecycle import ack
from tests.integration.helpers import Conn, claim_all, plans, shop

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
S = timedelta(seconds=1)
DUE = T0 + 48 * H  # order_unshipped: 48 h after paid_at


def history(conn: Conn) -> list[tuple[Any, ...]]:
    """(key, episode, deadline, due_at, notified_at, acked_at, acked_by, ended_at)."""
    return conn.execute(
        "SELECT key, episode, deadline, due_at, notified_at, acked_at, acked_by, ended_at"
        " FROM slawatch.episode WHERE rule = 'order_unshipped' ORDER BY key, episode"
    ).fetchall()


def test_an_episode_is_recorded_at_its_first_notice_its_ack_and_its_end(
    conn: Conn, db: Database, track: str
) -> None:
    plan = plans(conn, shop(conn, track))["order_unshipped"]
    conn.execute("INSERT INTO orders VALUES (1, 7, 100, 'paid', %s)", (T0,))
    assert claim_all(conn, plan, DUE - S) == 0
    assert history(conn) == []
    assert claim_all(conn, plan, DUE + S) == 1
    assert history(conn) == [("1", 1, T0, DUE, DUE + S, None, None, None)]
    # A re-notification is not a new episode.
    assert claim_all(conn, plan, DUE + 6 * H + 2 * S) == 1
    assert len(history(conn)) == 1
    got = ack(db, "order_unshipped:1:e1:n2", by="ann", comment="", now=DUE + 7 * H)
    assert got.state == "acknowledged"
    # A second ack keeps the first.
    ack(db, "order_unshipped:1:e1:n2", by="bob", comment="", now=DUE + 8 * H)
    assert history(conn) == [("1", 1, T0, DUE, DUE + S, DUE + 7 * H, "ann", None)]
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    # track: table closes an episode at its re-notification time (or its sweep).
    ends = DUE + 13 * H
    claim_all(conn, plan, ends)
    assert history(conn) == [("1", 1, T0, DUE, DUE + S, DUE + 7 * H, "ann", ends)]
    # Ended once: a later claim leaves it.
    claim_all(conn, plan, ends + 24 * H)
    assert history(conn)[0][-1] == ends


def test_a_deadline_moved_into_the_past_ends_one_episode_as_the_next_starts(
    conn: Conn, track: str
) -> None:
    plan = plans(conn, shop(conn, track))["order_unshipped"]
    conn.execute("INSERT INTO orders VALUES (1, 7, 100, 'paid', %s)", (T0,))
    assert claim_all(conn, plan, DUE + S) == 1
    # Paid again an hour later: a new deadline value, already due.
    conn.execute("UPDATE orders SET paid_at = %s WHERE id = 1", (T0 + H,))
    now = DUE + 2 * H
    assert claim_all(conn, plan, now) == 1
    assert history(conn) == [
        ("1", 1, T0, DUE, DUE + S, None, None, now),
        ("1", 2, T0 + H, DUE + H, now, None, None, None),
    ]


@pytest.mark.parametrize("track", ["table"])
def test_the_sweep_ends_the_episodes_it_closes(conn: Conn, track: str) -> None:
    """track: table: an episode whose row completed is closed by the sweep too (no
    re-notification comes due: renotify capped at 1 here)."""
    rule = shop(conn, track)["order_unshipped"]
    rule = rule.model_copy(update={"renotify": None})
    plan = plans(conn, {rule.name: rule})[rule.name]
    conn.execute("INSERT INTO orders VALUES (1, 7, 100, 'paid', %s)", (T0,))
    assert claim_all(conn, plan, DUE + S) == 1
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    later = DUE + S + rule.sweep + S
    claim_all(conn, plan, later)
    assert history(conn)[0][-1] == later


@pytest.mark.parametrize("track", ["table"])
def test_a_table_claim_ends_the_episode_it_closes_between_sweeps(conn: Conn, track: str) -> None:
    """track: table: an episode found ended at its re-notification time, by the claim
    itself (the sweep ran seconds before and is not due)."""
    plan = plans(conn, shop(conn, track))["order_unshipped"]
    conn.execute("INSERT INTO orders VALUES (1, 7, 100, 'paid', %s)", (T0,))
    assert claim_all(conn, plan, DUE + S) == 1
    assert claim_all(conn, plan, DUE + 6 * H) == 0  # sweeps; #2 is due at DUE + 6 h + 1 s
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    claim_all(conn, plan, DUE + 6 * H + 2 * S)
    assert history(conn)[0][-1] == DUE + 6 * H + 2 * S
