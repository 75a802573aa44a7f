"""Prometheus metrics of one :class:`~slawatch.runtime.scheduler.Runner`.

Each Runner owns a :class:`Metrics` with its own ``CollectorRegistry`` (never
the process-wide default one), so tests and several runners in one process
do not count into each other. ``GET /metrics`` serves
``prometheus_client.generate_latest(runner.registry)``.

Counters and histograms are counted where the work happens (the scan job,
the delivery workers, the admin API's ``POST /v1/events``, the broker sources).
The outbox gauges -- pending deliveries, the age of the oldest, dead ones -- and
the open timers of each event rule are read from the database at scrape time by
:class:`OutboxCollector`, with a short wait for a connection and a short
``statement_timeout``: a scrape during an outage answers at once with
``slawatch_outbox_up 0`` instead of hanging or failing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from psycopg import sql

from slawatch.clock import Clock
from slawatch.config.rules import ACTION_TARGET, Rule
from slawatch.db import Connection, Database, DatabaseUnavailable, translate
from slawatch.delivery.dispatcher import Settled
from slawatch.engine.queries import queries
from slawatch.engine.timers import event_rules, known_types
from slawatch.errors import DatabaseError
from slawatch.events.ingest import Ingested
from slawatch.operate.inspect import COUNT_LIMIT, open_timers_statement

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
# The type label of a rejected event whose type no rule uses (or that has none): the
# label takes only the rules' types, so a producer's garbage cannot grow the series.
OTHER_TYPE = "-"
# Held events (slawatch.event_held), counted up to COUNT_LIMIT.
_HELD = f"SELECT count(*) FROM (SELECT 1 FROM slawatch.event_held LIMIT {COUNT_LIMIT}) h"
# Per notifier: (pending deliveries, when the oldest one's alert fired, dead deliveries).
_Outbox = dict[str, tuple[int, datetime | None, int]]


class Metrics:
    """The registry of one runner and the metrics it counts.

    ``notifiers()`` names the notifiers configured now (a reload may change them):
    their outbox gauges are reported, as 0 when they have nothing pending.
    ``rules()``: the rules running now; each event rule's open timers are reported.
    """

    def __init__(
        self,
        db: Database,
        clock: Clock,
        notifiers: Callable[[], Iterable[str]],
        rules: Callable[[], Iterable[Rule]] = lambda: (),
    ) -> None:
        self.rules = rules
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
        self._scan_children: dict[str, Histogram] = {}
        self.scan_failures = Counter(
            "slawatch_scan_failures",
            "Scans of a rule that failed other than by the database being unreachable "
            "(that is slawatch_database_outages): a claim the database refused, a bug. "
            "The log says why, once when the rule's scans start failing ('rule R: scans "
            "failing: ...') and once when they work again",
            ["rule"],
            registry=self.registry,
        )
        self.generation_mismatch = Gauge(
            "slawatch_rule_generation_mismatch",
            "1 while this process runs a definition of the rule that is not the one "
            "'slawatch migrate' recorded: it does not claim the rule until reloaded with "
            "the recorded definition (docs/how-to/rolling-deploys.md)",
            ["rule"],
            registry=self.registry,
        )
        self.events = Counter(
            "slawatch_events",
            "Events received by this process, per type, source (http: POST /v1/events; ping: "
            "/ping/<key>, a wrong key rejected; or a broker source's name) and outcome "
            "(accepted, duplicate: a repeat of its type and id, dropped; rejected: refused "
            "as malformed or of a type no rule uses, "
            f"counted as type {OTHER_TYPE!r} then). Events written with slawatch.event() in "
            "SQL or 'slawatch event' do not pass through this process and are not counted",
            ["type", "source", "outcome"],
            registry=self.registry,
        )
        self.abandoned_episodes = Counter(
            "slawatch_abandoned",
            "Episodes ended as abandoned, per rule: still open give_up_after past their due "
            "time (an event rule's start without its stop, a row that stayed overdue)",
            ["rule"],
            registry=self.registry,
        )
        self.registry.register(OutboxCollector(db, clock, notifiers, rules))
        self.actions = Counter(
            "slawatch_actions",
            "Attempts of rules' actions, per rule and status (ok, failed, skipped: its "
            "episode was acknowledged or silenced, or its row over 64 KiB was cut without a "
            "column a placeholder reads, would_run: SLAWATCH_ACTIONS off/dry-run, "
            "pending: a webhook action queued, its outcome counted when its delivery settles, "
            "retry: a row held past lock_timeout or the batch's time ran out, run again at "
            "the rule's next scan)",
            ["rule", "status"],
            registry=self.registry,
        )

    def abandoned(self, counts: Mapping[str, int]) -> None:
        """Episodes of these rules ended as abandoned (rule ``give_up_after``)."""
        for rule, count in counts.items():
            self.abandoned_episodes.labels(rule).inc(count)

    def notifier_added(self, name: str) -> None:
        """Show every outcome of ``name`` as 0 before its first delivery (rate() needs it)."""
        for outcome in OUTCOMES:
            self.deliveries.labels(name, outcome)
        self.summaries.labels(name)

    def acted(self, rule: str, status: str) -> None:
        """An attempt of ``rule``'s action was recorded with ``status``."""
        self.actions.labels(rule, status).inc()

    def rule_added(self, rule: str) -> None:
        """Show ``rule``'s failed scans as 0 before its first scan (increase() needs it:
        a rule failing from its first scan would appear at 1, its first failure unseen);
        its abandoned episodes likewise."""
        self.scan_failures.labels(rule)
        self.abandoned_episodes.labels(rule)
        self.generation_mismatch.labels(rule).set(0)

    def definition(self, rule: str, stale: bool) -> None:
        """``rule``'s loaded definition turned stale, or the recorded one again."""
        self.generation_mismatch.labels(rule).set(1 if stale else 0)

    def scanned(self, rule: str, seconds: float, severities: Mapping[str, int]) -> None:
        """A scan of ``rule`` took ``seconds`` and wrote these alerts per severity."""
        # Each rule's child of the histogram, looked up once: every scan observes it.
        child = self._scan_children.get(rule)
        if child is None:
            child = self._scan_children[rule] = self.scan.labels(rule)
        child.observe(seconds)
        for severity, count in severities.items():
            if count:
                self.alerts.labels(rule, severity).inc(count)

    def scan_failed(self, rule: str) -> None:
        """A scan of ``rule`` failed (the database was reachable)."""
        self.scan_failures.labels(rule).inc()

    def delivered(self, batch: Settled) -> None:
        """A batch of deliveries settled: the latency of each alert sent, and a count
        per outcome."""
        notifier = batch.notifier
        latency = self.latency.labels(notifier)
        sent = len(batch.fired)
        for at in batch.fired:
            # Several processes' clocks: a delivery may look accepted before it fired.
            latency.observe(max((batch.accepted - at).total_seconds(), 0.0))
        outcomes = (
            ("sent", sent),
            ("retry", batch.retried),
            ("dead", batch.dead),
            ("silenced", batch.silenced),
            ("summarized", batch.summarized),
            ("acknowledged", batch.acknowledged),
        )
        for outcome, count in outcomes:
            if count:
                self.deliveries.labels(notifier, outcome).inc(count)
        if batch.summaries:
            self.summaries.labels(notifier).inc(batch.summaries)
        # A webhook action's delivery settles its attempt (0005/0008's trigger): counted
        # as an sql action's attempt is when it runs. A retry leaves it pending.
        self._webhook_acted(
            notifier, ok=sent, failed=batch.dead, skipped=batch.silenced + batch.acknowledged
        )

    def events_ingested(self, source: str, got: Ingested) -> None:
        """What one batch from ``source`` stored (:func:`slawatch.events.ingest.ingest`)."""
        for (kind, outcome), count in got.by_type.items():
            if count:
                self.events.labels(kind, source, outcome).inc(count)

    def events_rejected(self, source: str, types: Iterable[object] = (None,)) -> None:
        """Events from ``source`` refused before they were stored: one per item of
        ``types``, each the event's ``type`` as received (anything: a type no rule uses
        now, or none, is counted as :data:`OTHER_TYPE`). A batch refused whole counts
        each of its events."""
        known = known_types(list(self.rules()))
        counts: dict[str, int] = {}
        for kind in types:
            label = kind if isinstance(kind, str) and kind in known else OTHER_TYPE
            counts[label] = counts.get(label, 0) + 1
        for label, count in counts.items():
            self.events.labels(label, source, "rejected").inc(count)

    def orphaned(self, counts: Mapping[str, int]) -> None:
        """Deliveries settled 'orphaned', per notifier no longer configured (a webhook
        action's: its attempt 'failed')."""
        for notifier, count in counts.items():
            if count:
                self.deliveries.labels(notifier, "orphaned").inc(count)
                self._webhook_acted(notifier, failed=count)

    def _webhook_acted(self, notifier: str, ok: int = 0, failed: int = 0, skipped: int = 0) -> None:
        """Count the attempts that settled with deliveries to ``notifier`` when it is a
        webhook action's target (``action:<rule>``)."""
        if not notifier.startswith(ACTION_TARGET):
            return
        rule = notifier.removeprefix(ACTION_TARGET)
        for status, count in (("ok", ok), ("failed", failed), ("skipped", skipped)):
            if count:
                self.actions.labels(rule, status).inc(count)


