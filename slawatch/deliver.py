"""The delivery loop: due deliveries out of the outbox, to their notifiers.

A pass claims due deliveries under a lease (a fresh owner id per claim, an
expiry), groups them per notifier up to its batch size, sends, and marks them
sent. A failure schedules a retry (capped doubling backoff) or, after the last
attempt, marks them dead with the error text. Every write after the claim
re-checks the lease owner, so a process that stalled past its lease changes
nothing; and a claimed delivery's next attempt is its lease expiry, so the
deliveries of a process that died become due again by themselves.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from slawatch.clock import Clock
from slawatch.db import Connection, translate
from slawatch.notifiers import Notifier
from slawatch.queries import queries

log = logging.getLogger(__name__)

LEASE = timedelta(seconds=60)


@dataclass(frozen=True)
class RetryPolicy:
    """``min(first * 2^(attempt-1), max)`` between attempts; dead after ``attempts``."""

    first: timedelta = timedelta(seconds=1)
    max: timedelta = timedelta(minutes=10)
    attempts: int = 12

    def delay(self, attempt: int) -> timedelta:
        return min(self.first * (1 << min(attempt - 1, 30)), self.max)


@dataclass
class PassResult:
    """What one delivery pass did."""

    sent: int = 0
    retried: int = 0
    dead: int = 0


def alert_payload(row: Mapping[str, Any], description: str = "") -> dict[str, Any]:
    """The alert as receivers see it (DESIGN.md §6)."""
    return {
        "id": f"{row['rule']}:{row['key']}:{row['n']}",
        "rule": row["rule"],
        "key": row["key"],
        "n": row["n"],
        "severity": row["severity"],
        "deadline": _iso(row["deadline"]),
        "due_at": _iso(row["due_at"]),
        "fired_at": _iso(row["fired_at"]),
        "row": row["row_data"],
        "description": description,
    }


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def deliver_once(
    pool: ConnectionPool[Connection],
    notifiers: Mapping[str, Notifier],
    clock: Clock,
    descriptions: Mapping[str, str] | None = None,
    policy: RetryPolicy | None = None,
    limit: int = 1000,
) -> PassResult:
    """Claim, send and settle at most ``limit`` due deliveries."""
    policy = policy or RetryPolicy()
    owner = uuid.uuid4()
    q = queries()
    with pool.connection() as conn, translate("claiming deliveries"):
        cur = conn.cursor(row_factory=dict_row)
        rows = cur.execute(
            q["claim_deliveries"],
            {"now": clock.now(), "owner": owner, "lease": LEASE, "limit": limit},
        ).fetchall()
    result = PassResult()
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["notifier"]].append(row)
    for name, group in groups.items():
        notifier = notifiers.get(name)
        size = notifier.batch if notifier is not None else len(group)
        for start in range(0, len(group), size):
            chunk = group[start : start + size]
            ids = [r["id"] for r in chunk]
            error: str | None
            if notifier is None:
                error = f"notifier {name!r} is not configured"
            else:
                try:
                    notifier.send(
                        [alert_payload(r, (descriptions or {}).get(r["rule"], "")) for r in chunk]
                    )
                    error = None
                except Exception as exc:  # a notifier failing must not stop the loop
                    error = f"{type(exc).__name__}: {exc}"
            with pool.connection() as conn, translate("recording deliveries"):
                if error is None:
                    conn.execute(q["mark_sent"], {"ids": ids, "owner": owner, "now": clock.now()})
                    result.sent += len(ids)
                    continue
                attempts = max(r["attempts"] for r in chunk)
                if attempts >= policy.attempts:
                    conn.execute(q["mark_dead"], {"ids": ids, "owner": owner, "error": error})
                    result.dead += len(ids)
                    log.error("notifier %s: %d deliveries dead: %s", name, len(ids), error)
                else:
                    nxt = clock.now() + policy.delay(attempts)
                    conn.execute(
                        q["mark_retry"], {"ids": ids, "owner": owner, "error": error, "next": nxt}
                    )
                    result.retried += len(ids)
                    log.warning("notifier %s: %d deliveries will retry: %s", name, len(ids), error)
    return result
