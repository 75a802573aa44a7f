"""Giving up on deadlines that stay open: rule ``give_up_after`` (README "Rules").

Without it an open deadline is kept for ever: an event rule's start that never gets
its stop stays an open timer (retention prunes closed timers only), an overdue row
that never closes keeps its open episode in the history (pruned once ended) and is
re-notified for ever when ``renotify`` has no ``max``.

With it, an episode whose due time is more than ``give_up_after`` ago is ended as
abandoned, in one transaction per batch:

- the history row (``slawatch.episode``) gets ``ended_at`` now and ``abandoned``;
- its tracking stops re-notifying: ``next`` cleared on the watched row (inline) or
  the state row (``track: table``); the row keeps its episode's deadline value, so
  it is not a new episode while it stays overdue with that deadline, and when it
  completes the claim or the sweep closes it as ever;
- an event rule's timer is closed (``open`` false, its episode cleared), so
  retention prunes it like any closed timer; a late stop finds nothing open.

Episodes are found through ``episode_open`` (open episodes by due time); the watched
rows through the rule's re-notify index, timers through their own. The cutoff is
``Rule.cutoff`` of ``now - give_up_after``, so with a calendar the history's due
times (working time) and the rows' deadlines agree.
"""

from __future__ import annotations

from datetime import datetime

from psycopg import sql

from slawatch.config.rules import Rule
from slawatch.db import Connection, Database, translate
from slawatch.engine.catalog import table_ident
from slawatch.engine.claim import ClaimPlan, sql_text
from slawatch.engine.migrate import predicates
from slawatch.engine.statetable import state_table

BATCH = 5000  # episodes given up per transaction

_END_EPISODES = """\
UPDATE slawatch.episode h SET ended_at = %(now)s::timestamptz, abandoned = true
 WHERE h.ctid = ANY (ARRAY(
       SELECT e.ctid FROM slawatch.episode e
        WHERE e.due_at < %(before)s::timestamptz AND e.ended_at IS NULL AND e.rule = %(rule)s
        LIMIT %(batch)s
          FOR NO KEY UPDATE SKIP LOCKED))
   AND h.ended_at IS NULL AND h.due_at < %(before)s::timestamptz
RETURNING 1"""

# The rows of open episodes due before the cutoff, through the re-notify index (its
# predicate word for word), locked as the claim locks them; then updated by ctid.
_QUIET_INLINE = """\
WITH old AS (
    SELECT tableoid, ctid FROM {table}
     WHERE {where}
     LIMIT %(batch)s::integer
       FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {table} SET {set}
 WHERE ctid = ANY (ARRAY(SELECT ctid FROM old))
   AND (tableoid, ctid) IN (SELECT tableoid, ctid FROM old)
   AND {where}"""

_QUIET_STATE = """\
UPDATE {state} s SET sw_next = NULL
 WHERE s.ctid = ANY (ARRAY(
       SELECT ctid FROM {state}
        WHERE sw_next IS NOT NULL AND sw_seen < %(before_deadline)s
        LIMIT %(batch)s::integer
          FOR UPDATE SKIP LOCKED))
   AND s.sw_next IS NOT NULL AND s.sw_seen < %(before_deadline)s"""


def quiet_statement(rule: Rule) -> sql.Composed | None:
    """The statement that stops the tracking of ``rule``'s episodes due before the
    cutoff (parameter ``before_deadline``); None when there is nothing to stop (an
    inline rule without ``renotify``: its episodes are never notified again)."""
    if rule.track == "table":
        return sql.SQL(_QUIET_STATE).format(state=state_table(rule))
    seen, nxt = sql.Identifier(rule.seen_column), sql.Identifier(rule.next_column)
    _, again, _ = predicates(rule)
    old = sql.SQL("{} < %(before_deadline)s AND {}").format(seen, sql_text(again))
    if rule.events is not None:
        # The timer closes, its episode with it (as the claim's `closed` leaves a row).
        cleared = sql.SQL("open = false, {} = NULL, {} = NULL, {} = 0").format(
            seen, nxt, sql.Identifier(rule.n_column)
        )
        return sql.SQL(_QUIET_INLINE).format(table=table_ident(rule), where=old, set=cleared)
    if rule.renotify is None:
        return None
    where = sql.SQL("{} IS NOT NULL AND {}").format(nxt, old)
    return sql.SQL(_QUIET_INLINE).format(
        table=table_ident(rule), where=where, set=sql.SQL("{} = NULL").format(nxt)
    )


def give_up_batch(
    conn: Connection, plan: ClaimPlan, now: datetime, batch: int = BATCH
) -> tuple[int, int]:
    """End at most ``batch`` of the rule's episodes due more than ``give_up_after``
    before ``now`` as abandoned, and stop the tracking of at most ``batch`` of them, in
    one transaction: (episodes ended, rows stopped). ``conn`` is an autocommit
    connection."""
    rule = plan.rule
    if rule.give_up_after is None:
        return 0, 0
    before = now - rule.give_up_after
    params = {
        "now": now,
        "rule": rule.name,
        "batch": batch,
        "before": before,
        "before_deadline": plan.to_deadline(rule.cutoff(before)),
    }
    quiet = quiet_statement(rule)
    with translate(f"giving up old episodes of rule {rule.name}"), conn.transaction():
        ended = conn.execute(_END_EPISODES, params).rowcount
        stopped = 0 if quiet is None else conn.execute(quiet, params).rowcount
    return max(ended, 0), max(stopped, 0)


def give_up(
    db: Database, plans: list[ClaimPlan], now: datetime, batch: int = BATCH
) -> dict[str, int]:
    """:func:`give_up_batch` of each rule with ``give_up_after``, batch after batch while
    one comes back full: the episodes abandoned, per rule (those with any)."""
    out: dict[str, int] = {}
    for plan in plans:
        if plan.rule.give_up_after is None:
            continue
        while True:

            def one(conn: Connection, plan: ClaimPlan = plan) -> tuple[int, int]:
                return give_up_batch(conn, plan, now, batch)

            ended, stopped = db.run(f"giving up old episodes of rule {plan.rule.name}", one)
            if ended:
                out[plan.rule.name] = out.get(plan.rule.name, 0) + ended
            if max(ended, stopped) < batch:
                break
    return out
