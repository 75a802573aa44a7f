"""The delivery loop: due deliveries out of the outbox, to their notifiers.

Per notifier, a pass claims up to ``batch`` due deliveries under a lease (a
fresh owner id per claim, an expiry), sends them in one request/message
group/e-mail, and settles them: sent; or a retry at ``min(first *
2^(attempt-1), max)`` with jitter, or when the receiver said so (Retry-After);
or dead, with the error text, after the last attempt or at once when the
failure is permanent. Every write after the claim re-checks the lease owner,
so a process that stalled past its lease changes nothing; a claimed delivery's
next attempt is its lease expiry, so the deliveries of a process that died
become due again by themselves.

:class:`Dispatcher` runs one worker thread per notifier (a slow receiver holds
up only its own deliveries) and a listener that wakes them on the claim's
``NOTIFY``, polling as the fallback.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from slawatch.clock import Clock
from slawatch.db import Connection, describe, translate
from slawatch.errors import DeliveryError, SlawatchError
from slawatch.notifiers import Notifier
from slawatch.queries import queries

log = logging.getLogger(__name__)

CHANNEL = "slawatch_delivery"
POLL = 1.0  # seconds: the fallback when no NOTIFY arrives


@dataclass
class PassResult:
    """What a delivery pass did."""

    sent: int = 0
    retried: int = 0
    dead: int = 0

    def __iadd__(self, other: PassResult) -> PassResult:
        self.sent += other.sent
        self.retried += other.retried
        self.dead += other.dead
        return self

    @property
    def total(self) -> int:
        return self.sent + self.retried + self.dead


def alert_payload(row: Mapping[str, Any], description: str = "") -> dict[str, Any]:
    """The alert as receivers see it (DESIGN.md §6)."""
    return {
        "id": alert_id(row["rule"], row["key"], row["episode"], row["n"]),
        "rule": row["rule"],
        "key": row["key"],
        "episode": row["episode"],
        "n": row["n"],
        "severity": row["severity"],
        "deadline": _iso(row["deadline"]),
        "due_at": _iso(row["due_at"]),
        "fired_at": _iso(row["fired_at"]),
        "row": row["row_data"],
        "description": description,
    }


def alert_id(rule: str, key: str, episode: int, n: int) -> str:
    """The idempotency id: one readable string naming rule, key, episode and n, e.g.
    ``order_unshipped:42:e1:n3``. The rule name has no ``:`` and the last two parts
    are numbers, so the id reads back unambiguously whatever the key holds."""
    return f"{rule}:{key}:e{episode}:n{n}"


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def lease_for(notifier: Notifier) -> timedelta:
    """Long enough for one send to time out, with room to record the outcome."""
    return timedelta(seconds=2 * notifier.timeout + 2)


def retry_delay(notifier: Notifier, attempt: int, error: DeliveryError) -> timedelta:
    """When to try again: the receiver's Retry-After, else backoff with jitter."""
    if error.retry_after is not None:
        return timedelta(seconds=error.retry_after)
    # Jitter spreads the retries of many deliveries that failed together.
    return notifier.retry.delay(attempt) * random.uniform(0.8, 1.0)


