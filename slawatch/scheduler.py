"""``slawatch run``: one APScheduler interval job per rule; delivery workers beside it.

A scan job never raises. APScheduler 3.11 would catch an exception from a job,
log it with its traceback and keep the job scheduled; we do not rely on that:
:meth:`Runner.scan` handles every failure itself, so that a database outage is
the database's one line, a rule that keeps failing is one line when it starts
and one when it ends, and a failing rule backs off instead of retrying every tick.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import FrameType

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from slawatch import scans
from slawatch.claim import ClaimPlan, DrainResult, drain, prepare_all
from slawatch.clock import Clock
from slawatch.db import Database, DatabaseUnavailable, Pooler, PreparedStatementLost
from slawatch.deliver import BACKOFF_CAP, POLL, Dispatcher, PassResult, deliver_notifier
from slawatch.durations import format_duration
from slawatch.errors import SlawatchError
from slawatch.maintain import EVERY as MAINTAIN_EVERY
from slawatch.maintain import PruneResult, prune
from slawatch.notifiers import Notifier, NotifierConfig, build
from slawatch.outage import Backoff, Outage
from slawatch.rules import Rule
from slawatch.settings import DEFAULT_RETENTION

log = logging.getLogger(__name__)


@dataclass
class OnceResult:
    """What ``run --once`` did; ``errors`` are the one-line failures it met."""

    claimed: int = 0
    delivered: PassResult = field(default_factory=PassResult)
    errors: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """A database error happened or a delivery went dead: exit 1."""
        return bool(self.errors) or self.delivered.dead > 0


class Runner:
    """Owns the database, the rules' claim plans and the notifiers.

    ``timeout``: seconds to wait for a database connection (``SLAWATCH_DB_TIMEOUT``);
    ``pooler``: ``"transaction"`` behind PgBouncer in transaction mode
    (``SLAWATCH_POOLER``); ``poll``: seconds between delivery polls when no NOTIFY
    comes; ``backoff_cap``: the longest wait after a failure; ``retention``: how
    long alert history is kept (``SLAWATCH_RETENTION``), pruned every ``maintain_every``.
    """

    def __init__(
        self,
        dsn: str,
        rules: list[Rule],
        notifiers: list[NotifierConfig],
        clock: Clock | None = None,
        *,
        timeout: float = 30.0,
        pooler: Pooler = "auto",
        poll: float = POLL,
        backoff_cap: float = BACKOFF_CAP,
        retention: timedelta = DEFAULT_RETENTION,
        maintain_every: timedelta = MAINTAIN_EVERY,
    ) -> None:
        self.rules = {r.name: r for r in rules}
        self.clock = clock or Clock()
        self.poll, self.backoff_cap = poll, backoff_cap
        self.retention, self.maintain_every = retention, maintain_every
        # Scans, the delivery workers (`concurrency` per notifier), the listener's
        # probe, pruning, and one to spare.
        self.concurrency = {c.name: c.concurrency for c in notifiers}
        size = len(rules) + sum(self.concurrency.values()) + 3
        self.db = Database(dsn, size=size, timeout=timeout, pooler=pooler)
        try:
            with self.db.connection("reading the watched tables") as conn:
                # Every rule not ready to run is named at once.
                self.plans: dict[str, ClaimPlan] = prepare_all(conn, rules)
        except BaseException:
            self.db.close()
            raise
        self.notifiers: dict[str, Notifier] = {c.name: build(c) for c in notifiers}
        self.descriptions = {r.name: r.description for r in rules}
        self._scan_trouble = {name: Outage(f"rule {name}: scans", log) for name in self.rules}
        self._scan_backoff = {name: Backoff(cap=backoff_cap) for name in self.rules}
        self._scan_retry_at = dict.fromkeys(self.rules, 0.0)
        self._maintain_trouble = Outage("pruning history", log)
        self._stop = threading.Event()

    def scan(self, rule: str) -> DrainResult | None:
        """Drain one rule; never raises. After a failure the rule's scans back off."""
        since = time.monotonic()
        if since < self._scan_retry_at[rule]:
            return None
        try:
            result = scans.recorded(self.db, rule, self.clock, self._drain)
        except DatabaseUnavailable:
            result = None  # the database's outage line says it
        except SlawatchError as exc:
            self._scan_trouble[rule].failed(str(exc), since)
            result = None
        except Exception as exc:  # a bug: keep scanning the other rules, and this one later
            self._scan_trouble[rule].failed(
                f"unexpected {type(exc).__name__}: {exc}", since, exc_info=exc
            )
            result = None
        if result is None:
            self._scan_retry_at[rule] = time.monotonic() + self._scan_backoff[rule].next()
            return None
        self._scan_trouble[rule].ok()
        self._scan_backoff[rule].reset()
        self._scan_retry_at[rule] = 0.0
        if result.claimed:
            log.info("rule %s: %d alerts in %d batches", rule, result.claimed, result.batches)
        return result

    def maintain(self) -> PruneResult | None:
        """Prune history older than the retention; never raises.

        It runs every ``maintain_every``, so a failure simply waits for the next run.
        """
        since = time.monotonic()
        try:
            result = prune(self.db, self.clock, self.retention)
        except DatabaseUnavailable:
            return None  # the database's outage line says it
        except SlawatchError as exc:
            self._maintain_trouble.failed(str(exc), since)
            return None
        except Exception as exc:  # a bug: scans and deliveries go on, and so does this job
            self._maintain_trouble.failed(
                f"unexpected {type(exc).__name__}: {exc}", since, exc_info=exc
            )
            return None
        self._maintain_trouble.ok()
        if result.alerts or result.deliveries:
            log.info(
                "pruned %d alerts and %d deliveries older than %s",
                result.alerts,
                result.deliveries,
                format_duration(self.retention),
            )
        return result

    def _drain(self, rule: str) -> DrainResult:
        try:
            return drain(self.db, self.plans[rule], self.clock)
        except PreparedStatementLost:
            # The failed batch rolled back and prepared statements are off now.
            return drain(self.db, self.plans[rule], self.clock)

    def once(self) -> OnceResult:
        """Drain every rule once, then one delivery pass (``run --once``).

        Every rule and notifier gets its turn even when another failed (the
        failures are in the result), unless the database is unreachable: then
        waiting for it once more per rule would only delay the exit.
        """
        result = OnceResult()
        try:
            for name in self.plans:
                try:
                    result.claimed += self._drain(name).claimed
                except DatabaseUnavailable:
                    raise
                except SlawatchError as exc:
                    result.errors.append(str(exc))
            for notifier in self.notifiers.values():
                try:
                    result.delivered += deliver_notifier(
                        self.db, notifier, self.clock, self.descriptions
                    )
                except DatabaseUnavailable:
                    raise
                except SlawatchError as exc:
                    result.errors.append(str(exc))
        except DatabaseUnavailable as exc:
            result.errors.append(str(exc))
        return result

    def serve(self, seconds: float | None = None) -> None:
        """Scan and deliver until SIGINT/SIGTERM, :meth:`stop`, or ``seconds`` passed."""
        scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(len(self.rules) + 2)}, timezone=UTC
        )
        now = datetime.now(UTC)
        for name, rule in self.rules.items():
            every = rule.every.total_seconds()
            scheduler.add_job(
                self.scan,
                "interval",
                seconds=every,
                args=[name],
                id=f"scan:{name}",
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(int(every), 1),
                next_run_time=now,
            )
        every = self.maintain_every.total_seconds()
        scheduler.add_job(
            self.maintain,
            "interval",
            seconds=every,
            id="maintain",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(int(every), 1),
            # After the first scans: a restart catches up on pruning without delaying alerts.
            next_run_time=now + timedelta(seconds=min(every, 30)),
        )

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop()

        dispatcher = Dispatcher(
            self.db,
            self.notifiers,
            self.clock,
            self.descriptions,
            poll=self.poll,
            backoff_cap=self.backoff_cap,
            concurrency=self.concurrency,
        )
        with _signals(on_signal):
            dispatcher.start()
            scheduler.start()
            try:
                self._stop.wait(seconds)
            finally:
                log.info("stopping: letting running scans and deliveries finish")
                scheduler.shutdown(wait=True)
                dispatcher.stop()

    def stop(self) -> None:
        """Make :meth:`serve` return (from any thread or a signal handler)."""
        self._stop.set()

    def close(self) -> None:
        """Close the notifiers and the database pool."""
        for notifier in self.notifiers.values():
            notifier.close()
        self.db.close()


@contextmanager
def _signals(handler: signal._HANDLER) -> Iterator[None]:
    """Install ``handler`` for SIGINT and SIGTERM while inside (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