class OutboxCollector:
    """Gauges read from the outbox (and the event rules' timer tables) at scrape time,
    and the database's outage record.

    Never raises and never waits long: when the outbox cannot be read,
    ``slawatch_outbox_up`` is 0 and the outbox and timer gauges are left out; an event
    rule whose timers cannot be counted (its table not migrated yet) is left out.
    """

    def __init__(
        self,
        db: Database,
        clock: Clock,
        notifiers: Callable[[], Iterable[str]],
        rules: Callable[[], Iterable[Rule]] = lambda: (),
    ) -> None:
        self.db, self.clock, self.notifiers, self.rules = db, clock, notifiers, rules
        self._lock = threading.Lock()
        self._reading: threading.Thread | None = None

    def describe(self) -> Iterator[Metric]:
        # Names only, so that registering reads nothing from the database.
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        up, pending, oldest, dead, outages, outage, timers, held = self._families()
        try:
            rows, open_timers, held_events = self._read_within(SCRAPE_BUDGET)
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
            for rule, count in sorted(open_timers.items()):
                timers.add_metric([rule], count)
            yield timers
            held.add_metric([], held_events)
            yield held
        yield up
        outages.add_metric([], self.db.outage.started)
        outage.add_metric([], 1 if self.db.outage.down else 0)
        yield outages
        yield outage

    def _read_within(self, budget: float) -> tuple[_Outbox, dict[str, int], int]:
        """:meth:`_read` in a thread of its own, given up on after ``budget`` seconds.

        A connection check or a query on a network that drops every packet waits for
        TCP to give up, minutes later; the scrape must not. Until that read ends, later
        scrapes start none (at most one thread waits on a dead network).
        """
        done = threading.Event()
        got: list[tuple[_Outbox, dict[str, int], int]] = []
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

    def _read(self) -> tuple[_Outbox, dict[str, int], int]:
        """Per notifier: (pending, when the oldest pending one's alert fired, dead); per
        event rule: its open timers; the events held (types no rule knew)."""
        query = queries()["outbox_gauges"]
        what = "reading the outbox for metrics"
        with self.db.connection(what, wait=SCRAPE_WAIT) as conn, conn.transaction():
            # Local to this transaction (so also right behind PgBouncer).
            conn.execute(
                "SELECT set_config('statement_timeout', %s, true)", (SCRAPE_STATEMENT_TIMEOUT,)
            )
            rows = conn.execute(query).fetchall()
            timers = _open_timers(conn, event_rules(list(self.rules())))
            with translate("counting held events for metrics"):
                row = conn.execute(_HELD).fetchone()
        outbox = {str(name): (int(p), fired, int(d)) for name, p, fired, d in rows}
        return outbox, timers, int(row[0]) if row else 0

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
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
            GaugeMetricFamily(
                "slawatch_timers_open",
                "Open deadlines (timers) of each event rule: started, not yet stopped; "
                f"counted up to {COUNT_LIMIT} through the timer table's partial indexes",
                labels=["rule"],
            ),
            GaugeMetricFamily(
                "slawatch_events_held",
                "Events of types slawatch.event() knew no rule for, kept in slawatch.event_held"
                f" until a migrate brings their rule (counted up to {COUNT_LIMIT})",
            ),
        )


def _open_timers(conn: Connection, rules: list[Rule]) -> dict[str, int]:
    """Each of ``rules``' open timers, in one statement; a rule whose timer table is not
    there (not migrated yet) is left out."""
    if not rules:
        return {}
    with translate("finding the timer tables for metrics"):
        there = {
            str(name)
            for (name,) in conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = 'slawatch'::regnamespace"
                " AND relname = ANY(%s)",
                ([r.timers for r in rules],),
            ).fetchall()
        }
    counted = [r for r in rules if r.timers in there]
    if not counted:
        return {}
    statement = sql.SQL(" UNION ALL ").join(
        sql.SQL("SELECT {}::text, ({})").format(sql.Literal(r.name), open_timers_statement(r))
        for r in counted
    )
    with translate("counting open timers for metrics"):
        return {str(name): int(n) for name, n in conn.execute(statement).fetchall()}