def deliver_batch(
    pool: ConnectionPool[Connection],
    notifier: Notifier,
    clock: Clock,
    descriptions: Mapping[str, str] | None = None,
) -> PassResult:
    """Claim, send and settle at most one batch of ``notifier``'s due deliveries."""
    q = queries()
    owner = uuid.uuid4()
    with pool.connection() as conn, translate(f"claiming deliveries for {notifier.name}"):
        rows = (
            conn.cursor(row_factory=dict_row)
            .execute(
                q["claim_deliveries"],
                {
                    "now": clock.now(),
                    "owner": owner,
                    "lease": lease_for(notifier),
                    "limit": notifier.batch,
                    "notifier": notifier.name,
                },
            )
            .fetchall()
        )
    if not rows:
        return PassResult()
    ids = [r["id"] for r in rows]
    descriptions = descriptions or {}
    try:
        notifier.send([alert_payload(r, descriptions.get(r["rule"], "")) for r in rows])
        error: DeliveryError | None = None
    except DeliveryError as exc:
        error = exc
    except Exception as exc:  # a notifier bug must not stop the loop; keep its words
        error = DeliveryError(f"{type(exc).__name__}: {exc}")
    with pool.connection() as conn, translate(f"recording deliveries for {notifier.name}"):
        if error is None:
            conn.execute(q["mark_sent"], {"ids": ids, "owner": owner, "now": clock.now()})
            return PassResult(sent=len(ids))
        attempts = max(r["attempts"] for r in rows)
        if error.permanent or attempts >= notifier.retry.attempts:
            conn.execute(q["mark_dead"], {"ids": ids, "owner": owner, "error": str(error)})
            why = "permanent failure" if error.permanent else f"attempt {attempts}, the last"
            log.error(
                "notifier %s: %d deliveries dead (%s): %s", notifier.name, len(ids), why, error
            )
            return PassResult(dead=len(ids))
        nxt = clock.now() + retry_delay(notifier, attempts, error)
        conn.execute(
            q["mark_retry"], {"ids": ids, "owner": owner, "error": str(error), "next": nxt}
        )
        log.warning(
            "notifier %s: %d deliveries will retry at %s (attempt %d): %s",
            notifier.name,
            len(ids),
            nxt.isoformat(timespec="seconds"),
            attempts,
            error,
        )
        return PassResult(retried=len(ids))


def deliver_notifier(
    pool: ConnectionPool[Connection],
    notifier: Notifier,
    clock: Clock,
    descriptions: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
) -> PassResult:
    """Batches until none is due; stops early when the receiver fails (it is down)."""
    total = PassResult()
    while stop is None or not stop.is_set():
        result = deliver_batch(pool, notifier, clock, descriptions)
        total += result
        if result.sent < notifier.batch:  # a short batch, or a failure
            break
    return total


def deliver_due(
    pool: ConnectionPool[Connection],
    notifiers: Mapping[str, Notifier],
    clock: Clock,
    descriptions: Mapping[str, str] | None = None,
) -> PassResult:
    """One pass over every notifier (``run --once``)."""
    total = PassResult()
    for notifier in notifiers.values():
        total += deliver_notifier(pool, notifier, clock, descriptions)
    return total


class Dispatcher:
    """Delivery worker threads, one per notifier, woken by NOTIFY or by the poll."""

    def __init__(
        self,
        dsn: str,
        pool: ConnectionPool[Connection],
        notifiers: Mapping[str, Notifier],
        clock: Clock,
        descriptions: Mapping[str, str] | None = None,
        poll: float = POLL,
    ) -> None:
        self.dsn, self.pool, self.notifiers = dsn, pool, notifiers
        self.clock, self.descriptions, self.poll = clock, descriptions, poll
        self._stop = threading.Event()
        self._wake = {name: threading.Event() for name in notifiers}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for name, notifier in self.notifiers.items():
            t = threading.Thread(
                target=self._work, args=(notifier,), name=f"deliver-{name}", daemon=True
            )
            self._threads.append(t)
        self._threads.append(threading.Thread(target=self._listen, name="listen", daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Let each worker finish the batch in hand, then return."""
        self._stop.set()
        self.wake()
        for t in self._threads:
            t.join()

    def wake(self) -> None:
        for event in self._wake.values():
            event.set()

    def _work(self, notifier: Notifier) -> None:
        wake = self._wake[notifier.name]
        while not self._stop.is_set():
            try:
                deliver_notifier(self.pool, notifier, self.clock, self.descriptions, self._stop)
            except SlawatchError as exc:
                log.error("%s", exc)
            wake.wait(self.poll)
            wake.clear()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._stop.is_set():
                        # A short timeout only to notice stop(); a NOTIFY returns at once.
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.wake()
            except psycopg.Error as exc:
                log.warning("LISTEN %s: %s; polling every %gs", CHANNEL, describe(exc), self.poll)
                self._stop.wait(self.poll)
