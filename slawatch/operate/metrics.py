"""Prometheus metrics of one :class:`~slawatch.runtime.scheduler.Runner`.

Each Runner owns a :class:`Metrics` with its own ``CollectorRegistry`` (never
the process-wide default one), so tests and several runners in one process
do not count into each other. ``GET /metrics`` serves
``prometheus_client.generate_latest(runner.registry)``.

Counters and histograms are counted where the work happens (the scan job,
the delivery workers). The outbox gauges -- pending deliveries, the age of the
oldest, dead ones -- are read from the database at scrape time by
:class:`OutboxCollector`, with a short wait for a connection and a short
``statement_timeout``: a scrape during an outage answers at once with
``slawatch_outbox_up 0`` instead of hanging or failing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from slawatch.clock import Clock
from slawatch.db import Database, DatabaseUnavailable
from slawatch.engine.queries import queries
from slawatch.errors import DatabaseError

log = logging.getLogger(__name__)

# From a receiver that answers at once to one that was down for an hour.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# A drain is a few milliseconds when little is due, up to its time budget (``every``).
SCAN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# A scrape waits this long for a pooled connection, its query runs this long, and the
# whole read this long (a partitioned network answers nothing, not even an error):
# Prometheus gives up on a scrape after 10 s by default, and a late answer tells nothing.
SCRAPE_WAIT = 1.0
SCRAPE_STATEMENT_TIMEOUT = "2s"
SCRAPE_BUDGET = 3.0

OUTCOMES = ("sent", "retry", "dead", "silenced", "summarized", "acknowledged", "orphaned")


class Metrics:
    """The registry of one runner and the metrics it counts.

    ``notifiers()`` names the notifiers configured now (a reload may change them):
    their outbox gauges are reported, as 0 when they have nothing pending.
    """

    def __init__(self, db: Database, clock: Clock, notifiers: Callable[[], Iterable[str]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.alerts = Counter(
            "slawatch_alerts_claimed",
            "Alerts written by the claims, per rule and severity",
            ["rule", "severity"],
            registry=self.registry,
        )
        self.deliveries = Counter(
            "slawatch_deliveries",
            "Deliveries settled, per notifier and outcome (sent, retry, dead, silenced, "
            "summarized: a storm summary was sent instead, acknowledged: its episode was "
            "acknowledged first, orphaned: its notifier was removed)",
            ["notifier", "outcome"],
            registry=self.registry,
        )
        self.summaries = Counter(
            "slawatch_storm_summaries",
            "Storm summaries made, per notifier (each is then delivered like an alert)",
            ["notifier"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "slawatch_delivery_latency_seconds",
            "From an alert's claim (fired_at) to its receiver accepting it, per notifier",
            ["notifier"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.scan = Histogram(
            "slawatch_scan_duration_seconds",
            "Duration of a rule's scan (one drain: every batch claimed in it)",
            ["rule"],
            buckets=SCAN_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(OutboxCollector(db, clock, notifiers))
        self.actions = Counter(
            "slawatch_actions",
            "Attempts of rules' actions, per rule and status (ok, failed, skipped: its "
            "episode was acknowledged or silenced, would_run: SLAWATCH_ACTIONS off/dry-run)",
            ["rule", "status"],
            registry=self.registry,
        )

    def notifier_added(self, name: str) -> None:
        """Show every outcome of ``name`` as 0 before its first delivery (rate() needs it)."""
        for outcome in OUTCOMES:
            self.deliveries.labels(name, outcome)
        self.summaries.labels(name)

    def acted(self, rule: str, status: str) -> None:
        """An attempt of ``rule``'s action was recorded with ``status``."""
        self.actions.labels(rule, status).inc()

    def scanned(self, rule: str, seconds: float, severities: Mapping[str, int]) -> None:
        """A scan of ``rule`` took ``seconds`` and wrote these alerts per severity."""
        self.scan.labels(rule).observe(seconds)
        for severity, count in severities.items():
            if count:
                self.alerts.labels(rule, severity).inc(count)

    def delivered(
        self,
        notifier: str,
        now: datetime,
        fired: Iterable[datetime],
        retried: int = 0,
        dead: int = 0,
        silenced: int = 0,
        summarized: int = 0,
        summaries: int = 0,
        *,
        acknowledged: int = 0,
    ) -> None:
        """A batch of ``notifier`` settled: the alerts fired at ``fired`` were accepted at
        ``now``; ``retried`` will be tried again, ``dead`` will not, ``silenced`` were
        settled unsent (a silence matched), ``summarized`` were settled unsent into the
        ``summaries`` storm summaries made, ``acknowledged`` settled unsent (their
        episode was acknowledged)."""
        latency = self.latency.labels(notifier)
        sent = 0
        for at in fired:
            sent += 1
            # Several processes' clocks: a delivery may look accepted before it fired.
            latency.observe(max((now - at).total_seconds(), 0.0))
        outcomes = (
            ("sent", sent),
            ("retry", retried),
            ("dead", dead),
            ("silenced", silenced),
            ("summarized", summarized),
            ("acknowledged", acknowledged),
        )
        for outcome, count in outcomes:
            if count:
                self.deliveries.labels(notifier, outcome).inc(count)
        if summaries:
            self.summaries.labels(notifier).inc(summaries)

    def orphaned(self, counts: Mapping[str, int]) -> None:
        """Deliveries settled 'orphaned', per notifier no longer configured."""
        for notifier, count in counts.items():
            if count:
                self.deliveries.labels(notifier, "orphaned").inc(count)


