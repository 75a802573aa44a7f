"""An episode given up (give_up_after) whose history row retention has removed, with
SLAWATCH_OUTBOX=rows (docs/explanation/outbox-rows.md, "Alerted once"): when its row
completes, or its deadline moves on, the rows write its resolved notice as today's
outbox does. Two rules alike on one table, `today` in today's outbox and `rowed` in
rows (tests/integration/test_outbox_rows_claim.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from slawatch.db import Database
from slawatch.engine.abandon import give_up
from slawatch.engine.claim import DrainResult, drain
from slawatch.runtime.maintain import prune
from tests.integration.helpers import Conn, FixedClock
from tests.integration.test_outbox_rows_claim import (
    DUE,
    SWEPT,
    T0,
    H,
    alerts,
    both,
    elements,
    history,
    orders,
    pair,
)
from tests.waiting import lock_waits, wait_until

RETENTION = timedelta(days=7)


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    with Database(dsn, size=2) as d:
        yield d


def test_a_given_up_episode_pruned_from_the_history_gets_its_resolved_notice(
    conn: Conn, db: Database, track: str
) -> None:
    """Given up, then pruned from the history a retention window later: order 1 ships and
    order 2's deadline moves to a time already due (its next episode); each given-up
    episode gets its resolved notice once, to the notifiers it paged, as today's outbox
    writes it. Order 3, still open and given up, gets none."""
    plans = pair(conn, track, resolve=True, give_up_after="1d")
    orders(conn, range(1, 4), T0)
    both(db, plans, DUE)
    given_up = DUE + 2 * 24 * H
    assert give_up(db, list(plans), given_up) == {"today": 3, "rowed": 3}
    pruned_at = given_up + RETENTION + H
    assert prune(db, FixedClock(pruned_at), RETENTION).episodes == 6
    assert history(conn, "rowed") == [] == history(conn, "today")

    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    conn.execute("UPDATE orders SET paid_at = paid_at + interval '1 hour' WHERE id = 2")
    for t in (pruned_at + SWEPT, pruned_at + 2 * SWEPT):
        both(db, plans, t)
    got = elements(conn, "resolved")
    assert [(k, e, n, s, ns) for k, e, n, s, _, _, ns in got] == [
        ("1", 1, 0, "warning", ["console"]),
        ("2", 1, 0, "warning", ["console"]),
    ]
    assert got == alerts(conn, "resolved")
    for t in (pruned_at + 3 * SWEPT, pruned_at + 4 * SWEPT):  # once
        both(db, plans, t)
    assert elements(conn, "resolved") == got == alerts(conn, "resolved")
    assert history(conn, "rowed") == history(conn, "today")


@pytest.mark.parametrize("track", ["inline"])
def test_a_history_row_pruned_while_the_claim_waits_for_it_counts_as_gone(
    conn: Conn, db: Database, dsn: str, track: str
) -> None:
    """Retention deletes the given-up episode's history row while the claim that closes
    its row waits for that row's lock: the claim's snapshot still sees the row, and the
    history's end skips it as deleted; the notice is written all the same."""
    plans = pair(conn, track, resolve=True, give_up_after="1d")
    rowed = plans[1]
    orders(conn, range(1, 2), T0)
    both(db, plans, DUE)
    given_up = DUE + 2 * 24 * H
    give_up(db, list(plans), given_up)
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    done: list[DrainResult] = []
    with psycopg.connect(dsn) as retention:
        retention.execute("DELETE FROM slawatch.episode WHERE rule = 'rowed'")
        claim = threading.Thread(
            target=lambda: done.append(drain(db, rowed, FixedClock(given_up + SWEPT)))
        )
        claim.start()
        try:
            wait_until(lambda: lock_waits(conn) == ["transactionid"], what="the claim waits")
            retention.commit()
        finally:
            claim.join(timeout=60)
    assert done and not claim.is_alive()
    got = elements(conn, "resolved")
    assert [(k, e, n) for k, e, n, *_ in got] == [("1", 1, 0)]
