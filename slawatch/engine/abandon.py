"""Giving up on deadlines that stay open: rule ``give_up_after`` (docs/reference/rules.md).

Without it an open deadline is kept for ever: an event rule's start that never gets
its stop stays an open timer (retention prunes closed timers only), an overdue row
that never closes keeps its open episode in the history (pruned once ended) and is
re-notified for ever when ``renotify`` has no ``max``.

With it, an episode whose due time is more than ``give_up_after`` ago is ended as
abandoned, a batch per statement:

- its tracking stops: on the watched row (inline) or the state row (``track:
  table``) the next notification becomes ``infinity``, which no claim reaches (and
  which marks the episode as given up, so the next run does not find it again); the
  row keeps its episode's deadline value, so it is not a new episode while it stays
  overdue with that deadline, and when it completes the claim or the sweep closes it
  as ever;
- an event rule's timer is closed (``open`` false, its episode cleared), so
  retention prunes it like any closed timer; a late stop finds nothing open;
- its history row (``slawatch.episode``) gets ``ended_at`` now and ``abandoned``.

The episodes are found from the tracking side, through the rule's re-notify index
(the state table's ``sw_next`` index and, for episodes at their cap, the state table
itself), and their history rows by primary key: the history keeps no index of open
episodes. The cutoff is ``Rule.cutoff`` of ``now - give_up_after`` as a value of the
deadline column's type (``ClaimPlan.to_deadline``), so with a calendar the rows'
deadlines and the history's due times (working time) agree.
"""

from __future__ import annotations

from datetime import datetime

from psycopg import sql

from slawatch.db import Connection, Database, translate
from slawatch.engine.catalog import key_columns, rule_table, table_ident
from slawatch.engine.claim import ClaimPlan, sql_text
from slawatch.engine.predicates import predicates
from slawatch.engine.statetable import state_table

BATCH = 5000  # episodes given up per statement

# The open episodes of `old` (sw_key, sw_episode) in the history, each found by its
# primary key and updated by ctid (as outbox.py ends episodes).
_END_EPISODES = """\
), ended AS (
    UPDATE slawatch.episode h SET ended_at = %(now)s::timestamptz, abandoned = true
     WHERE h.ctid = ANY (ARRAY(
           SELECT p.ctid FROM old o CROSS JOIN LATERAL (
                  SELECT e.ctid FROM slawatch.episode e
                   WHERE e.rule = %(rule)s AND e.key = o.sw_key AND e.episode = o.sw_episode
                     AND e.ended_at IS NULL
                     FOR NO KEY UPDATE) p))
       AND h.ended_at IS NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM old), (SELECT count(*) FROM ended)"""

# Inline (and event rules' timers): the rows of open episodes due before the cutoff,
# through the re-notify index (its predicate word for word), locked as the claim
# locks them, then updated by ctid.
_INLINE = """\
WITH old AS (
    SELECT tableoid, ctid, {key} AS sw_key, {ep} AS sw_episode FROM {table}
     WHERE {where}
     LIMIT %(batch)s::integer
       FOR NO KEY UPDATE SKIP LOCKED
), stopped AS (
    UPDATE {table} SET {set}
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM old))
       AND (tableoid, ctid) IN (SELECT tableoid, ctid FROM old)
       AND {where}
    RETURNING 1
"""

_STATE = """\
WITH old AS (
    SELECT {keys}, {key} AS sw_key, s.sw_ep AS sw_episode FROM {state} s
     WHERE s.sw_seen < %(before_deadline)s
       AND (s.sw_next < 'infinity' OR s.sw_next IS NULL)
     LIMIT %(batch)s::integer
       FOR UPDATE SKIP LOCKED
), stopped AS (
    UPDATE {state} s SET sw_next = 'infinity'
      FROM old o
     WHERE {s_is_o} AND s.sw_ep = o.sw_episode
    RETURNING 1
"""


def give_up_statement(plan: ClaimPlan, key: list[str]) -> sql.Composed:
    """The statement that gives up a batch of the rule's episodes due before the
    cutoff (parameter ``before_deadline``): one row (episodes found, history rows
    ended)."""
    rule = plan.rule

    def key_text(alias: str | None) -> sql.Composable:
        cols = [sql.Identifier(alias, c) if alias else sql.Identifier(c) for c in key]
        if len(cols) == 1:
            return sql.SQL("{}::text").format(cols[0])
        return sql.SQL("ROW({})::text").format(sql.SQL(", ").join(cols))

    if rule.track == "table":
        head = sql.SQL(_STATE).format(
            keys=sql.SQL(", ").join(sql.Identifier("s", c) for c in key),
            key=key_text("s"),
            state=state_table(rule),
            s_is_o=sql.SQL(" AND ").join(
                sql.SQL("s.{c} = o.{c}").format(c=sql.Identifier(c)) for c in key
            ),
        )
        return sql.Composed([head, sql.SQL(_END_EPISODES)])
    seen, nxt = sql.Identifier(rule.seen_column), sql.Identifier(rule.next_column)
    _, again, _ = predicates(rule)
    where = sql.SQL("{} < %(before_deadline)s AND {}").format(seen, sql_text(again))
    if rule.events is not None:
        # The timer closes, its episode with it (as the claim's `closed` leaves a row).
        done: sql.Composable = sql.SQL("open = false, {} = NULL, {} = NULL, {} = 0").format(
            seen, nxt, sql.Identifier(rule.n_column)
        )
    else:
        # Not yet given up: a re-notification scheduled, or none (at the cap).
        where = sql.SQL("{} AND ({} < 'infinity' OR {} IS NULL)").format(where, nxt, nxt)
        done = sql.SQL("{} = 'infinity'").format(nxt)
    head = sql.SQL(_INLINE).format(
        key=key_text(None),
        ep=sql.Identifier(rule.episode_column),
        table=table_ident(rule),
        where=where,
        set=done,
    )
    return sql.Composed([head, sql.SQL(_END_EPISODES)])


def give_up_batch(
    conn: Connection, plan: ClaimPlan, now: datetime, batch: int = BATCH
) -> tuple[int, int]:
    """Give up at most ``batch`` of the rule's episodes due more than ``give_up_after``
    before ``now``, in one statement: (episodes found, history rows ended as
    abandoned)."""
    rule = plan.rule
    if rule.give_up_after is None:
        return 0, 0
    before = now - rule.give_up_after
    with translate(f"giving up old episodes of rule {rule.name}"):
        info = rule_table(conn, rule)
        if info is None:
            return 0, 0
        row = conn.execute(
            give_up_statement(plan, key_columns(rule, info)),
            {
                "now": now,
                "rule": rule.name,
                "batch": batch,
                "before_deadline": plan.to_deadline(rule.cutoff(before)),
            },
        ).fetchone()
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def give_up(
    db: Database, plans: list[ClaimPlan], now: datetime, batch: int = BATCH
) -> dict[str, int]:
    """:func:`give_up_batch` of each rule with ``give_up_after``, batch after batch while
    one comes back full: the episodes ended as abandoned, per rule (those with any)."""
    out: dict[str, int] = {}
    for plan in plans:
        if plan.rule.give_up_after is None:
            continue
        while True:

            def one(conn: Connection, plan: ClaimPlan = plan) -> tuple[int, int]:
                return give_up_batch(conn, plan, now, batch)

            found, ended = db.run(f"giving up old episodes of rule {plan.rule.name}", one)
            if ended:
                out[plan.rule.name] = out.get(plan.rule.name, 0) + ended
            if found < batch:
                break
    return out
