"""The batch claim: one statement finds due rows through the two partial indexes,
bumps their notification count, schedules the next notification and writes the
alerts and their deliveries into the outbox, all in one transaction.

On a partitioned table rows are addressed by (tableoid, ctid): a ctid alone
names a slot in every partition.

Correctness under concurrency: the two index scans lock the rows they pick
(``FOR UPDATE SKIP LOCKED``), so concurrent scanners take disjoint batches and
a row the application is updating right now is left for the next scan; rows
are then addressed by ``ctid`` (a TID scan, no second index lookup), and the
UPDATE re-checks the due predicate, so a row completed or already notified in
the meantime is never claimed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from psycopg import sql

from slawatch.catalog import condition, index_state, inspect_table, table_ident
from slawatch.clock import Clock
from slawatch.db import Connection, Database, translate
from slawatch.errors import ConfigError
from slawatch.migrate import index_specs
from slawatch.queries import queries
from slawatch.rules import Rule

log = logging.getLogger(__name__)

_CLAIM = """\
WITH first AS (
    SELECT tableoid, ctid FROM {table}
     WHERE {deadline} < %(cutoff)s AND {n} = 0 AND ({open_when}
           )
     ORDER BY {deadline}
     LIMIT %(batch)s::integer
       FOR UPDATE SKIP LOCKED
), again AS (
    SELECT tableoid, ctid FROM {table}
     WHERE {next} < %(now)s::timestamptz AND {next} IS NOT NULL AND ({open_when}
           )
     ORDER BY {next}
     LIMIT %(batch)s::integer - (SELECT count(*) FROM first)
       FOR UPDATE SKIP LOCKED
), targets AS (
    SELECT tableoid AS toid, ctid AS tid FROM first
    UNION ALL
    SELECT tableoid, ctid FROM again
), claimed AS (
    UPDATE {table}
       SET {n} = {n} + 1,
           {next} = CASE WHEN {n} + 1 >= %(max)s::integer THEN NULL
                         ELSE %(now)s::timestamptz + {interval} END
     WHERE ctid = ANY (ARRAY(SELECT tid FROM targets)){partition_match}
       AND ({n} = 0 AND {deadline} < %(cutoff)s OR {next} < %(now)s::timestamptz)
       AND ({open_when}
           )
    RETURNING {key}::text AS key, {n} AS n, {deadline_tz} AS deadline, {row} AS row_data
), alerts AS (
    INSERT INTO slawatch.alert (rule, key, n, severity, deadline, due_at, fired_at, row_data)
    SELECT %(rule)s, c.key, c.n, {severity}, c.deadline,
           c.deadline + %(after)s::interval, %(now)s::timestamptz, c.row_data
      FROM claimed c
    RETURNING id, n
), deliveries AS (
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT a.id, x.notifier, %(now)s::timestamptz
      FROM alerts a, unnest({notify}) AS x(notifier)
    RETURNING 1
)
SELECT (SELECT count(*) FROM alerts), (SELECT count(*) FROM deliveries)"""


@dataclass(frozen=True)
class ClaimPlan:
    """A rule's claim statement, composed once, and how to fill its parameters."""

    rule: Rule
    statement: sql.Composed
    deadline_has_tz: bool

    def params(self, now: datetime) -> dict[str, Any]:
        """The parameters for a claim at ``now`` (an aware datetime)."""
        rule = self.rule
        cutoff = now - rule.after
        if not self.deadline_has_tz:
            # A `timestamp` deadline is wall time in the rule's zone: compare like with like
            # so the index on the column is usable and the session TimeZone plays no part.
            cutoff = cutoff.astimezone(ZoneInfo(rule.timezone)).replace(tzinfo=None)
        params: dict[str, Any] = {
            "now": now,
            "cutoff": cutoff,
            "max": rule.max_notifications,
            "batch": rule.batch,
            "rule": rule.name,
            "after": rule.after,
            "tz": rule.timezone,
            "severity": rule.severity,
            "notify": list(rule.notify),
        }
        renotify = rule.renotify
        if renotify is not None and renotify.every is not None:
            params["every"] = renotify.every
        elif renotify is not None and renotify.backoff is not None:
            params["first"] = renotify.backoff.first
            params["cap"] = renotify.backoff.max
        for i, tier in enumerate(rule.escalate):
            params[f"sev{i}"], params[f"notify{i}"] = rule.tier_for(tier.from_)
        return params


# On a partitioned table a ctid names a slot in every partition: the TID scans
# probe each partition, and this keeps only the (partition, slot) pairs claimed.
_PARTITION_MATCH = "\n       AND (tableoid, ctid) IN (SELECT toid, tid FROM targets)"


