"""The outbox half of a claim statement, the same for both ways to track.

It follows a CTE ``claimed`` of (key, episode, n, deadline, row_data): each row
becomes an alert and one delivery per notifier, in the claim's transaction.
``{severity}`` and ``{notify}`` are the rule's (by notification number, for
escalation: they may read ``c.n`` and ``a.n``).
"""

from __future__ import annotations

from psycopg import sql

_OUTBOX = """\
), alerts AS (
    INSERT INTO slawatch.alert (rule, key, episode, n, severity, deadline, due_at, fired_at,
                                row_data)
    SELECT %(rule)s, c.key, c.episode, c.n, {severity}, c.deadline,
           c.deadline + %(after)s::interval, %(now)s::timestamptz, c.row_data
      FROM claimed c
    -- At most once, and a notification that exists already (tracking state restored
    -- from a backup, an upgrade cut short) is not an error that would stop the rule.
    ON CONFLICT ON CONSTRAINT alert_once DO NOTHING
    RETURNING id, n
), deliveries AS (
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT a.id, x.notifier, %(now)s::timestamptz
      FROM alerts a, unnest({notify}) AS x(notifier)
    RETURNING 1
)"""


def outbox(severity: sql.Composable, notify: sql.Composable) -> sql.Composed:
    """The ``alerts`` and ``deliveries`` CTEs for a rule's severity and notifiers."""
    return sql.SQL(_OUTBOX).format(severity=severity, notify=notify)
