"""The outbox in id ranges: converting a database's alert and delivery tables into
partitioned ones, in bounded, resumable steps (``slawatch migrate``).

0015_rotate.sql adds the partitioned tables beside the old ones
(``alert_rotating``, ``delivery_rotating``), the record of the ranges
(``slawatch.history_range``) and of the conversion (``slawatch.history_convert``).
:func:`convert` then, each step its own transaction:

1. reads the old alerts' days (one read of the table, no lock but ACCESS SHARE) and,
   in one short transaction that locks the old tables against writes while it runs,
   installs the mirror triggers (every write to the old tables is made to the new
   ones too), records how far the old ids go, and makes one range per day of the old
   history plus the open range after it;
2. copies the old rows in batches by id (``BATCH`` ids per transaction), each batch
   with its progress, so a killed migrate goes on where the last commit left it;
3. swaps the names in one transaction (ACCESS EXCLUSIVE on the old tables, with a
   lock_timeout, retried): the old tables are dropped, the new ones take their names,
   constraints, indexes, grants and identity sequences' positions, and the webhook
   action trigger moves to the new delivery table.

A database whose old tables are empty (a fresh ``migrate``) is converted in one
transaction instead (``slawatch.history_convert_all``, what ``migrate --print`` runs):
the same ranges and names, with no trigger, no batch and no separate swap.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from psycopg import sql

from slawatch.clock import Clock
from slawatch.db import LOCK_NOT_AVAILABLE, Connection, sqlstate, translate
from slawatch.errors import DatabaseError

log = logging.getLogger(__name__)

SPAN = 1 << 32  # ids per range: more than any rotation period draws
BATCH = 50_000  # ids per copy transaction
SWAP_TRIES = 20  # tries of the swap's lock (each waits at most LOCK_TIMEOUT)
LOCK_TIMEOUT = "5s"

# The names the partitioned tables take at the swap: (old, new) of constraints and indexes.
# (delivery_rotating_id is gone before any swap: 0018_lean_outbox.sql dropped it.)
_RENAMES = {
    "alert": [
        ("CONSTRAINT", "alert_rotating_pkey", "alert_pkey"),
        ("CONSTRAINT", "alert_rotating_kind", "alert_kind"),
        ("INDEX", "alert_rotating_rule_fired", "alert_rule_fired"),
        ("SEQUENCE", "alert_rotating_id_seq", "alert_id_seq"),
    ],
    "delivery": [
        ("CONSTRAINT", "delivery_rotating_once", "delivery_once"),
        ("CONSTRAINT", "delivery_rotating_status", "delivery_status"),
        ("INDEX", "delivery_rotating_summary", "delivery_summary"),
        ("INDEX", "delivery_rotating_due", "delivery_due"),
        ("INDEX", "delivery_rotating_dead", "delivery_dead"),
        ("INDEX", "delivery_rotating_orphaned", "delivery_orphaned"),
        ("SEQUENCE", "delivery_rotating_id_seq", "delivery_id_seq"),
    ],
}

_COLUMNS = {
    "alert": "id, rule, key, episode, n, severity, deadline, due_at, fired_at, row_data, kind",
    "delivery": "id, alert_id, notifier, status, attempts, next_attempt_at, lease_owner,"
    " lease_expires_at, last_error, sent_at, summary_id",
}
_CONFLICT = {"alert": "(id)", "delivery": "ON CONSTRAINT delivery_rotating_once"}

_DAYS = """\
SELECT min(id), max(fired_at) FROM slawatch.alert
 GROUP BY date_trunc('day', fired_at, 'UTC') ORDER BY 1"""

_ACTION_TRIGGER = """\
CREATE TRIGGER action_settled
    AFTER UPDATE OF status ON slawatch.delivery
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.notifier LIKE 'action:%')
    EXECUTE FUNCTION slawatch.action_delivery_settled()"""


def pending(conn: Connection) -> bool:
    """The outbox is not partitioned yet (0015_rotate.sql not applied, or its
    conversion not finished)."""
    with translate("reading the outbox's conversion"):
        row = conn.execute(
            "SELECT to_regclass('slawatch.history_convert') IS NULL"
            " OR to_regclass('slawatch.alert_rotating') IS NOT NULL"
        ).fetchone()
    return bool(row and row[0])


def convert(
    conn: Connection, clock: Clock | None = None, batch: int = BATCH, *, at_once: bool = True
) -> int:
    """Bring the conversion to its end from wherever it is; the rows copied by this call.

    ``conn`` is in autocommit mode: every step commits on its own. Safe to interrupt
    at any point (a SIGKILL included) and run again. ``at_once``: an empty outbox in
    one transaction (False: by the steps, as a large one; bench/migrate_fresh.py).
    """
    now = (clock or Clock()).now()
    if not pending(conn):
        return 0
    with translate("converting the outbox: reading its progress"):
        row = conn.execute("SELECT 1 FROM slawatch.history_convert").fetchone()
    if row is None and at_once and _empty(conn) and _convert_empty(conn, now):
        return 0
    if row is None:
        _prepare(conn, now)
    copied = _copy(conn, "alert", batch) + _copy(conn, "delivery", batch)
    _swap(conn, now)
    return copied


_EMPTY = """\
SELECT NOT EXISTS (SELECT 1 FROM slawatch.alert)
   AND NOT EXISTS (SELECT 1 FROM slawatch.delivery)
   AND NOT EXISTS (SELECT 1 FROM slawatch.history_convert)"""


def _empty(conn: Connection) -> bool:
    """The old tables hold no row and no conversion has started (a fresh database)."""
    with translate("converting the outbox: reading whether it is empty"):
        row = conn.execute(_EMPTY).fetchone()
    return bool(row and row[0])


def _convert_empty(conn: Connection, now: datetime) -> bool:
    """An empty outbox converted in one transaction (``slawatch.history_convert_all``:
    the same ranges, names and grants as the steps, nothing to copy); False, changing
    nothing, when a row came meanwhile or the old tables stay busy past the
    lock_timeout: then the steps, whose locks hold writers back only briefly."""
    try:
        with translate("converting the outbox"), conn.transaction():
            _locked(conn)
            conn.execute("LOCK TABLE slawatch.alert, slawatch.delivery IN ACCESS EXCLUSIVE MODE")
            if not _empty(conn):
                return False
            conn.execute("SELECT slawatch.history_convert_all(%s)", (now,))
    except DatabaseError as exc:  # a lock not granted in time: running claims
        if sqlstate(exc) != LOCK_NOT_AVAILABLE:
            raise
        return False
    log.info("converting the outbox: empty, converted in one transaction")
    return True


def _locked(conn: Connection) -> None:
    conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))


def _prepare(conn: Connection, now: datetime) -> None:
    """Step 1: the old history's days (read before any lock), then the triggers, the
    record and the ranges in one transaction."""
    with translate("converting the outbox: reading the old alerts' days"):
        days = conn.execute(_DAYS).fetchall()
    with translate("converting the outbox: mirroring the old tables"), conn.transaction():
        _locked(conn)
        conn.execute("LOCK TABLE slawatch.alert, slawatch.delivery IN SHARE ROW EXCLUSIVE MODE")
        if conn.execute("SELECT 1 FROM slawatch.history_convert").fetchone():
            return  # another migrate did it meanwhile (it held the migrate lock?)
        for table in ("alert", "delivery"):
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER history_mirror AFTER INSERT OR UPDATE OR DELETE"
                    " ON slawatch.{} FOR EACH ROW EXECUTE FUNCTION slawatch.{}()"
                ).format(sql.Identifier(table), sql.Identifier(f"history_mirror_{table}"))
            )
        top = conn.execute(
            "SELECT (SELECT coalesce(max(id), 0) FROM slawatch.alert),"
            " (SELECT coalesce(max(id), 0) FROM slawatch.delivery)"
        ).fetchone()
        assert top is not None
        alert_upto, delivery_upto = int(top[0]), int(top[1])
        conn.execute(
            "INSERT INTO slawatch.history_convert (started_at, alert_upto, delivery_upto)"
            " VALUES (%s, %s, %s)",
            (now, alert_upto, delivery_upto),
        )
        # One range per day of the old history, closed at the day's newest alert (at
        # the latest, now); the open range from the next id to the next SPAN.
        lows = sorted({int(low) for low, _ in days if int(low) <= alert_upto})
        newest = [fired for low, fired in days if int(low) <= alert_upto]
        n = 0
        for i, low in enumerate(lows):
            high = lows[i + 1] if i + 1 < len(lows) else alert_upto + 1
            closed = min(max(newest[: i + 1]), now)
            conn.execute(
                "SELECT slawatch.history_open(%s, %s, %s, %s)", (n, 0 if i == 0 else low, high, now)
            )
            conn.execute(
                "UPDATE slawatch.history_range SET closed_at = %s WHERE n = %s", (closed, n)
            )
            n += 1
        low = alert_upto + 1 if lows else 0
        high = (alert_upto // SPAN + 1) * SPAN
        conn.execute("SELECT slawatch.history_open(%s, %s, %s, %s)", (n, low, high, now))
        # The open range takes the outbox's rows too (0026_outbox_rows_ranges.sql; not
        # there when a test stands in an older release's migrations).
        if conn.execute("SELECT to_regproc('slawatch.history_rows_open')").fetchone() != (None,):
            conn.execute("SELECT slawatch.history_rows_open()")
    log.info("converting the outbox: %s old alerts in %s day ranges to copy", alert_upto, n)


def _copy(conn: Connection, table: str, batch: int) -> int:
    """Step 2: the old rows of ``table`` up to the recorded id, a batch per transaction
    with its progress; the rows inserted."""
    total = 0
    columns = sql.SQL(_COLUMNS[table])
    statement = sql.SQL(
        "INSERT INTO slawatch.{new} ({columns}) OVERRIDING SYSTEM VALUE"
        " SELECT {columns} FROM slawatch.{old} WHERE id > %(done)s AND id <= %(to)s"
        " ON CONFLICT {conflict} DO NOTHING"
    ).format(
        new=sql.Identifier(f"{table}_rotating"),
        old=sql.Identifier(table),
        columns=columns,
        conflict=sql.SQL(_CONFLICT[table]),
    )
    progress = sql.SQL("UPDATE slawatch.history_convert SET {done} = %(to)s").format(
        done=sql.Identifier(f"{table}_done")
    )
    read = sql.SQL("SELECT {done}, {upto} FROM slawatch.history_convert").format(
        done=sql.Identifier(f"{table}_done"), upto=sql.Identifier(f"{table}_upto")
    )
    while True:
        with translate(f"converting the outbox: copying {table} rows"), conn.transaction():
            row = conn.execute(read).fetchone()
            assert row is not None
            done, upto = int(row[0]), int(row[1])
            if done >= upto:
                return total
            to = min(done + batch, upto)
            total += conn.execute(statement, {"done": done, "to": to}).rowcount
            conn.execute(progress, {"to": to})
        log.info("converting the outbox: %s ids %s of %s copied", table, to, upto)


def _swap(conn: Connection, now: datetime) -> None:
    """Step 3: the new tables take the old ones' places, in one transaction."""
    for attempt in range(SWAP_TRIES):
        try:
            with translate("converting the outbox: swapping the tables"), conn.transaction():
                _locked(conn)
                _swap_now(conn, now)
            return
        except Exception as exc:  # a lock not granted in time: running claims; again
            if sqlstate(exc) != LOCK_NOT_AVAILABLE or attempt + 1 == SWAP_TRIES:
                raise
            log.info("converting the outbox: the old tables are busy; trying the swap again")
            time.sleep(0.5)