def plan_claim(rule: Rule, deadline_type: str, partitioned: bool = False) -> ClaimPlan:
    """Compose the claim for ``rule`` whose deadline column has ``deadline_type``."""
    has_tz = deadline_type == "timestamp with time zone"
    n, nxt = sql.Identifier(rule.n_column), sql.Identifier(rule.next_column)
    deadline = sql.Identifier(rule.deadline)
    if rule.renotify is None:
        interval: sql.Composable = sql.SQL("NULL::interval")
    elif rule.renotify.every is not None:
        interval = sql.SQL("%(every)s::interval")
    else:
        # first * 2^(n-1) for the n-th notification, n being the new count; capped.
        interval = sql.SQL(
            "LEAST(%(first)s::interval * power(2, LEAST({n}, 60))::float8, %(cap)s::interval)"
        ).format(n=n)
    deadline_tz = deadline if has_tz else sql.SQL("({} AT TIME ZONE %(tz)s)").format(deadline)
    row = sql.SQL("jsonb_build_object({})").format(
        sql.SQL(", ").join(
            sql.SQL("{}, {}").format(sql.Literal(c), sql.Identifier(c)) for c in rule.alert_columns
        )
    )
    severity: sql.Composable = sql.SQL("%(severity)s::text")
    notify: sql.Composable = sql.SQL("%(notify)s::text[]")
    if rule.escalate:
        # Highest tier first: the last tier reached wins.
        whens = [(i, t.from_) for i, t in enumerate(rule.escalate)][::-1]
        severity = sql.SQL("CASE {} ELSE %(severity)s::text END").format(
            sql.SQL(" ").join(
                sql.SQL("WHEN c.n >= {} THEN {}::text").format(
                    sql.Literal(f), sql.Placeholder(f"sev{i}")
                )
                for i, f in whens
            )
        )
        notify = sql.SQL("CASE {} ELSE %(notify)s::text[] END").format(
            sql.SQL(" ").join(
                sql.SQL("WHEN a.n >= {} THEN {}::text[]").format(
                    sql.Literal(f), sql.Placeholder(f"notify{i}")
                )
                for i, f in whens
            )
        )
    statement = sql.SQL(_CLAIM).format(
        table=table_ident(rule),
        n=n,
        next=nxt,
        deadline=deadline,
        deadline_tz=deadline_tz,
        key=sql.Identifier(rule.key),
        open_when=condition(rule),
        interval=interval,
        row=row,
        severity=severity,
        notify=notify,
        partition_match=sql.SQL(_PARTITION_MATCH if partitioned else ""),
    )
    return ClaimPlan(rule, statement, has_tz)


def prepare(conn: Connection, rule: Rule) -> ClaimPlan:
    """Read the table's catalog entry and compose the claim; the table must be migrated."""
    info = inspect_table(conn, rule.schema_name, rule.table_name)
    if info is None:
        raise ConfigError(f"{rule.source}: table: {rule.table} does not exist")
    if rule.n_column not in info.columns or rule.next_column not in info.columns:
        raise ConfigError(
            f"{rule.source}: {rule.table} has no tracking columns for rule {rule.name!r}; "
            "run 'slawatch migrate' first"
        )
    for spec in index_specs(rule):
        if not spec.is_current(index_state(conn, rule.schema_name, spec.name)):
            # Claiming now would be correct but slow (no usable partial index).
            raise ConfigError(
                f"{rule.source}: rule {rule.name!r} changed since the last migrate "
                f"(index {spec.name} is missing or out of date); run 'slawatch migrate'"
            )
    deadline_type = info.columns.get(rule.deadline, "")
    return plan_claim(rule, deadline_type, partitioned=info.relkind == "p")


def claim_batch(conn: Connection, plan: ClaimPlan, now: datetime) -> int:
    """Claim at most one batch at ``now`` in one transaction; return the alerts written."""
    with translate(f"claim for rule {plan.rule.name}"), conn.transaction():
        row = conn.execute(plan.statement, plan.params(now)).fetchone()
        alerts, deliveries = (int(row[0]), int(row[1])) if row else (0, 0)
        if deliveries:
            # Delivered on commit: wakes the delivery workers at once instead of at their next poll.
            conn.execute(queries()["wake_deliveries"])
    return alerts


@dataclass(frozen=True)
class DrainResult:
    """What one drain of a rule did."""

    claimed: int
    batches: int


def drain(
    db: Database,
    plan: ClaimPlan,
    clock: Clock,
    budget: timedelta | None = None,
) -> DrainResult:
    """Claim batch after batch while batches come back full, within ``budget``."""
    budget_s = (budget or plan.rule.every).total_seconds()
    started = time.monotonic()
    claimed = batches = 0
    while True:
        with db.connection(f"claim for rule {plan.rule.name}") as conn:
            got = claim_batch(conn, plan, clock.now())
        claimed += got
        batches += 1
        if got < plan.rule.batch:
            return DrainResult(claimed, batches)
        if time.monotonic() - started >= budget_s:
            log.warning(
                "rule %s: time budget of %.0fs spent with rows still due; the next scan goes on",
                plan.rule.name,
                budget_s,
            )
            return DrainResult(claimed, batches)
