"""``slawatch run``: one APScheduler interval job per rule; delivery workers beside it."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import FrameType

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.blocking import BlockingScheduler

from slawatch.claim import ClaimPlan, DrainResult, drain, prepare
from slawatch.clock import Clock
from slawatch.db import open_pool
from slawatch.deliver import Dispatcher, PassResult, deliver_due
from slawatch.errors import SlawatchError
from slawatch.notifiers import Notifier, NotifierConfig, build
from slawatch.rules import Rule

log = logging.getLogger(__name__)


class Runner:
    """Owns the connection pool, the rules' claim plans and the notifiers."""

    def __init__(
        self,
        dsn: str,
        rules: list[Rule],
        notifiers: list[NotifierConfig],
        clock: Clock | None = None,
    ) -> None:
        self.dsn = dsn
        self.rules = {r.name: r for r in rules}
        self.clock = clock or Clock()
        # Scans, one delivery worker per notifier, and one to spare.
        self.pool = open_pool(dsn, len(rules) + len(notifiers) + 1)
        try:
            with self.pool.connection() as conn:
                self.plans: dict[str, ClaimPlan] = {r.name: prepare(conn, r) for r in rules}
        except BaseException:
            self.pool.close()
            raise
        self.notifiers: dict[str, Notifier] = {c.name: build(c) for c in notifiers}
        self.descriptions = {r.name: r.description for r in rules}

    def scan(self, rule: str) -> DrainResult | None:
        """Drain one rule; a database error is logged and the next scan tries again."""
        try:
            result = drain(self.pool, self.plans[rule], self.clock)
        except SlawatchError as exc:
            log.error("%s", exc)
            return None
        if result.claimed:
            log.info("rule %s: %d alerts in %d batches", rule, result.claimed, result.batches)
        return result

    def deliver_due(self) -> PassResult:
        """Deliver everything that is due now, notifier by notifier."""
        return deliver_due(self.pool, self.notifiers, self.clock, self.descriptions)

    def once(self) -> None:
        """Drain every rule once, then one delivery pass (``run --once``)."""
        for plan in self.plans.values():
            drain(self.pool, plan, self.clock)  # a database error ends the run (exit 1)
        self.deliver_due()

    def serve(self, seconds: float | None = None) -> None:
        """Run the scheduler until SIGINT/SIGTERM, or for ``seconds``."""
        scheduler = BlockingScheduler(
            executors={"default": ThreadPoolExecutor(len(self.rules) + 1)}, timezone=UTC
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

        def stop(signum: int | None = None, frame: FrameType | None = None) -> None:
            if scheduler.running:
                log.info("stopping: letting running scans and deliveries finish")
                scheduler.shutdown(wait=True)

        dispatcher = Dispatcher(self.dsn, self.pool, self.notifiers, self.clock, self.descriptions)
        timer = threading.Timer(seconds, stop) if seconds is not None else None
        with _signals(stop):
            dispatcher.start()
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                scheduler.start()
            finally:
                if timer is not None:
                    timer.cancel()
                dispatcher.stop()

    def close(self) -> None:
        for notifier in self.notifiers.values():
            notifier.close()
        self.pool.close()


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
