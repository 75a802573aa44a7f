"""What actions did: the list of attempts, replaying failed ones, pruning old ones.

``slawatch actions`` and ``GET /v1/actions`` read :func:`list_actions`, and the
alerts' lists (``alerts --json``, ``/v1/alerts``, the on-call page) :func:`actions_of`;
``slawatch replay --actions`` runs :func:`replay_actions`: each failed attempt not
retried since runs once more with the values it was bound to, under a savepoint in
its own transaction, recorded as the next attempt (``action_once`` keeps two
replays from both retrying one). Retention (``slawatch run``) prunes attempts
older than its window with :func:`prune_actions`, as it prunes alerts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from psycopg import sql
from pydantic import BaseModel, Field

from slawatch.actions import webhook
from slawatch.actions.run import Mode, Record, params_of, queries, record, run_one
from slawatch.config.files import shorten
from slawatch.config.rules import RULE_NAME, Rule
from slawatch.db import Connection, Database, translate
from slawatch.engine.acting import Due
from slawatch.errors import BadInput

ActionStatus = Literal["ok", "failed", "skipped", "would_run", "pending", "retry"]
STATUSES: tuple[ActionStatus, ...] = ("ok", "failed", "skipped", "would_run", "pending", "retry")
# The most attempts one list returns (GET /v1/actions?limit=, slawatch actions).
MAX_LIST = 1000
# A list never holds a connection longer than this (as the operator's other reads).
READ_TIMEOUT = "10s"


class ActionAttempt(BaseModel):
    """One attempt of a rule's action (docs/explanation/actions.md), as ``slawatch.action``
    keeps it."""

    id: int
    rule: str
    key: str
    episode: int
    n: int = Field(description="the notification whose claim ran it")
    kind: Literal["sql", "webhook"]
    status: ActionStatus = Field(
        description="ok: ran (a webhook: delivered); failed: rolled back, or a webhook's "
        "delivery went dead (see error); skipped: the episode was acknowledged or silenced, "
        "or the alert's row was over 64 KiB and cut without a column a placeholder reads; "
        "would_run: SLAWATCH_ACTIONS was off or dry-run; pending: a webhook not yet delivered; "
        "retry: a row was locked past lock_timeout, or the batch's time ran out: runs again "
        "at the rule's next scan"
    )
    rows: int | None = Field(description="rows the statement touched")
    error: str | None = Field(description="why it failed, or why it was skipped")
    at: datetime
    attempt: int = Field(description="1 at the claim; 2, 3, ... by slawatch replay --actions")
    params: dict[str, str | None] = Field(description="the values its placeholders were bound to")


class ActionList(BaseModel):
    """Attempts of actions, newest first."""

    actions: list[ActionAttempt]


def _attempt(row: tuple[Any, ...]) -> ActionAttempt:
    keys = ("id", "rule", "key", "episode", "n", "kind", "status", "rows", "error", "at")
    item = dict(zip(keys, row[:10], strict=True))
    return ActionAttempt(**item, attempt=row[10], params=params_of(row[11]))


def _read(conn: Connection, what: str, name: str, params: dict[str, Any]) -> list[Any]:
    with translate(what), conn.transaction():
        conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(READ_TIMEOUT)))
        return conn.execute(queries()[name], params).fetchall()


def list_actions(
    conn: Connection,
    rule: str | None = None,
    status: str | None = None,
    limit: int = 100,
) -> ActionList:
    """The latest ``limit`` attempts (newest first), of one rule and/or one status."""
    if rule is not None and not RULE_NAME.fullmatch(rule):
        raise BadInput(f"rule: {shorten(rule)} is not a rule name ([a-z][a-z0-9_]{{0,39}})")
    if status is not None and status not in STATUSES:
        raise BadInput(f"status: {shorten(status)} is not one of {', '.join(STATUSES)}")
    if not 1 <= limit <= MAX_LIST:
        raise BadInput(f"limit: {limit} is not from 1 to {MAX_LIST}")
    params = {"rule": rule, "status": status, "limit": limit}
    rows = _read(conn, "listing actions", "list_actions", params)
    return ActionList(actions=[_attempt(r) for r in rows])


def actions_of(
    conn: Connection, alerts: Iterable[tuple[str, str, int, int]]
) -> dict[tuple[str, str, int, int], list[ActionAttempt]]:
    """The attempts of the action each of ``alerts`` (rule, key, episode, n) triggered,
    first attempt first; an alert that triggered none is left out."""
    wanted = sorted(set(alerts))
    if not wanted:
        return {}
    rules, keys, episodes, numbers = (list(column) for column in zip(*wanted, strict=True))
    params = {"rules": rules, "keys": keys, "episodes": episodes, "ns": numbers}
    out: dict[tuple[str, str, int, int], list[ActionAttempt]] = {}
    for row in _read(conn, "reading actions of alerts", "actions_of", params):
        got = _attempt(row)
        out.setdefault((got.rule, got.key, got.episode, got.n), []).append(got)
    return out


@dataclass
class Replayed:
    """What a replay did: attempts that succeeded now, failed again, or would run."""

    ok: int = 0
    failed: int = 0
    would_run: int = 0
    queued: int = 0  # webhook actions whose dead delivery is pending again


def replay_actions(
    db: Database, rules: list[Rule], now: datetime, mode: Mode = "on", rule: str | None = None
) -> Replayed:
    """Run each failed action (of ``rule``, else of every rule that has an action now)
    once more, each in its own transaction; ``mode`` other than "on" only counts
    what would run and writes nothing."""
    chosen = [r for r in rules if r.action is not None and rule in (None, r.name)]
    acting = {r.name: r for r in chosen if r.action is not None and r.action.sql is not None}
    done = Replayed()
    # Webhook actions go again as deliveries: sent (and settled) by the delivery workers.
    hooks = [r.name for r in chosen if r.name not in acting]
    if mode == "on":
        done.queued = webhook.replay(db, hooks, now)
    else:
        done.would_run += webhook.replay(db, hooks, now, mode)
    upto = _last_action(db) if acting else 0
    while acting:

        def one(conn: Connection) -> Record | None:
            with translate("replaying an action"), conn.transaction():
                got = conn.execute(
                    queries()["failed_actions"], {"rules": list(acting), "limit": 1, "upto": upto}
                ).fetchone()
                if got is None:
                    return None
                _id, name, key, episode, n, attempt, params = got
                due = Due(key, episode, n, params_of(params))
                if mode != "on":
                    # Nothing is written: the same attempt stays failed, and is counted once.
                    raise _WouldRun(due)
                result = run_one(conn, acting[name], due, attempt + 1)
                record(conn, acting[name], [result], now)
                return result

        try:
            result = db.run("replaying actions", one)
        except _WouldRun:
            done.would_run += _count_failed(db, list(acting))
            return done
        if result is None:
            return done
        if result.status == "ok":
            done.ok += 1
        else:
            done.failed += 1
    return done


class _WouldRun(Exception):
    """Ends a replay in off/dry-run mode (the transaction rolls back: nothing changed)."""

    def __init__(self, due: Due) -> None:
        super().__init__(due.key)


def _last_action(db: Database) -> int:
    def last(conn: Connection) -> int:
        with translate("reading the newest action"):
            row = conn.execute(queries()["last_action"]).fetchone()
        return int(row[0]) if row else 0

    return db.run("reading the newest action", last)


def _count_failed(db: Database, rules: list[str]) -> int:
    def count(conn: Connection) -> int:
        with translate("counting failed actions"):
            return len(
                conn.execute(
                    queries()["failed_actions"],
                    {"rules": rules, "limit": 1_000_000, "upto": 2**62},
                ).fetchall()
            )

    return db.run("counting failed actions", count)


def prune_actions(
    db: Database,
    cutoff: datetime,
    batch: int = 5000,
    budget: timedelta = timedelta(minutes=2),
) -> int:
    """Remove attempts recorded before ``cutoff``, batch after batch within ``budget``."""
    started, total = time.monotonic(), 0
    while True:

        def prune(conn: Connection) -> int:
            with translate("pruning actions"):
                cur = conn.execute(queries()["prune_actions"], {"cutoff": cutoff, "batch": batch})
            return cur.rowcount

        got = db.run("pruning actions", prune)
        total += got
        if got < batch or time.monotonic() - started >= budget.total_seconds():
            return total
