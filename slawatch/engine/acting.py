"""The claim's half of a rule's action (docs/explanation/actions.md): which of the alerts
a claim wrote owe their action, with the values its placeholders are bound to.

A rule with an action claims in a transaction instead of one autocommit
statement: the claim statement also returns, as one JSON column, the alerts it
actually inserted (``alert_once`` keeps a concurrent claimer's out) whose number
is the action's ``on``; the plan's ``act`` (slawatch/actions/run.py) runs and
records them on the same connection before the commit. So an alert exists
exactly when its action was attempted, and a crash before the commit leaves
neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from slawatch.config.rules import Rule
from slawatch.db import Connection
from slawatch.engine.outbox import MAX_DATA, TRUNCATED, row_cap

# The column a claim statement with an action ends with (after the counts): one JSON
# array [key, episode, n, [placeholder values], skip] per alert owing its action. An
# episode whose action already has an attempt is left out: one action per episode, even
# when the rule's `on` or action changed after it acted. Why this shape (json arrays,
# guarded lookups, hashed NOT IN): docs/performance-notes.md.
_DUE = """,
       (SELECT coalesce(json_agg(json_build_array(
                a.key, a.episode, a.n, json_build_array({params}),
                CASE WHEN (SELECT EXISTS (SELECT 1 FROM slawatch.ack WHERE rule = %(rule)s))
                      AND EXISTS (SELECT 1 FROM slawatch.ack k
                                   WHERE k.rule = %(rule)s AND k.key = a.key
                                     AND k.episode = a.episode) THEN 'acknowledged'
                     WHEN (SELECT EXISTS (SELECT 1 FROM slawatch.silence
                                           WHERE rule = %(rule)s
                                             AND ends_at > %(now)s::timestamptz))
                      AND EXISTS (SELECT 1 FROM slawatch.silence s
                                   WHERE s.rule = %(rule)s AND s.ends_at > %(now)s::timestamptz
                                     AND s.starts_at <= %(now)s::timestamptz
                                     AND (s.key IS NULL OR s.key = a.key)
                                     AND a.row_data @> s.matchers) THEN 'silenced'{truncated} END)
                ORDER BY a.key), '[]'::json)
          FROM alerts a
         WHERE a.n = %(action_on)s::integer
           AND (a.key, a.episode) NOT IN (
                SELECT x.key, x.episode FROM slawatch.action x
                 WHERE x.rule = %(rule)s
                   AND x.key = ANY (ARRAY(SELECT b.key FROM alerts b
                                           WHERE b.n = %(action_on)s::integer))
                   -- not every attempt of a recurring key: its episodes of this batch
                   AND x.episode = ANY (ARRAY(SELECT b.episode FROM alerts b
                                               WHERE b.n = %(action_on)s::integer))))"""


# Why an action was not run: the alert's row data was over the bound, and the row
# the alert carries lacks a column its placeholders read (docs/reference/rules.md).
TOO_BIG = f"row data over {MAX_DATA:,} bytes (docs/reference/rules.md, columns)"


@dataclass(frozen=True)
class Due:
    """An action a claim owes: the alert it is for, and its placeholders' values (as
    text: PostgreSQL reads each as the type its place in the statement needs).
    ``skip``: "acknowledged" or "silenced" when the episode is not to be acted on."""

    key: str
    episode: int
    n: int
    params: dict[str, str | None]
    skip: str | None = None
    attempt: int = 1  # a later one: an attempt recorded 'retry', run again (actions/run.py)


# Runs and records a claim's due actions on its connection, inside its transaction.
Act = Callable[[Connection, Rule, list[Due], datetime], None]


def due_column(rule: Rule, key: list[str]) -> sql.Composable:
    """The final column of ``rule``'s claim statement (empty for a rule without an
    action): the alerts of the claim that owe the action, as a JSON array.

    It reads the CTE ``alerts`` (with key, episode and row_data returned: the rows the
    claim inserted, ``alert_once`` keeping out another claimer's), which both claim
    statements have; not ``claimed`` (a join of two CTEs of a batch each is planned as
    a nested loop: a million comparisons for a batch of 1,000).
    """
    if rule.action is None:
        return sql.SQL("")
    columns = rule.alert_columns(key)
    values = [
        sql.SQL("a.row_data ->> {}").format(sql.Literal(name))
        if name in columns
        else sql.SQL("a.key")  # a one-column key (Rule.action_columns)
        for name in rule.action.placeholders
    ]
    # A row over the bound keeps its key's columns alone, or not even those when they are
    # over it too (outbox.capped): an action whose placeholders read a column the alert's
    # row lacks then is recorded skipped (and logged: actions/run.py), not run with NULL
    # in its place. A one-column key not in `columns` is read from the alert's key,
    # which is never cut. Only a replaced row is looked into (TRUNCATED's field).
    read = [name for name in rule.action.placeholders if name in columns]
    truncated: sql.Composable = sql.SQL("")
    if row_cap(rule, key) is not None and read:
        truncated = sql.SQL(
            "\n                     WHEN a.row_data ? {} AND NOT a.row_data ?& {}::text[] THEN {}"
        ).format(sql.Literal(TRUNCATED), sql.Literal(read), sql.Literal(TOO_BIG))
    return sql.SQL(_DUE).format(params=sql.SQL(", ").join(values), truncated=truncated)


def parse_due(value: Any, rule: Rule) -> list[Due]:
    """The due column of ``rule``'s claim as read back (psycopg reads json into lists):
    each alert's placeholder values named as the action's placeholders, in order."""
    names = rule.action.placeholders if rule.action is not None else []
    return [
        Due(str(key), int(episode), int(n), dict(zip(names, values, strict=True)), skip)
        for key, episode, n, values, skip in value or ()
    ]