class OutboxCollector:
    """Gauges read from the outbox at scrape time, and the database's outage record.

    Never raises and never waits long: when the outbox cannot be read,
    ``slawatch_outbox_up`` is 0 and the outbox gauges are left out.
    """

    def __init__(self, db: Database, clock: Clock, notifiers: Callable[[], Iterable[str]]) -> None:
        self.db, self.clock, self.notifiers = db, clock, notifiers
        self._lock = threading.Lock()
        self._reading: threading.Thread | None = None

    def describe(self) -> Iterator[Metric]:
        # Names only, so that registering reads nothing from the database.
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        up, pending, oldest, dead, outages, outage = self._families()
        try:
            rows = self._read_within(SCRAPE_BUDGET)
        except DatabaseError as exc:
            log.debug("metrics: outbox not read: %s", exc)
            up.add_metric([], 0)
        except Exception as exc:  # a bug: the scrape still answers, and says so
            log.error("metrics: outbox not read: unexpected %s: %s", type(exc).__name__, exc)
            up.add_metric([], 0)
        else:
            up.add_metric([], 1)
            now = self.clock.now()
            for name in sorted(set(self.notifiers()) | set(rows)):
                count, fired, dead_count = rows.get(name, (0, None, 0))
                pending.add_metric([name], count)
                # Several processes' clocks: an alert may look as if it fired a bit ahead.
                age = max((now - fired).total_seconds(), 0.0) if fired is not None else 0.0
                oldest.add_metric([name], age)
                dead.add_metric([name], dead_count)
            yield pending
            yield oldest
            yield dead
        yield up
        outages.add_metric([], self.db.outage.started)
        outage.add_metric([], 1 if self.db.outage.down else 0)
        yield outages
        yield outage

    def _read_within(self, budget: float) -> dict[str, tuple[int, datetime | None, int]]:
        """:meth:`_read` in a thread of its own, given up on after ``budget`` seconds.

        A connection check or a query on a network that drops every packet waits for
        TCP to give up, minutes later; the scrape must not. Until that read ends, later
        scrapes start none (at most one thread waits on a dead network).
        """
        done = threading.Event()
        got: list[dict[str, tuple[int, datetime | None, int]]] = []
        failed: list[BaseException] = []

        def read() -> None:
            try:
                got.append(self._read())
            except BaseException as exc:
                failed.append(exc)
            finally:
                done.set()

        with self._lock:
            if self._reading is not None and self._reading.is_alive():
                raise DatabaseUnavailable("reading the outbox for metrics: the last read hangs")
            self._reading = threading.Thread(target=read, name="metrics-read", daemon=True)
            self._reading.start()
        if not done.wait(budget):
            raise DatabaseUnavailable(f"reading the outbox for metrics: no answer in {budget:g}s")
        if failed:
            raise failed[0]
        return got[0]

    def _read(self) -> dict[str, tuple[int, datetime | None, int]]:
        """Per notifier: (pending, when the oldest pending one's alert fired, dead)."""
        query = queries()["outbox_gauges"]
        what = "reading the outbox for metrics"
        with self.db.connection(what, wait=SCRAPE_WAIT) as conn, conn.transaction():
            # Local to this transaction (so also right behind PgBouncer).
            conn.execute(
                "SELECT set_config('statement_timeout', %s, true)", (SCRAPE_STATEMENT_TIMEOUT,)
            )
            rows = conn.execute(query).fetchall()
        return {str(name): (int(p), fired, int(d)) for name, p, fired, d in rows}

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
    ]:
        return (
            GaugeMetricFamily(
                "slawatch_outbox_up",
                "1 when this scrape read the outbox gauges from the database, 0 when it could "
                "not (database down or every connection busy)",
            ),
            GaugeMetricFamily(
                "slawatch_deliveries_pending",
                "Deliveries not yet accepted (due, in flight or waiting to retry), per notifier",
                labels=["notifier"],
            ),
            GaugeMetricFamily(
                "slawatch_oldest_pending_delivery_age_seconds",
                "Age of the alert of the oldest pending delivery, per notifier (0: none)",
                labels=["notifier"],
            ),
            GaugeMetricFamily(
                "slawatch_deliveries_dead",
                "Deliveries dead after their last attempt (see 'slawatch replay'), per notifier",
                labels=["notifier"],
            ),
            CounterMetricFamily(
                "slawatch_database_outages",
                "Database outages this process has seen start",
            ),
            GaugeMetricFamily(
                "slawatch_database_outage",
                "1 while the database is unreachable for this process, else 0",
            ),
        )