def _swap_now(conn: Connection, now: datetime) -> None:
    conn.execute("LOCK TABLE slawatch.alert, slawatch.delivery IN ACCESS EXCLUSIVE MODE")
    if conn.execute("SELECT to_regclass('slawatch.alert_rotating')").fetchone() == (None,):
        return  # done meanwhile
    left = conn.execute(
        "SELECT alert_done < alert_upto OR delivery_done < delivery_upto"
        " FROM slawatch.history_convert"
    ).fetchone()
    if left is None or left[0]:
        raise RuntimeError("the outbox's copy is not complete; run slawatch migrate again")
    for table in ("alert", "delivery"):
        old, new = sql.Identifier(table), sql.Identifier(f"{table}_rotating")
        # The old table's grants, given again on the new one.
        for grantee, privilege, grantable in conn.execute(
            "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END,"
            " a.privilege_type, a.is_grantable"
            " FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a"
            " WHERE c.oid = %s::regclass AND a.grantee <> c.relowner",
            (f"slawatch.{table}",),
        ).fetchall():
            who = sql.SQL("PUBLIC") if grantee == "PUBLIC" else sql.Identifier(grantee)
            conn.execute(
                sql.SQL("GRANT {} ON slawatch.{} TO {}{}").format(
                    sql.SQL(privilege),
                    new,
                    who,
                    sql.SQL(" WITH GRANT OPTION" if grantable else ""),
                )
            )
        last = conn.execute(
            "SELECT pg_sequence_last_value(pg_get_serial_sequence(%s, 'id')::regclass)",
            (f"slawatch.{table}",),
        ).fetchone()
        conn.execute(sql.SQL("DROP TABLE slawatch.{}").format(old))
        conn.execute(sql.SQL("ALTER TABLE slawatch.{} RENAME TO {}").format(new, old))
        for kind, was, name in _RENAMES[table]:
            what = (
                sql.SQL("ALTER TABLE slawatch.{} RENAME CONSTRAINT {} TO {}").format(
                    old, sql.Identifier(was), sql.Identifier(name)
                )
                if kind == "CONSTRAINT"
                else sql.SQL("ALTER {} slawatch.{} RENAME TO {}").format(
                    sql.SQL(kind), sql.Identifier(was), sql.Identifier(name)
                )
            )
            conn.execute(what)
        if last and last[0] is not None:
            conn.execute(
                "SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)",
                (f"slawatch.{table}", int(last[0])),
            )
    conn.execute(_ACTION_TRIGGER)
    conn.execute("UPDATE slawatch.history_convert SET swapped_at = %s", (now,))
    log.info("converting the outbox: the partitioned tables are slawatch.alert and .delivery")


def rotate_every(retention: timedelta) -> timedelta:
    """How long a range stays open: a seventh of the retention, at least an hour. So
    about eight ranges are kept whatever the window (a lookup by delivery id alone
    probes each), and an alert stays at most a seventh longer than the window."""
    return max(timedelta(hours=1), retention / 7)
