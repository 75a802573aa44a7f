"""The outbox in rows' lease as a function (0025_lease_row_send.sql): behind PgBouncer in
transaction mode, where nothing is prepared, each lease is a call of
slawatch.lease_row_send, whose statement its server session plans once; and the
function's own settings (its generic plan, no JIT) and the lease's asynchronous commit
stay with its call: the pooled connection's next statements see its own settings."""

from __future__ import annotations

from collections import Counter

import psycopg

from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_notifier, lease_row_send
from tests.integration.helpers import Conn, FixedClock, shop
from tests.integration.test_outage import wait_for
from tests.integration.test_outbox_rows_deliver import NOW, hook, insert_row
from tests.integration.test_pgbouncer import PgBouncer, bouncer, cluster, fresh_database
from tests.pgcluster import PgCluster
from tests.receivers import WebhookReceiver

__all__ = ["bouncer", "cluster"]


def lease_calls(direct: str) -> int:
    """Calls of slawatch.lease_row_send in every session (track_functions = 'pl')."""
    with psycopg.connect(direct, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(sum(calls), 0) FROM pg_stat_user_functions"
            " WHERE schemaname = 'slawatch' AND funcname = 'lease_row_send'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_rows_through_pgbouncer_lease_by_the_function_and_send_each_alert_once(
    cluster: PgCluster, bouncer: PgBouncer, receiver: WebhookReceiver
) -> None:
    direct, via = fresh_database(cluster, bouncer)
    with psycopg.connect(direct, autocommit=True) as conn:
        shop(conn)  # DDL straight to the server; the delivery goes through pgbouncer
        conn.execute("ALTER SYSTEM SET track_functions = 'pl'")
        conn.execute("SELECT pg_reload_conf()")
        rows = [insert_row(conn, [f"{r}-{k}" for k in range(3)]) for r in range(12)]
    try:
        notifier = hook(receiver.url, batch=3)
        try:
            with Database(via, size=2, timeout=10, pooler="transaction") as db:
                clock = FixedClock(NOW)
                result = deliver_notifier(db, notifier, clock)
                while result.sent:
                    result = deliver_notifier(db, notifier, clock)
                assert not db.prepared_statements
        finally:
            notifier.close()
        counts = Counter(receiver.alert_ids)
        assert len(counts) == 36
        assert {i: n for i, n in counts.items() if n > 1} == {}
        with psycopg.connect(direct, autocommit=True) as conn:
            statuses = conn.execute(
                "SELECT status, count(*) FROM slawatch.outbox_send WHERE row_id = ANY(%s)"
                " GROUP BY status",
                (rows,),
            ).fetchall()
        assert statuses == [("sent", 12)]
        # Every lease a call (12 that took a send, one more that found none due): the
        # statement planned in the function's session, not sent as text each time. The
        # sessions report their counts once idle.
        wait_for(lambda: lease_calls(direct) >= 13, "13 calls of slawatch.lease_row_send")
    finally:
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET track_functions")
            conn.execute("SELECT pg_reload_conf()")


def test_the_lease_keeps_its_settings_to_its_call(conn: Conn, dsn: str) -> None:
    """The function's generic plan and no JIT hold for its call, the asynchronous commit for
    the lease's transaction: the next statement on the connection has the connection's
    own settings."""
    shop(conn)
    insert_row(conn, ["1", "2"])
    settings = "SELECT current_setting('plan_cache_mode'), current_setting('jit'),"
    settings += " current_setting('synchronous_commit')"
    with Database(dsn, size=1, timeout=10) as db:
        before = db.run("settings", lambda c: c.execute(settings).fetchone())
        leased = lease_row_send(db, hook("http://127.0.0.1:9/unused"), NOW)
        assert leased.row_id is not None
        assert leased.keys == ["1", "2"]
        after = db.run("settings", lambda c: c.execute(settings).fetchone())
    assert before == after
    assert after is not None and after[0] == "auto" and after[2] == "on"
