"""The outbox half of a claim statement, the same for both ways to track.

It follows a CTE ``claimed`` of (key, episode, n, deadline, row_data): each row
becomes an alert and one delivery per notifier, in the claim's transaction.
``{severity}`` and ``{notify}`` are the rule's (by notification number, for
escalation: they may read ``c.n`` and ``a.n``). :data:`SEVERITIES` is an
expression for the claim's final ``SELECT``: the alerts written, per severity.

:func:`resolved` is the outbox of resolved notices (rule ``resolve: true``): it
follows the claim's CTEs with ``ended_episodes`` of (key, episode, n, deadline,
row_data), the notified episodes that this statement ended, with ``n`` the
notifications sent in each. Each becomes one alert of kind 'resolved' with n = 0,
so ``alert_once`` makes it exactly one per episode whoever closes it, and one
delivery per notifier that was paged in the episode.

:func:`alert_payload` and :func:`alert_id` are the one place that shapes an alert
as receivers, the API and the CLI see it (docs/reference/notifiers.md).

With ``SLAWATCH_OUTBOX=rows`` (a preview, docs/explanation/outbox-rows.md) both write
rows of up to :data:`ROW_ALERTS` alerts into ``slawatch.outbox_row`` and one
``slawatch.outbox_send`` per notifier of each row instead of alerts and deliveries;
the CTEs ``alerts`` and ``deliveries`` (and ``resolved_deliveries``) that the rest of
the statement reads keep their names and columns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import psycopg.errors
from psycopg import sql
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.pq import TransactionStatus

# The one field of an alert's row that stands in for row data over MAX_DATA, beside
# the row's key columns (docs/reference/rules.md, `columns`); a rule's row has no
# column of that name (config.rules.Rule.row_problem).
from slawatch.config.rules import TRUNCATED as TRUNCATED

# SLAWATCH_OUTBOX: the outbox in rows ("rows", the default), or an alert per row ("alerts";
# docs/explanation/outbox-rows.md).
from slawatch.config.settings import DEFAULT_OUTBOX as DEFAULT_OUTBOX
from slawatch.config.settings import Outbox as Outbox
from slawatch.db import Connection, one_statement, translate

if TYPE_CHECKING:
    from slawatch.config.rules import Rule

log = logging.getLogger(__name__)

# The most alerts an outbox row holds (its CHECK, 0020_outbox_rows.sql): one delivery batch.
ROW_ALERTS = 100

# The bound of what a receiver, the page and the API are sent of one alert's row, in
# bytes, measured two ways (docs/reference/rules.md, `columns`):
# - an event's `data`: its JSON text (as orjson writes it) when it is taken
#   (events/ingest.py); the alert carries it whole.
# - a table rule's row: the jsonb value the claim builds, by pg_column_size (its
#   binary size, uncompressed: a value just built is not yet compressed). That is
#   its JSON text's size within a few bytes per field for text, more for many small
#   numbers, less for strings that JSON escapes. The claim does not measure the text:
#   that would write out every row's JSON, where pg_column_size is a read of the
#   value's length (see _CAPPED).
MAX_DATA = 64 * 1024

# An alert's row data, bounded: pg_column_size of a jsonb value just built is its
# length (no read of the value), so a row within the bound costs one comparison. One
# over it is replaced, in the rare branch, by TRUNCATED's sentence and the row's key
# columns ({drop}: the others), or the sentence alone if those are over it too. A NULL
# (no claim builds one: its row is jsonb_build_object's, or the key's) also takes the
# rare branch, and becomes a sentence that says so rather than one with no size:
# slawatch.alert.row_data is NOT NULL, and a NULL would fail the rule's every claim.
_CAPPED = """\
CASE WHEN pg_column_size({value}) <= {max} THEN {value}
     WHEN {value} IS NULL THEN jsonb_build_object({truncated},
                                  'no row data (NULL); see the row in the table')
     ELSE (SELECT CASE WHEN pg_column_size(t.m || t.k) <= {max} THEN t.m || t.k ELSE t.m END
             FROM (SELECT jsonb_build_object({truncated}, format(
                              'row data of %%s bytes is over the %%s-byte limit;'
                              ' see the row in the table',
                              to_char(pg_column_size({value}), 'FM999,999,999,999'),
                              {max_text})) AS m,
                          {value} - {drop}::text[] AS k
                   OFFSET 0) t) END"""


def row_cap(rule: Rule, key: Sequence[str]) -> list[str] | None:
    """The columns an alert of ``rule`` leaves out when its row data is over MAX_DATA
    (:func:`capped`): its ``columns`` but the key's. None for an event rule: its row is
    bounded when each event is taken (the data at MAX_DATA as JSON), and carried whole."""
    if rule.events is not None:
        return None
    return [c for c in rule.alert_columns(list(key)) if c not in key]


def capped(value: sql.Composable, drop: Sequence[str] | None) -> sql.Composable:
    """``value`` (an alert's row data, jsonb) within MAX_DATA bytes; ``drop``: see
    :func:`row_cap` (None: the value as it is)."""
    if drop is None:
        return value
    return sql.SQL(_CAPPED).format(
        value=value,
        max=sql.Literal(MAX_DATA),
        max_text=sql.Literal(f"{MAX_DATA:,}"),
        truncated=sql.Literal(TRUNCATED),
        drop=sql.Literal(list(drop)),
    )


_OUTBOX = """\
), alerts AS (
    INSERT INTO slawatch.alert (rule, key, episode, n, severity, deadline, due_at, fired_at,
                                row_data)
    SELECT %(rule)s, c.key, c.episode, c.n, {severity}, c.deadline,
           c.deadline + %(after)s::interval, %(now)s::timestamptz, {row_data}
      FROM claimed c{guard_alert}
    RETURNING id, n, severity{returning}
), deliveries AS (
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT a.id, x.notifier, %(now)s::timestamptz
      FROM alerts a, unnest({notify}) AS x(notifier)
    RETURNING 1
), history_opened AS (
    -- Episode history (slawatch.episode): a row with each episode's notification #1,
    -- and the episode before it ended now if nothing closed it yet (its deadline moved
    -- to a time already due: the row went from one episode straight into the next).
    INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at)
    SELECT %(rule)s, c.key, c.episode, c.deadline, c.deadline + %(after)s::interval,
           %(now)s::timestamptz
      FROM claimed c
     WHERE c.n = 1{guard_episode}
    RETURNING 1
), history_superseded AS (
    -- A key has one open episode at most, and this statement's own insert is not
    -- visible here: the open one is the episode before.
{superseded}
){ended}"""

# The open episodes of the keys in ``{keys}`` (a SELECT of one column, the key): found
# from each key (a probe of episode_pkey, locked so an ack that commits meanwhile is
# waited for, not lost), then updated by ctid. A join of the episode table with a CTE
# was planned the other way round (a scan of the rule's open episodes per batch:
# 2.3 s of a 2.4 s claim in bench/claim.py).
_HISTORY_END = """\
    UPDATE slawatch.episode h SET ended_at = %(now)s::timestamptz
     WHERE h.ctid = ANY (ARRAY(
           SELECT p.ctid FROM ({keys}) AS k(key) CROSS JOIN LATERAL (
                  SELECT e.ctid FROM slawatch.episode e
                   WHERE e.rule = %(rule)s AND e.key = k.key AND e.ended_at IS NULL
                     FOR NO KEY UPDATE) p))
       AND h.ended_at IS NULL
    RETURNING {returning}"""

# What _HISTORY_END returns: the outbox in rows reads which episodes this statement
# ended (a resolved notice only for those: docs/explanation/outbox-rows.md).
_ENDED_RETURNING = {False: sql.SQL("1"), True: sql.SQL("h.key, h.episode")}

# _HISTORY_END of a rule with `resolve: true` in the outbox in rows: the key's open
# episode, or one given up (give_up_after: `abandoned`, ended without a notice) whose
# resolved notice is not written yet, as today's outbox writes one when its row
# completes (docs/explanation/outbox-rows.md). `resolved_notice_at` is set from NULL
# here, in the statement that writes the notice: once per episode, whoever ends it. The
# same probe of episode_pkey by (rule, key) as _HISTORY_END's, filtered on the heap row.
_HISTORY_END_NOTICE = """\
    UPDATE slawatch.episode h SET ended_at = coalesce(h.ended_at, %(now)s::timestamptz),
                                  resolved_notice_at = %(now)s::timestamptz
     WHERE h.ctid = ANY (ARRAY(
           SELECT p.ctid FROM ({keys}) AS k(key) CROSS JOIN LATERAL (
                  SELECT e.ctid FROM slawatch.episode e
                   WHERE e.rule = %(rule)s AND e.key = k.key
                     AND (e.ended_at IS NULL OR e.abandoned AND e.resolved_notice_at IS NULL)
                     FOR NO KEY UPDATE) p))
       AND (h.ended_at IS NULL OR h.abandoned AND h.resolved_notice_at IS NULL)
    RETURNING h.key, h.episode"""


def _history_end(keys: sql.Composable, *, rows: bool, resolve: bool) -> sql.Composed:
    """The UPDATE ending the open episodes of ``keys`` in the history (see
    :func:`history_ended`)."""
    if rows and resolve:
        return sql.SQL(_HISTORY_END_NOTICE).format(keys=keys)
    return sql.SQL(_HISTORY_END).format(keys=keys, returning=_ENDED_RETURNING[rows])


# The episodes a statement closed, ended in the history.
_HISTORY_ENDED = """, history_ended AS (
{end}
)"""


def history_ended(
    closed: sql.Composable, *, rows: bool = False, resolve: bool = False
) -> sql.Composed:
    """The CTE that sets ``ended_at`` in the episode history for the keys of ``closed``
    (a SELECT of the key of each episode the statement closed: a key's only open one).
    ``rows``: it returns the (key, episode) of each episode it ended; with ``resolve``
    (the rule's), also of a given-up one whose resolved notice it writes
    (_HISTORY_END_NOTICE)."""
    return sql.SQL(_HISTORY_ENDED).format(end=_history_end(closed, rows=rows, resolve=resolve))


# The alerts this claim wrote, per severity, e.g. {"warning": 3, "critical": 1}; the
# metrics count them by severity (escalation changes it by notification number).
# Used as ``{severities}`` in a composed statement: as an argument it keeps its braces.
SEVERITIES = """\
(SELECT coalesce(jsonb_object_agg(s.severity, s.count), '{}'::jsonb)
   FROM (SELECT severity, count(*) FROM alerts GROUP BY severity) s)"""


def severities(value: object) -> dict[str, int]:
    """:data:`SEVERITIES` as read back (a dict from psycopg's jsonb)."""
    return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else {}


@dataclass
class Tally:
    """What claims wrote: alerts, episodes they closed, alerts per severity."""

    alerts: int = 0
    closed: int = 0
    severities: dict[str, int] = field(default_factory=dict)

    def __iadd__(self, other: Tally) -> Tally:
        self.alerts += other.alerts
        self.closed += other.closed
        for severity, count in other.severities.items():
            self.severities[severity] = self.severities.get(severity, 0) + count
        return self


_RESOLVED = """\
, ended_episodes AS (
{ended_episodes}
), resolved AS (
    INSERT INTO slawatch.alert (rule, key, episode, n, kind, severity, deadline, due_at,
                                fired_at, row_data)
    SELECT %(rule)s, e.key, e.episode, 0, 'resolved', {severity}, e.deadline,
           e.deadline + %(after)s::interval, %(now)s::timestamptz, {row_data}
      FROM ended_episodes e
    ON CONFLICT DO NOTHING
    RETURNING id, key, episode
), ended_n AS MATERIALIZED (
    -- Each ended episode's notifications (n), by "<key>:<episode>" (the episode is the
    -- part after the last colon): the notices' deliveries read it by binary search,
    -- once each, whatever the planner expects of these CTEs' sizes. Joined back, the
    -- two were planned on their estimates, and at 1 row each (statistics from before
    -- a wave of episodes ending) a nested loop compared every notice with every ended
    -- episode (tests/integration/test_track_table.py).
    SELECT jsonb_object_agg(e.key || ':' || e.episode, e.n) AS n FROM ended_episodes e
), resolved_deliveries AS (
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT r.id, x.notifier, %(now)s::timestamptz
      FROM resolved r
     CROSS JOIN LATERAL (
           SELECT ((SELECT n FROM ended_n) ->> (r.key || ':' || r.episode))::integer AS n) e,
           unnest({paged}) AS x(notifier)
    RETURNING 1
)"""


# SLAWATCH_OUTBOX=rows (docs/explanation/outbox-rows.md): the alerts of ``{source}``
# (key, episode, n, severity, deadline, row_data, notifiers) as rows of up to
# ROW_ALERTS, one set of notifiers each (escalation tiers that page others by n make
# rows of their own), in deadline order; element i of each array is one alert.
# array_agg's ORDER BY keeps the arrays aligned whatever plan the grouping takes.
# Without `after` (a calendar rule: ClaimPlan.params), due_ats has a NULL per element,
# which the claim's transaction fills in before it commits (claim.py, _dated).
_ROWS = """\
    INSERT INTO slawatch.outbox_row (rule, kind, fired_at, after, notifiers, keys, episodes, ns,
                                     severities, deadlines, row_data, due_ats)
    SELECT %(rule)s, {kind}, %(now)s::timestamptz, %(after)s::interval, g.notifiers,
           array_agg(g.key ORDER BY g.i), array_agg(g.episode ORDER BY g.i),
           array_agg(g.n ORDER BY g.i), array_agg(g.severity ORDER BY g.i),
           array_agg(g.deadline ORDER BY g.i), array_agg(g.row_data ORDER BY g.i),
           CASE WHEN %(after)s::interval IS NULL
                THEN array_fill(NULL::timestamptz, ARRAY[count(*)::integer]) END
      FROM (SELECT a.key, a.episode, a.n, a.severity, a.deadline, a.row_data, a.notifiers,
                   row_number() OVER (PARTITION BY a.notifiers ORDER BY a.deadline, a.key) AS i
              FROM {source} a) g
     GROUP BY g.notifiers, (g.i - 1) / {size}
    RETURNING id, notifiers"""

# Each row's send to each of its notifiers, due now.
_SENDS = """\
    INSERT INTO slawatch.outbox_send (row_id, notifier, next_attempt_at)
    SELECT r.id, x.notifier, %(now)s::timestamptz
      FROM {rows} r, unnest(r.notifiers) AS x(notifier)
    RETURNING 1"""


def _rows(kind: str, source: sql.Composable) -> sql.Composed:
    return sql.SQL(_ROWS).format(
        kind=sql.Literal(kind), source=source, size=sql.Literal(ROW_ALERTS)
    )


# The outbox in rows (_OUTBOX's counterpart). Alert once without an index entry per
# alert (docs/explanation/outbox-rows.md): a first notification (n = 1) only where this
# statement's insert of its episode row did not conflict; a later one is kept once by
# the row lock and the bump of n, as ever. `alerts` keeps _OUTBOX's columns for the
# statement's counts and actions (engine/acting.py), `deliveries` is the sends.
_OUTBOX_ROWS = """\
), history_opened AS (
    -- Episode history (slawatch.episode): as _OUTBOX's. What it inserted is what
    -- may be notified as #1.
    INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at)
    SELECT %(rule)s, c.key, c.episode, c.deadline, c.deadline + %(after)s::interval,
           %(now)s::timestamptz
      FROM claimed c
     WHERE c.n = 1{guard_episode}
    RETURNING key, episode
), alerts AS MATERIALIZED (
    -- IN (...) IS TRUE: a hashed subplan, never a join of two CTEs planned on their
    -- estimates (claim.py's _ENDED_EPISODES says why).
    SELECT c.key, c.episode, c.n, {severity} AS severity, c.deadline, {row_data} AS row_data
      FROM claimed c
     WHERE c.n > 1
        OR ((c.key, c.episode) IN (SELECT o.key, o.episode FROM history_opened o)) IS TRUE
), outbox_rows AS (
{rows}
), deliveries AS (
{sends}
){action_alerts}, history_superseded AS (
{superseded}
){ended}"""

# A webhook action's delivery is an alert's on today's tables in both modes
# (slawatch/sql/action_webhook.sql finds the alert by alert_once): with the outbox in
# rows, the alerts its action is on are written there too, without deliveries.
_ACTION_ALERTS = """, action_alerts AS (
    INSERT INTO slawatch.alert (rule, key, episode, n, severity, deadline, due_at, fired_at,
                                row_data)
    SELECT %(rule)s, a.key, a.episode, a.n, a.severity, a.deadline,
           a.deadline + %(after)s::interval, %(now)s::timestamptz, a.row_data
      FROM alerts a
     WHERE a.n = %(action_on)s::integer
    ON CONFLICT DO NOTHING
    RETURNING 1
)"""

# Resolved notices in rows (_RESOLVED's counterpart): n = 0, to the notifiers paged in
# the episode, only for the episodes whose end this statement wrote into the history
# (`ended_at` and `resolved_notice_at` set from NULL, or for a given-up episode
# `resolved_notice_at`: once per episode whoever ends it; _HISTORY_END_NOTICE), and
# for those the history no longer has: an episode given up and pruned by retention a
# window later (prune_episodes) before its row completed. Today's outbox writes that one
# (alert_once holds no notice of the episode), and so do rows: the row's completion is
# written once (its lock), and no claim writes that episode's history row again (only
# its #1 did). Read only for an ended episode this statement did not end in the history
# (the hashed IN comes first: OR stops there), one probe of episode_pkey, locked: a row
# that retention deletes while this statement waits for it (in _HISTORY_END_NOTICE, which
# then skips it) counts as gone, not as the row the statement's snapshot still sees.
_RESOLVED_ROWS = """\
, ended_episodes AS (
{ended_episodes}
), resolved AS MATERIALIZED (
    SELECT e.key, e.episode, 0 AS n, {severity} AS severity, e.deadline,
           {row_data} AS row_data, {paged} AS notifiers
      FROM ended_episodes e
     WHERE ((e.key, e.episode) IN ({ended_now})) IS TRUE
        OR NOT EXISTS (SELECT 1 FROM slawatch.episode h
                        WHERE h.rule = %(rule)s AND h.key = e.key AND h.episode = e.episode
                          FOR KEY SHARE)
), resolved_rows AS (
{rows}
), resolved_deliveries AS (
{sends}
)"""


def resolved(
    ended_episodes: sql.Composable,
    severity: sql.Composable,
    paged: sql.Composable,
    *,
    drop: Sequence[str] | None,
    rows: bool = False,
    ended_now: sql.Composable | None = None,
) -> sql.Composed:
    """The CTEs writing resolved notices for ``ended_episodes`` (a SELECT); ``severity``
    and ``paged`` (the notifiers paged in the episode) may read ``e.n``; ``drop``: the
    row's cap (:func:`row_cap`). ``rows``: into the outbox in rows, for the episodes of
    ``ended_now`` (a SELECT of the (key, episode) the statement's history CTEs ended,
    made with ``rows``) and those the history no longer has (_RESOLVED_ROWS)."""
    row_data = capped(sql.SQL("e.row_data"), drop)
    if not rows:
        return sql.SQL(_RESOLVED).format(
            ended_episodes=ended_episodes, severity=severity, paged=paged, row_data=row_data
        )
    if ended_now is None:
        raise ValueError("resolved notices in rows need the episodes the statement ended")
    return sql.SQL(_RESOLVED_ROWS).format(
        ended_episodes=ended_episodes,
        severity=severity,
        paged=paged,
        row_data=row_data,
        ended_now=ended_now,
        rows=_rows("resolved", sql.SQL("resolved")),
        sends=sql.SQL(_SENDS).format(rows=sql.Identifier("resolved_rows")),
    )


# The episodes a claim statement ended in the history (both CTEs made with ``rows``):
# ``ended_now`` of its resolved notices in rows.
CLAIM_ENDED = sql.SQL(
    "SELECT key, episode FROM history_superseded UNION ALL SELECT key, episode FROM history_ended"
)


def outbox(
    severity: sql.Composable,
    notify: sql.Composable,
    acting: bool = False,
    *,
    closed: sql.Composable,
    drop: Sequence[str] | None,
    rows: bool = False,
    webhook: bool = False,
    resolve: bool = False,
    guarded: bool = True,
) -> sql.Composed:
    """The ``alerts`` and ``deliveries`` CTEs for a rule's severity and notifiers, and
    the episode history's: new episodes, and ``closed`` (a SELECT of the keys of the
    episodes this statement closed) ended. ``acting``: ``alerts`` also returns key,
    episode and row_data (engine/acting.py reads them). ``drop``: the row's cap
    (:func:`row_cap`): the alerts' row data is bounded as it is written.

    ``rows``: the outbox in rows (docs/explanation/outbox-rows.md); ``alerts`` has
    key, episode, n, severity, deadline and row_data, and the history CTEs return the
    (key, episode) they ended (:data:`CLAIM_ENDED`). ``webhook``: the rule's action is a
    webhook, whose alerts are written to today's table as well (_ACTION_ALERTS).
    ``resolve``: the rule's (with ``rows``, the history CTEs also take given-up episodes
    whose resolved notice is not written yet: _HISTORY_END_NOTICE). ``guarded``: the
    inserts of notifications and of new episodes' history rows pass over one there
    already (:data:`GUARDS`); without, such a row fails the statement
    (:func:`unguarded_first`)."""
    row_data = capped(sql.SQL("c.row_data"), drop)
    guards = GUARDS if guarded else _NO_GUARDS
    superseded_keys = sql.SQL("SELECT c.key FROM claimed c WHERE c.n = 1 AND c.episode > 1")
    superseded = _history_end(superseded_keys, rows=rows, resolve=resolve)
    if rows:
        return sql.SQL(_OUTBOX_ROWS).format(
            severity=severity,
            row_data=row_data,
            rows=_rows(
                "firing",
                sql.SQL("(SELECT a.*, {} AS notifiers FROM alerts a)").format(notify),
            ),
            sends=sql.SQL(_SENDS).format(rows=sql.Identifier("outbox_rows")),
            action_alerts=sql.SQL(_ACTION_ALERTS if webhook else ""),
            superseded=superseded,
            ended=history_ended(closed, rows=True, resolve=resolve),
            **guards,
        )
    returning = sql.SQL(", key, episode, row_data" if acting else "")
    return sql.SQL(_OUTBOX).format(
        severity=severity,
        notify=notify,
        returning=returning,
        row_data=row_data,
        superseded=superseded,
        ended=history_ended(closed),
        **guards,
    )


def rule_outbox(
    rule: Rule,
    key: Sequence[str],
    severity: sql.Composable,
    notify: sql.Composable,
    *,
    closed: sql.Composable,
    rows: bool,
    guarded: bool,
) -> sql.Composed:
    """:func:`outbox` for ``rule`` keyed by ``key``: its action, row cap and resolve."""
    return outbox(
        severity,
        notify,
        acting=rule.action is not None,
        closed=closed,
        drop=row_cap(rule, key),
        rows=rows,
        webhook=rule.action is not None and rule.action.webhook is not None,
        resolve=rule.resolve,
        guarded=guarded,
    )


# The claim's guards against a row written already. A notification, or an episode's
# history row, that exists already (tracking state restored from a backup, an upgrade
# cut short) is not an error that would stop the rule: the claim passes over it, and
# writes no alert where its episode's row was there (the outbox in rows: what keeps
# #1 once) or where the notification was (alert_once). Each guard costs its insert a
# speculative insertion (a check of the unique index, then the insert confirmed) on
# every row, to pass over rows that only such a restore leaves. The claim is therefore
# sent without them first, and with them only when that fails (unguarded_first).
GUARDS = {
    "guard_alert": sql.SQL("\n    ON CONFLICT DO NOTHING"),
    "guard_episode": sql.SQL("\n    ON CONFLICT (rule, key, episode) DO NOTHING"),
}
_NO_GUARDS = {name: sql.SQL("") for name in GUARDS}


def unguarded_first(
    conn: Connection,
    rule: str,
    statement: sql.Composed,
    guarded: sql.Composed | None,
    params: Mapping[str, Any],
    act: Callable[[Sequence[Any]], None] | None = None,
) -> Any:
    """The row a claim of ``rule`` answers: ``statement``, the claim without
    :data:`GUARDS`, on its own (one round trip: it commits alone), or with ``act`` (the
    rule's actions, given that row) in one transaction. Where a notification or a history
    row it writes is there already (a unique violation of slawatch's alerts or episode
    history, which rolls all of it back), ``guarded``, the same claim with them, which
    passes over those rows. Any other error, a rule's action's own among them, is raised
    as it is (translated). ``guarded`` None: ``statement`` has its guards.

    On ``conn`` in a transaction already (a calendar rule's claim with its due times,
    claim._dated), a failed statement would abort that transaction, and a savepoint
    around it costs two round trips: ``guarded`` at once."""
    what = f"claim for rule {rule}"

    def run(claim: sql.Composed) -> Any:
        if act is None:
            with one_statement(conn):
                return conn.execute(claim, params).fetchone()
        with conn.transaction():
            row = conn.execute(claim, params).fetchone()
            assert row is not None
            act(row)
        return row

    with translate(what):
        if guarded is not None and conn.info.transaction_status != TransactionStatus.IDLE:
            return run(guarded)
        try:
            return run(statement)
        except psycopg.errors.UniqueViolation as exc:
            table = exc.diag.table_name or ""
            ours = exc.diag.schema_name == "slawatch" and (
                table == "episode" or table.startswith("alert")
            )
            if guarded is None or not ours:
                raise
            log.warning(
                "%s: some of its notifications or episodes were written already (a key"
                " inserted again after its row was deleted, or tracking state restored"
                " from a backup); claiming again past them, new episodes numbered after"
                " them",
                what,
            )
            return run(guarded)


def alert_payload(row: Mapping[str, Any], description: str = "") -> dict[str, Any]:
    """The alert as receivers see it (docs/reference/notifiers.md). ``status``: "firing" for a
    notification, "resolved" for the notice that a notified episode ended (n is 0)."""
    kind = row.get("kind", "firing")
    return {
        "id": alert_id(row["rule"], row["key"], row["episode"], row["n"], kind),
        "status": kind,
        "rule": row["rule"],
        "key": row["key"],
        "episode": row["episode"],
        "n": row["n"],
        "severity": row["severity"],
        "deadline": iso(row["deadline"]),
        "due_at": iso(row["due_at"]),
        "fired_at": iso(row["fired_at"]),
        "row": row["row_data"],
        "description": description,
    }


def row_payloads(
    rule: str,
    kind: str,
    fired_at: str,
    description: str,
    elements: Iterable[tuple[str, int, int, str, str | None, str | None, Any]],
) -> list[dict[str, Any]]:
    """:func:`alert_payload` of each element of an outbox row (docs/explanation/outbox-rows.md)
    of ``rule`` and ``kind``: (key, episode, n, severity, deadline, due_at, row_data), the
    times as text already (the lease's answer), ``fired_at`` the row's. The same dicts
    (keys in the same order, the same ids) made without a mapping per element: the row's
    arrays zipped (dispatcher.py, deliver_row_send)."""
    resolved = kind == "resolved"
    return [
        {
            "id": f"{rule}:{key}:e{episode}:resolved"
            if resolved
            else f"{rule}:{key}:e{episode}:n{n}",
            "status": kind,
            "rule": rule,
            "key": key,
            "episode": episode,
            "n": n,
            "severity": severity,
            "deadline": deadline,
            "due_at": due_at,
            "fired_at": fired_at,
            "row": row_data,
            "description": description,
        }
        for key, episode, n, severity, deadline, due_at, row_data in elements
    ]


def alert_id(rule: str, key: str, episode: int, n: int, kind: str = "firing") -> str:
    """The idempotency id: one readable string naming rule, key, episode and n, e.g.
    ``order_unshipped:42:e1:n3``; a resolved notice ends in ``:resolved`` instead of
    the number. The rule name has no ``:`` and the last two parts are fixed forms, so
    the id reads back unambiguously whatever the key holds (lifecycle.parse_alert).
    A storm summary's is ``order_unshipped:storm:<notifier>:<first alert id>``."""
    if kind == "resolved":
        return f"{rule}:{key}:e{episode}:resolved"
    if (
        kind == "summary"
    ):  # the key is storm:<notifier>:<first alert id> (slawatch/delivery/storm.py)
        return f"{rule}:{key}"
    return f"{rule}:{key}:e{episode}:n{n}"


def iso(value: Any) -> str | None:
    """A timestamp as alerts carry it: ISO 8601, UTC written as ``Z``. Text is taken as
    that form already (the delivery claim's answer has its times so)."""
    if isinstance(value, str):
        return value
    return None if value is None else value.isoformat().replace("+00:00", "Z")


# Byte by byte: a digit to "1", anything else to "0" (RowDataLoader's test for long numbers).
_DIGITS = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))
_LONG = b"1" * 19


class RowDataLoader(Loader):
    """jsonb (an alert's ``row_data``) as the objects ``json.loads`` makes of it, which
    is psycopg's own loader, in a third of the time.

    orjson decodes what has no run of 19 digits; what has one goes to ``json.loads``
    (a number past 64 bits would be a float from orjson, an int from json.loads),
    and so does whatever orjson refuses (nesting deeper than it takes). Below 19
    digits both make the same int, or the same float (both round correctly; jsonb
    writes numbers without exponents)."""

    def load(self, data: Buffer) -> Any:
        text = data if isinstance(data, bytes) else bytes(data)
        if _LONG not in text.translate(_DIGITS):
            try:
                return orjson.loads(text)
            except orjson.JSONDecodeError:
                pass
        return json.loads(text)
