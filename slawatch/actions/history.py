"""What actions did: the list of attempts, replaying failed ones, pruning old ones.

``slawatch actions`` and ``GET /v1/actions`` read :func:`list_actions`;
``slawatch replay --actions`` runs :func:`replay_actions`: each failed attempt not
retried since runs once more with the values it was bound to, under a savepoint in
its own transaction, recorded as the next attempt (``action_once`` keeps two
replays from both retrying one). Retention (``slawatch run``) prunes attempts
older than its window with :func:`prune_actions`, as it prunes alerts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slawatch.actions.run import Mode, Record, params_of, queries, record, run_one
from slawatch.config.rules import Rule
from slawatch.db import Connection, Database, translate
from slawatch.engine.acting import Due
from slawatch.engine.outbox import iso

STATUSES = ("ok", "failed", "skipped", "would_run")


def list_actions(
    conn: Connection,
    rule: str | None = None,
    status: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """The latest attempts (newest first) as the API and ``--json`` show them."""
    with translate("listing actions"):
        cur = conn.execute(
            queries()["list_actions"], {"rule": rule, "status": status, "limit": limit}
        )
        rows = cur.fetchall()
    keys = ("id", "rule", "key", "episode", "n", "kind", "status", "rows", "error", "at")
    out = []
    for row in rows:
        item = dict(zip(keys, row[:10], strict=True))
        item["at"] = iso(item["at"])
        item["attempt"], item["params"] = row[10], row[11]
        out.append(item)
    return out


@dataclass
class Replayed:
    """What a replay did: attempts that succeeded now, failed again, or would run."""

    ok: int = 0
    failed: int = 0
    would_run: int = 0


def replay_actions(
    db: Database, rules: list[Rule], now: datetime, mode: Mode = "on", rule: str | None = None
) -> Replayed:
    """Run each failed action (of ``rule``, else of every rule that has an action now)
    once more, each in its own transaction; ``mode`` other than "on" only counts
    what would run and writes nothing."""
    acting = {r.name: r for r in rules if r.action is not None and rule in (None, r.name)}
    done = Replayed()
    while acting:

        def one(conn: Connection) -> Record | None:
            with translate("replaying an action"), conn.transaction():
                got = conn.execute(
                    queries()["failed_actions"], {"rules": list(acting), "limit": 1}
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


def _count_failed(db: Database, rules: list[str]) -> int:
    def count(conn: Connection) -> int:
        with translate("counting failed actions"):
            return len(
                conn.execute(
                    queries()["failed_actions"], {"rules": rules, "limit": 1_000_000}
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
