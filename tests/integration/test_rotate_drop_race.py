"""A delivery replayed while retention drops its id range is kept: slawatch.history_drop
(0019_history_drop_locked.sql) locks a range that looks droppable and reads it again; a
`slawatch replay` of one of the range's dead deliveries that committed while the DROP
waited for its lock keeps the range. Before 0019 the check ran before the lock, and the
replayed delivery was dropped with the range though replay had counted it.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg

from slawatch.engine.migrate import migrate
from tests.integration.helpers import Conn, history
from tests.waiting import wait_until

DAY = timedelta(days=1)


def test_a_delivery_replayed_while_its_range_is_dropped_is_kept(conn: Conn, dsn: str) -> None:
    migrate(conn, [])
    start = datetime.now(UTC)
    old = history(conn, start, "dead", notifier="hook")  # range 0
    rotated = conn.execute(
        "SELECT slawatch.history_rotate(%s, %s)", (start + DAY, timedelta(hours=1))
    ).fetchone()
    assert rotated == (1,)
    dropped: list[list[tuple[object, ...]]] = []
    with psycopg.connect(dsn) as replay:
        # A replay in flight: the dead delivery back to pending, not committed yet.
        replay.execute(
            "UPDATE slawatch.delivery SET status = 'pending', attempts = 0 WHERE alert_id = %s",
            (old,),
        )

        pids: list[int] = []

        def drop() -> None:
            with psycopg.connect(dsn, autocommit=True) as c:
                pids.append(c.info.backend_pid)
                dropped.append(
                    c.execute(
                        "SELECT * FROM slawatch.history_drop(%s)", (start + 10 * DAY,)
                    ).fetchall()
                )

        dropping = threading.Thread(target=drop)
        dropping.start()
        wait_until(
            lambda: (
                bool(pids)
                and conn.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pids[0],)
                ).fetchone()
                == ("Lock",)
            ),
            "the drop to wait for the replay's lock",
        )
        replay.commit()
        dropping.join(30)
    assert dropped == [[]]  # range 0 kept: it holds a pending delivery
    assert conn.execute(
        "SELECT status FROM slawatch.delivery WHERE alert_id = %s", (old,)
    ).fetchall() == [("pending",)]
