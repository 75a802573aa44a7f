"""``slawatch run``: APScheduler interval jobs that scan the rules, a step of rules
each (:meth:`Runner.scan_step`); delivery workers beside it.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.job import Job
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from slawatch import __version__
from slawatch.actions.history import prune_actions
from slawatch.actions.run import Mode, retry_held, runner
from slawatch.clock import Clock
from slawatch.config.durations import format_duration
from slawatch.config.notifiers import NotifierConfig
from slawatch.config.rules import Rule, action_targets
from slawatch.config.settings import DEFAULT_OUTBOX, DEFAULT_RETENTION, Outbox
from slawatch.config.sources import SourceConfig
from slawatch.db import (
    PREPARED_MAX,
    Database,
    DatabaseUnavailable,
    Pooler,
    PreparedStatementLost,
    lock_not_had,
    redact,
)
from slawatch.delivery.dispatcher import (
    BACKOFF_CAP,
    POLL,
    Dispatcher,
    PassResult,
    deliver_notifier,
    settle_orphans,
)
from slawatch.delivery.notifiers import Notifier, build
from slawatch.engine.abandon import give_up
from slawatch.engine.claim import ClaimPlan, DrainResult, drain, fill_due
from slawatch.engine.ready import needs_migrate, prepare_all, prepare_ready
from slawatch.engine.steps import askable, probe_step
from slawatch.engine.timers import DEDUPE, known_types
from slawatch.errors import ConfigError, SlawatchError
from slawatch.events.ingest import Ingested
from slawatch.events.sources import Drained, Recorder, SourceRunner
from slawatch.events.sources import build as build_consumer
from slawatch.events.sources.runner import POLL as SOURCE_POLL
from slawatch.operate.metrics import Metrics
from slawatch.outage import Backoff, Outage
from slawatch.runtime import scans
from slawatch.runtime.definitions import Definitions
from slawatch.runtime.executor import ScanExecutor, ScanJobStore
from slawatch.runtime.maintain import EVERY as MAINTAIN_EVERY
from slawatch.runtime.maintain import PruneResult, prune, prune_events

log = logging.getLogger(__name__)
# Maintenance orphans a delivery to a notifier this process does not have only once
# it was due this long: another instance may have that notifier (a fleet mid-reload).
ORPHAN_GRACE = timedelta(minutes=10)
# Connections the scans of all rules share, by default (SLAWATCH_SCAN_CONNECTIONS).
SCAN_CONNECTIONS = 2
# Seconds over which the first scans of rules started together are spread (staggered).
STAGGER = 1.0
# The shortest step between those first scans (staggered): more rules share a step.
SLOT = 0.02
# Rules per step, where the steps allow (staggered): a step's idle rules are asked
# whether anything is due in one statement (Runner.scan_step).
STEP_RULES = 20
# Seconds between looks at the database (Runner.watch), and the longest wait for a
# pooled connection in one.
WATCH_EVERY = 2.0
WATCH_WAIT = 2.0
# The line per scan that did work, apart from the rest (``slawatch demo`` leaves it out).
activity = logging.getLogger("slawatch.activity")


@dataclass
class OnceResult:
    """What ``run --once`` did, per rule and per notifier; ``errors`` are the one-line
    failures it met. A rule or notifier whose turn failed (or never came, the database
    being down) is None."""

    rules: dict[str, DrainResult | None] = field(default_factory=dict)
    notifiers: dict[str, PassResult | None] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    sources: dict[str, Drained | None] = field(default_factory=dict)

    @property
    def claimed(self) -> int:
        return sum(r.claimed for r in self.rules.values() if r is not None)

    @property
    def delivered(self) -> PassResult:
        total = PassResult()
        for result in self.notifiers.values():
            if result is not None:
                total += result
        return total

    @property
    def failed(self) -> bool:
        """A database error happened or a delivery went dead: exit 1."""
        return bool(self.errors) or self.delivered.dead > 0

    def lines(self) -> list[str]:
        """One line per rule and per notifier, for people."""
        lines = []
        for name, got in self.sources.items():
            done = (
                "not drained (see the error)"
                if got is None
                else f"{got.accepted} accepted, {got.duplicates} duplicates,"
                f" {got.set_aside} set aside"
            )
            lines.append(f"source {name}: {done}")
        for name, rule in self.rules.items():
            done = (
                "not scanned (see the error)"
                if rule is None
                else (f"{rule.claimed} claimed, {rule.closed} closed")
            )
            lines.append(f"rule {name}: {done}")
        for name, sent in self.notifiers.items():
            done = (
                "no delivery pass (see the error)"
                if sent is None
                else (f"{sent.sent} sent, {sent.retried} retried, {sent.dead} dead")
                + (f", {sent.summarized} summarized" if sent and sent.summarized else "")
                + (f", {sent.acknowledged} acknowledged" if sent and sent.acknowledged else "")
            )
            lines.append(f"notifier {name}: {done}")
        return lines

    def as_json(self) -> dict[str, Any]:
        """The same, for scripts (``run --once --json``)."""
        out: dict[str, Any] = {
            "ok": not self.failed,
            "rules": {
                name: None if r is None else {"claimed": r.claimed, "closed": r.closed}
                for name, r in self.rules.items()
            },
            "notifiers": {
                name: None if p is None else {"sent": p.sent, "retried": p.retried, "dead": p.dead}
                for name, p in self.notifiers.items()
            },
            "errors": self.errors,
        }
        if self.sources:
            out["sources"] = {
                name: None
                if d is None
                else {"accepted": d.accepted, "duplicates": d.duplicates, "set_aside": d.set_aside}
                for name, d in self.sources.items()
            }
        return out


@dataclass
class Step:
    """One step's scan job (Runner.scan_step): its rules, and how its statement fails."""

    names: list[str]
    trouble: Outage  # the statement failing: its rules are scanned one by one meanwhile
    bugs: Outage  # an unexpected exception in the step's job
    backoff: Backoff
    retry_at: float = 0.0  # time.monotonic() before which the statement is not tried

    @classmethod
    def of(cls, names: list[str], backoff_cap: float) -> Step:
        what = f"the probes of the step of rule {names[0]}"
        return cls(
            names,
            Outage(what, log, level=logging.WARNING),
            Outage(what, log),
            Backoff(cap=backoff_cap),
        )


@dataclass
class _Running:
    """A rule being scanned: its claim plan, and how its scans are failing."""

    rule: Rule
    plan: ClaimPlan
    trouble: Outage
    backoff: Backoff
    retry_at: float = 0.0  # time.monotonic() before which a failing rule waits

    @classmethod
    def start(cls, rule: Rule, plan: ClaimPlan, backoff_cap: float) -> _Running:
        return cls(rule, plan, Outage(f"rule {rule.name}: scans", log), Backoff(cap=backoff_cap))


class LoggedEvents:
    """The :class:`~slawatch.events.sources.Recorder` of a runner given none: the
    metrics (``slawatch_events_total``) and a DEBUG line per stored batch (each
    set-aside message has its own WARNING line already)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def ingested(self, source: str, got: Ingested) -> None:
        self.metrics.events_ingested(source, got)
        log.debug(
            "source %s: %d events accepted, %d duplicates", source, got.accepted, got.duplicates
        )

    def set_aside(self, source: str, reason: str) -> None:
        # Its type is not known for sure (it may not even be JSON): counted as "-".
        self.metrics.events_rejected(source)


# Re-reads the rules and notifiers (from their folders) for a reload.
Loader = Callable[[], tuple[list[Rule], list[NotifierConfig]]]

# Seconds between looks at signals received (their handlers only set a flag).
_SIGNAL_LOOK = 0.2


class Runner:
    """Owns the database, the rules' claim plans, the notifiers and the metrics.

    ``timeout``: seconds to wait for a database connection (``SLAWATCH_DB_TIMEOUT``);
    ``pooler``: ``"transaction"`` behind PgBouncer in transaction mode
    (``SLAWATCH_POOLER``); ``poll``: seconds between delivery polls when no NOTIFY
    comes; ``backoff_cap``: the longest wait after a failure; ``retention``: how
    long alert history is kept (``SLAWATCH_RETENTION``), pruned every ``maintain_every``;
    ``load``: re-reads rules and notifiers for :meth:`reload` (SIGHUP); ``admin_url``:
    where people reach the admin API, for the link in storm summaries;
    ``scan_connections``: the pooled connections every rule's scans share
    (``SLAWATCH_SCAN_CONNECTIONS``; see :func:`_pool_size`).

    ``sources``: event sources (``sources/*.yaml``), each consumed by a thread of
    :meth:`serve` and drained by :meth:`once`; ``recorder`` is told what they store
    and set aside (default: :class:`LoggedEvents`). Sources are read at start: a
    reload (SIGHUP) changes the event types they accept, not the sources.

    ``registry`` is the Prometheus registry of this runner (``GET /metrics``);
    :meth:`health` says whether every part of :meth:`serve` is running.
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
        dedupe_window: timedelta = DEDUPE,
        load: Loader | None = None,
        admin_url: str | None = None,
        actions: Mode = "on",
        sources: list[SourceConfig] | None = None,
        recorder: Recorder | None = None,
        scan_connections: int = SCAN_CONNECTIONS,
        outbox: Outbox = DEFAULT_OUTBOX,
    ) -> None:
        self.clock = clock or Clock()
        # SLAWATCH_OUTBOX: the shape the claims write (docs/explanation/outbox-rows.md).
        self.outbox: Outbox = outbox
        # Rules' webhook actions are sent as notifiers of their own (action:<rule>).
        notifiers = with_targets(rules, notifiers)
        self.admin_url = admin_url  # for the link in storm summaries
        self.poll, self.backoff_cap = poll, backoff_cap
        self.retention, self.maintain_every = retention, maintain_every
        self.dedupe_window = dedupe_window  # SLAWATCH_DEDUPE_WINDOW: event ids kept
        self._load = load
        self._configs = {c.name: c for c in notifiers}
        self._source_configs = list(sources or [])
        self.scan_connections = scan_connections
        self._connections = _pool_size(scan_connections, notifiers, len(self._source_configs))
        self.db = Database(dsn, size=self._connections, timeout=timeout, pooler=pooler)
        self.db.prepared_max = _prepared_max(rules)
        try:
            with self.db.connection("reading the watched tables") as conn:
                # Every rule not ready to run is named at once.
                plans = prepare_all(conn, rules, outbox=outbox)
        except BaseException:
            self.db.close()
            raise
        self._running = {r.name: _Running.start(r, plans[r.name], backoff_cap) for r in rules}
        # Event types of rules in the files that wait for a migrate (set by a reload).
        self.unmigrated_types: frozenset[str] = frozenset()
        # What the scans last wrote to slawatch.scan: an idle scan is written once a minute;
        # when each rule was last scanned goes to slawatch.scanner every few seconds.
        self._scan_records = scans.ScanRecords()
        self.notifiers: dict[str, Notifier] = {}
        for config in notifiers:
            try:
                self.notifiers[config.name] = build(config)
            except BaseException as exc:  # e.g. a ca_file spoilt since it was loaded
                for built in self.notifiers.values():
                    built.close()
                self.db.close()
                if isinstance(exc, ConfigError):
                    raise ConfigError(f"notifier {config.name}: {exc}") from exc
                raise
        # Shared with the delivery workers, so changed in place on reload.
        self.descriptions = {r.name: r.description for r in rules}
        self._maintain_trouble = Outage("pruning history", log)
        self._orphan_trouble = Outage("settling orphaned deliveries", log)
        self.metrics = Metrics(
            self.db, self.clock, lambda: list(self.notifiers), lambda: self.rules.values()
        )
        # Rules' actions run inside their claims (slawatch/actions/run.py).
        self.actions = actions
        self._act = runner(actions, self._acted)
        # Rules that may have actions recorded 'retry' (run again at their next scan):
        # every rule at start (another run may have left some), then those that
        # recorded one, until a look finds none.
        self._held: set[str] = set(self._running)
        self.registry: CollectorRegistry = self.metrics.registry
        for name in self.notifiers:
            self.metrics.notifier_added(name)
        for name in self._running:
            self.metrics.rule_added(name)
        # Whether each rule's definition is the one migrate recorded (runtime/definitions.py).
        self.definitions = Definitions(self.db, self.metrics.definition)
        self._stop = threading.Event()
        self._reload_lock = threading.Lock()
        self._reload_asked = False  # set by SIGHUP or request_reload(); serve() reloads
        self._scheduler: BackgroundScheduler | None = None
        self._dispatcher: Dispatcher | None = None
        self._scans = "scans"  # the executor the scan jobs run on
        self._scan_threads = 0
        self._scan_executor: ScanExecutor | None = None
        # The rules whose scan runs or waits for a thread (scan_step), since when.
        self._busy: dict[str, float] = {}
        self._busy_lock = threading.Lock()
        events = recorder or LoggedEvents(self.metrics)
        self.sources: dict[str, SourceRunner] = {
            c.name: SourceRunner(
                build_consumer(c),
                self.db,
                self.clock,
                self._event_types,
                self.retention,
                events,
                backoff_cap=backoff_cap,
                poll=min(poll, SOURCE_POLL),
                unmigrated=lambda: self.unmigrated_types,
            )
            for c in self._source_configs
        }

    @property
    def rules(self) -> dict[str, Rule]:
        """The rules being scanned now."""
        return {name: r.rule for name, r in self._running.items()}

    def _event_types(self) -> list[str]:
        """The event types the running rules use (sources read it per batch)."""
        return list(known_types([r.rule for r in self._running.values()]))

    @property
    def plans(self) -> dict[str, ClaimPlan]:
        """Their claim plans."""
        return {name: r.plan for name, r in self._running.items()}

    def scan(self, rule: str) -> DrainResult | None:
        """Drain one rule; never raises. After a failure the rule's scans back off."""
        running = self._running.get(rule)
        if running is None:
            return None  # removed by a reload since this run was scheduled
        since = time.monotonic()
        if since < running.retry_at:
            return None
        seconds = 0.0

        def timed(_: str) -> DrainResult:
            nonlocal seconds
            started = time.monotonic()
            drained = self._drain(running)
            seconds = time.monotonic() - started
            return drained

        try:
            if not self.definitions.check(running.rule):
                return None  # another definition is recorded: not this instance's to claim
            result = scans.recorded(self.db, rule, self.clock, timed, self._scan_records)
        except DatabaseUnavailable:
            result = None  # the database's outage line says it
        except Exception as exc:  # a bug too: keep scanning the other rules, this one later
            if isinstance(exc, SlawatchError) and self.definitions.refused(running.rule, exc):
                return None  # the claims' gate: said once by Definitions
            self._failed(running, exc, since)
            return None
        if result is None:
            running.retry_at = time.monotonic() + running.backoff.next()
            return None
        self._scanned(running, seconds, result.severities)
        if result.claimed or result.closed:
            activity.info(
                "rule %s: %d claimed, %d closed in %.0f ms",
                rule,
                result.claimed,
                result.closed,
                seconds * 1000,
                extra={
                    "rule": rule,
                    "claimed": result.claimed,
                    "closed": result.closed,
                    "batches": result.batches,
                    "ms": round(seconds * 1000, 1),
                },
            )
        return result

    def scan_step(self, step: Step) -> None:
        """Scan the rules of one step (:func:`staggered`), which come due together;
        never raises.

        The step's inline and event rules are asked whether anything is due in one
        statement (engine/steps.py); each that says no has had its scan, of nothing,
        recorded as :meth:`scan` records one (the step's records in one statement:
        scans.recorded_idle). The others (those with something due, ``track: table``
        rules, a rule whose held actions are to run again) are each handed to the scan
        threads as a scan of their own, as is every rule while the statement fails for
        another reason than the database's outage (one line when that starts, one when
        it ends; the statement waits out a backoff meanwhile), and so is every rule
        after an unexpected exception in the job (a bug: one ERROR line when that
        starts, one when the statement is answered again; the statement backs off the
        same way). A rule whose last scan still runs is left to it (one line when that
        has gone on too long), and a failing rule waits out its backoff, as in
        :meth:`scan`."""
        taken: list[str] = []
        handed: set[str] = set()
        try:
            whole = self._scan_step(step, taken, handed)
        except Exception as exc:  # a bug: the step's rules are scanned one by one
            step.retry_at = time.monotonic() + step.backoff.next()  # not asked every tick
            step.bugs.failed(f"unexpected {type(exc).__name__}: {exc}", exc_info=exc)
            for name in step.names:
                if name in handed or name not in self._running:
                    continue
                if name in taken or self._take(name):
                    self._hand(name)
            return
        if whole:  # not merely a run while the statement backs off, or not asked
            step.bugs.ok()
            step.backoff.reset()

    def _scan_step(self, step: Step, taken: list[str], handed: set[str]) -> bool:
        """The step's scans (:meth:`scan_step`); whether its statement, if it has one,
        was asked and answered."""
        now = time.monotonic()
        asking = now >= step.retry_at  # else its statement backs off: every rule alone
        probed: list[_Running] = []  # the statement's rules: the same from tick to tick
        alone: list[str] = []  # each handed to a scan of its own
        lonely: list[str] = []  # each asked alone first (_ask_alone)
        for name in step.names:
            running = self._running.get(name)
            if running is None or now < running.retry_at:
                continue  # removed by a reload; backing off
            ask = asking and askable(running.plan)
            if ask:
                probed.append(running)
            if not self._take(name):
                self._still_scanning(running, now)
                continue
            taken.append(name)
            if self._may_hold(running.rule):
                alone.append(name)
            elif not ask:
                # While the statement backs off, an inline or event rule is asked alone,
                # as safe from a lock on its table as in the statement; a `track:
                # table` rule has its own scan.
                (lonely if askable(running.plan) else alone).append(name)
        mine = set(taken) - set(alone) - set(lonely)
        asked = [r for r in probed if r.rule.name in mine]
        at = self.clock.now()
        answers, failed = self._ask(step, probed) if asked else ({}, False)
        # Its statement asked and answered, or none to ask (scan_step: a bug's end);
        # not while it backs off (none probed then).
        whole = (answers is not None) if asked else (asking and not probed)
        if failed:  # the statement failed just now: each rule asked alone
            lonely.extend(r.rule.name for r in asked)
            asked = []
        elif answers is None:  # the database's outage: its line says it; the rules back off
            for running in asked:
                running.retry_at = time.monotonic() + running.backoff.next()
                self._release(running.rule.name)
            asked = []
        idle: list[tuple[str, datetime, float]] = []
        answered: list[tuple[_Running, float | None]] = [
            (r, answers.get(r.rule.name) if answers is not None else None) for r in asked
        ]
        for i, name in enumerate(lonely):
            running = self._running.get(name)
            if running is None:  # removed by a reload meanwhile
                self._release(name)
                continue
            try:
                took = self._ask_alone(running)
            except DatabaseUnavailable:  # each rule would wait for the pool again
                for rest in lonely[i:]:
                    if (left := self._running.get(rest)) is not None:
                        left.retry_at = time.monotonic() + left.backoff.next()
                    self._release(rest)
                break
            if took is False:  # its table is locked: said as its trouble; backs off
                self._release(name)
                continue
            answered.append((running, took))
        for i, (running, took) in enumerate(answered):
            name = running.rule.name
            if took is None:
                alone.append(name)  # something due, or no answer: its own scan
                continue
            try:
                ours = self.definitions.check(running.rule)
            except DatabaseUnavailable:  # each check would wait for the pool again
                for waiting, _ in answered[i:]:
                    waiting.retry_at = time.monotonic() + waiting.backoff.next()
                    self._release(waiting.rule.name)
                break
            except Exception:  # its own scan reads the records again and says it
                alone.append(name)
                continue
            if ours:  # else another definition is recorded: not ours to scan
                # Its scan, of nothing: as Runner.scan ends one, its record below.
                self._scanned(running, took, {})
                idle.append((name, at, took))
            self._release(name)
        for name in alone:
            handed.add(name)
            self._hand(name)
        if idle:
            scans.recorded_idle(self.db, idle, self._scan_records)
        return whole

    def _failed(self, running: _Running, exc: Exception, since: float) -> None:
        """A scan of ``running``'s rule that failed with ``exc`` (a SlawatchError, or
        any other exception: a bug, said with its traceback): its trouble said, counted,
        and the rule backing off. A lock on its table says so."""
        if not isinstance(exc, SlawatchError):
            message, exc_info = f"unexpected {type(exc).__name__}: {exc}", exc
        else:
            locked = "; its table is locked: scanned again later" if lock_not_had(exc) else ""
            message, exc_info = f"{exc}{locked}", None
        running.trouble.failed(message, since, exc_info=exc_info)
        self.metrics.scan_failed(running.rule.name)
        running.retry_at = time.monotonic() + running.backoff.next()

    def _scanned(self, running: _Running, seconds: float, severities: dict[str, int]) -> None:
        """A scan of ``running``'s rule that succeeded: its trouble over, its backoff
        reset, its time and alerts in the metrics."""
        running.trouble.ok()
        running.backoff.reset()
        running.retry_at = 0.0
        self.metrics.scanned(running.rule.name, seconds, severities)

    def _take(self, name: str) -> bool:
        """Mark ``name`` as being scanned; False when a scan of it runs or waits already."""
        with self._busy_lock:
            if name in self._busy:
                return False
            self._busy[name] = time.monotonic()
            return True

    def _release(self, name: str) -> None:
        with self._busy_lock:
            self._busy.pop(name, None)

    def _still_scanning(self, running: _Running, now: float) -> None:
        """A rule whose scan has run for far longer than its drains may (a lock held on
        its table, a statement that does not end) is a rule not scanned: said once, as
        the rule's trouble, until that scan ends."""
        since = self._busy.get(running.rule.name)
        if since is not None and now - since > max(3 * running.rule.every.total_seconds(), 60):
            running.trouble.failed(f"its scan has been running for {now - since:.0f}s", since)

    def _may_hold(self, rule: Rule) -> bool:
        """Whether ``rule``'s scan may have held actions to run again (_retry_held)."""
        return rule.name in self._held and self.actions == "on"

    def _ask(self, step: Step, probed: list[_Running]) -> tuple[dict[str, float] | None, bool]:
        """The rules of ``probed`` with nothing due, by name, each with its share of the
        statement's time, and whether the statement failed; (None, False) when the
        database is unreachable. When the statement fails otherwise, (None, True): each
        rule is to be asked alone (:meth:`_ask_alone`), and the step's statement backs
        off, unless what failed it was a lock on a rule's table (that rule's trouble)."""
        since = time.monotonic()
        try:
            with self.db.connection("probe for a step of rules") as conn:
                got = probe_step(conn, [r.plan for r in probed], self.clock.now())
        except DatabaseUnavailable:
            return None, False
        except SlawatchError as exc:
            # One rule's probe that fails fails the statement: each rule is then asked
            # alone, which says which; a failing rule is left out during its backoff. A
            # table held locked is that rule's trouble, said by it alone, not the step's:
            # the statement goes on without it at the next tick.
            if not lock_not_had(exc):
                step.retry_at = time.monotonic() + step.backoff.next()
                step.trouble.failed(f"{exc}; its rules are scanned one by one meanwhile", since)
            return None, True
        step.trouble.ok()  # its backoff is reset once the whole step went well (scan_step)
        share = (time.monotonic() - since) / len(probed)
        return {
            r.rule.name: share for r, due in zip(probed, got, strict=True) if due is False
        }, False

    def _ask_alone(self, running: _Running) -> float | bool | None:
        """Ask ``running``'s rule alone, as its step's statement would (while that
        fails or backs off): its share of time when nothing is due; None when its own
        scan is to look (something due, no answer, or a failure that scan will say);
        False when a lock on its table was not had within the statement's
        ``lock_timeout``, said as the rule's trouble, the rule backing off. A rule's own
        scan waits for such a lock; asked here first, a table held by an ``ALTER
        TABLE`` or a ``LOCK TABLE`` keeps its rules off the scan threads, which the
        other rules need. Raises DatabaseUnavailable."""
        since = time.monotonic()
        name = running.rule.name
        try:
            with self.db.connection(f"probe for rule {name}") as conn:
                (due,) = probe_step(conn, [running.plan], self.clock.now())
        except DatabaseUnavailable:
            raise
        except SlawatchError as exc:
            if not lock_not_had(exc):
                return None
            self._failed(running, exc, since)
            return False
        return time.monotonic() - since if due is False else None

    def _hand(self, name: str) -> None:
        """Run ``name``'s scan (taken: :meth:`_take`) on a scan thread, as a run of its
        own, and release it when that ends."""

        def run() -> None:
            try:
                self.scan(name)
            finally:
                self._release(name)

        executor = self._scan_executor
        try:
            if executor is None:
                raise RuntimeError("no scan threads")
            executor.call(run)
        except RuntimeError:  # replaced by a reload just now (or none): on this thread
            run()

    def settle_orphans(self, grace: timedelta = timedelta(0)) -> dict[str, int]:
        """Settle the pending deliveries to notifiers not configured now as 'orphaned'
        (at start, at each reload and with each maintenance run, which catches one that
        was in flight elsewhere at the first look); one warning naming them. Never
        raises: a failure is logged and the next look tries again.

        ``grace``: only deliveries due for that long. Maintenance passes
        ORPHAN_GRACE: in a fleet whose instances reload one after another, one not yet
        reloaded must not orphan what a reloaded one, which has the new notifier,
        is about to send. Start and reload act on this process's own new config."""
        since = time.monotonic()
        try:
            counts = settle_orphans(self.db, list(self.notifiers), self.clock, grace)
        except DatabaseUnavailable:
            return {}  # the database's outage line says it
        except SlawatchError as exc:
            self._orphan_trouble.failed(str(exc), since)
            return {}
        except Exception as exc:  # a bug: scans and deliveries go on, and so does this
            self._orphan_trouble.failed(
                f"unexpected {type(exc).__name__}: {exc}", since, exc_info=exc
            )
            return {}
        self._orphan_trouble.ok()
        if counts:
            names = ", ".join(f"{name} ({count})" for name, count in counts.items())
            log.warning(
                "%d pending deliveries orphaned: their notifiers are not configured: %s"
                " ('slawatch replay --notifier OLD --to NEW' sends them to another)",
                sum(counts.values()),
                names,
                extra={"orphaned": counts},
            )
            self.metrics.orphaned(counts)
        return counts

    def maintain(self) -> PruneResult | None:
        """Settle orphaned deliveries, prune history older than the retention, and give
        calendar rules' episodes a crash left without one their due time; never raises.

        It runs every ``maintain_every``, so a failure simply waits for the next run.
        """
        with self._reload_lock:  # a reload adds a rule's notifier after the rule
            self.settle_orphans(ORPHAN_GRACE)
        since = time.monotonic()
        try:
            result = prune(self.db, self.clock, self.retention)
            result += prune_events(
                self.db,
                list(self.rules.values()),
                self.clock,
                self.retention,
                dedupe=self.dedupe_window,
            )
            pruned_actions = prune_actions(self.db, self.clock.now() - self.retention)
            # Rules with give_up_after: episodes open too long end as abandoned.
            abandoned = give_up(self.db, list(self.plans.values()), self.clock.now())
            for rule in self.rules.values():  # what a crash left between claim and fill
                if rule.calendar is not None and rule.name not in self.definitions.stale:
                    with self.db.connection(f"due times of rule {rule.name}") as conn:
                        fill_due(conn, rule)
            if pruned_actions:
                log.info("pruned %d action attempts older than the retention", pruned_actions)
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
        self.metrics.abandoned(abandoned)
        for rule_name, count in sorted(abandoned.items()):
            log.info(
                "rule %s: %d episodes open longer than give_up_after ended as abandoned",
                rule_name,
                count,
            )
        if result.timers or result.event_ids or result.held:
            log.info(
                "pruned %d closed timers of event rules, %d event ids past their window"
                " and %d held events older than the retention",
                result.timers,
                result.event_ids,
                result.held,
            )
        if result.rows or result.sends:
            log.info(
                "pruned %d outbox rows and %d of their sends older than %s",
                result.rows,
                result.sends,
                format_duration(self.retention),
            )
        if result.alerts or result.deliveries or result.acks or result.silences:
            log.info(
                "pruned %d alerts, %d deliveries, %d acks and %d silences older than %s",
                result.alerts,
                result.deliveries,
                result.acks,
                result.silences,
                format_duration(self.retention),
            )
        return result

    def _acted(self, rule: str, status: str) -> None:
        self.metrics.acted(rule, status)
        if status == "retry":
            self._held.add(rule)

    def beat(self) -> None:
        """Say each scan that has run for too long (:meth:`_still_scanning`), then write
        when each rule was last scanned (slawatch.scanner); never raises. The step jobs
        say a stuck scan too, but they run on the scan threads: when every one of those
        is stuck, they wait behind it, and only this job (on the default executor) says
        so."""
        now = time.monotonic()
        with self._busy_lock:
            busy = list(self._busy)
        try:
            for name in busy:
                if (running := self._running.get(name)) is not None:
                    self._still_scanning(running, now)
        except Exception:  # a bug here must not keep the scanner's beat from being written
            log.exception("looking for stuck scans")
        self._scan_records.beat(self.db, self.clock.now())

    def watch(self) -> None:
        """Look at the database: ``SELECT 1`` on a pooled connection, or, when none comes
        within WATCH_WAIT (or the database failed since its last success), a connection
        of its own. While the database is down the scans and deliveries only wait for
        the pool (up to SLAWATCH_DB_TIMEOUT); these looks fail at once, so the outage's
        line comes soon after UNREACHABLE_AFTER, with or without the admin API
        (docs/how-to/operate.md). Never raises."""
        if not self.db.outage.failing:
            try:
                with self.db.connection("watching the database", wait=WATCH_WAIT) as conn:
                    conn.execute("SELECT 1")
                return
            except DatabaseUnavailable:
                pass  # no pooled connection in time: every one busy, or none to be had
            except SlawatchError:
                return  # recorded by the database's outage (db.py) when it was unreachable
        try:
            with self.db.dedicated("watching the database"):
                pass
        except SlawatchError:
            pass  # the database's outage line says it

    def _drain(self, running: _Running, sweep: bool = False) -> DrainResult:
        plan = running.plan.with_act(self._act)
        self._retry_held(plan.rule)
        try:
            return drain(self.db, plan, self.clock, sweep=sweep)
        except PreparedStatementLost:
            # The failed batch rolled back and prepared statements are off now.
            return drain(self.db, plan, self.clock, sweep=sweep)

    def _retry_held(self, rule: Rule) -> None:
        """Run again the rule's actions recorded 'retry' (a row the application held,
        or the batch's time ran out), before its claim: a scan's look when it may have
        some, none otherwise."""
        if rule.name not in self._held or self.actions != "on":
            return
        if rule.action is None or rule.action.sql is None:
            self._held.discard(rule.name)
            return
        ran = self.db.run(
            f"running rule {rule.name}'s held actions again",
            lambda conn: retry_held(conn, rule, self.clock.now(), self._acted),
        )
        if ran == 0:
            self._held.discard(rule.name)

    def _drain_running(self, rule: str) -> DrainResult:
        # run --once sweeps `track: table` rules too: it drains every due row, backfills
        # with deadlines older than the watermark's look-back included.
        return self._drain(self._running[rule], sweep=True)

    def once(self) -> OnceResult:
        """Store what waits in each event source, drain every rule once (``track:
        table`` rules with a sweep, so backfilled rows are sent too), then one delivery
        pass (``run --once``).

        Every rule and notifier gets its turn even when another failed (the
        failures are in the result), unless the database is unreachable: then
        waiting for it once more per rule would only delay the exit.
        """
        result = OnceResult(
            rules=dict.fromkeys(self._running),
            notifiers=dict.fromkeys(self.notifiers),
            sources=dict.fromkeys(self.sources),
        )
        self.settle_orphans()
        try:
            # First what waits in the sources: its timers are then scanned like the rest.
            for name, source in self.sources.items():
                try:
                    result.sources[name] = source.drain()
                except DatabaseUnavailable:
                    raise
                except SlawatchError as exc:
                    result.errors.append(f"source {name}: {exc}")
            for name in self._running:
                try:
                    # Recorded like a scan of `run`: `status` shows it as the last scan.
                    result.rules[name] = scans.recorded(
                        self.db, name, self.clock, self._drain_running
                    )
                except DatabaseUnavailable:
                    raise
                except SlawatchError as exc:
                    result.errors.append(str(exc))
            for name, notifier in self.notifiers.items():
                try:
                    result.notifiers[name] = deliver_notifier(
                        self.db, notifier, self.clock, self.descriptions, admin_url=self.admin_url
                    )
                except DatabaseUnavailable:
                    raise
                except SlawatchError as exc:
                    result.errors.append(str(exc))
        except DatabaseUnavailable as exc:
            result.errors.append(str(exc))
        return result

    def serve(self, seconds: float | None = None, *, http: str | None = None) -> None:
        """Scan and deliver until SIGINT/SIGTERM, :meth:`stop`, or ``seconds`` passed;
        SIGHUP (or :meth:`request_reload`) re-reads rules and notifiers.

        ``http``: the admin API's address, for the startup line.
        """
        self._scan_threads = self._threads_wanted()
        self._scan_executor = ScanExecutor(self._scan_threads)
        scheduler = BackgroundScheduler(
            executors={
                "default": ThreadPoolExecutor(3),  # pruning, the watch, the scans' beat
                self._scans: self._scan_executor,
            },
            jobstores={"default": ScanJobStore()},
            timezone=UTC,
        )
        now = datetime.now(UTC)
        self._add_steps(scheduler, list(self._running), now)
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
        scheduler.add_job(
            self.beat,
            "interval",
            seconds=scans.BEAT,
            id="beat",
            max_instances=1,
            coalesce=True,
        )
        scheduler.add_job(
            self.watch,
            "interval",
            seconds=WATCH_EVERY,
            id="watch",
            max_instances=1,
            coalesce=True,
            next_run_time=now,
        )
        signalled: list[int] = []

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # No lock may be taken here (the main thread may hold it): a flag only.
            signalled.append(signum)

        dispatcher = Dispatcher(
            self.db,
            self.notifiers,
            self.clock,
            self.descriptions,
            poll=self.poll,
            backoff_cap=self.backoff_cap,
            concurrency={name: c.concurrency for name, c in self._configs.items()},
            metrics=self.metrics,
            admin_url=self.admin_url,
        )
        deadline = None if seconds is None else time.monotonic() + seconds
        self.settle_orphans()
        with _signals(on_signal):
            self._dispatcher, self._scheduler = dispatcher, scheduler
            dispatcher.start()
            scheduler.start()
            for source in self.sources.values():
                source.start()
            self._started(http)
            try:
                while not self._stop.is_set():
                    left = _SIGNAL_LOOK if deadline is None else deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._stop.wait(min(left, _SIGNAL_LOOK))
                    while signalled:
                        if signalled.pop(0) == signal.SIGHUP:
                            self._reload_asked = True
                        else:
                            self._stop.set()
                    if self._reload_asked and not self._stop.is_set():
                        self._reload_asked = False
                        try:
                            self.reload()
                        except Exception as exc:  # a bug: log it, and keep serving
                            log.error(
                                "reload failed: unexpected %s: %s",
                                type(exc).__name__,
                                exc,
                                exc_info=exc,
                            )
            finally:
                log.info("stopping: letting running scans and deliveries finish")
                for source in self.sources.values():
                    source.stop()  # after its batch in hand (one held for the database: left)
                scheduler.shutdown(wait=True)
                dispatcher.stop()

    def _add_steps(self, scheduler: BackgroundScheduler, names: list[str], now: datetime) -> None:
        """Scan jobs for the running rules ``names``: those of one `every` spread over
        steps (:func:`staggered`), one job per step (:meth:`scan_step`), its id
        ``scan:`` and its first rule's name."""
        by_every: dict[timedelta, list[str]] = {}
        for name in names:
            by_every.setdefault(self._running[name].rule.every, []).append(name)
        for every, group in by_every.items():
            steps: dict[datetime, list[str]] = {}
            for name, when in zip(group, staggered(now, len(group)), strict=True):
                steps.setdefault(when, []).append(name)
            for when, step in steps.items():
                seconds = every.total_seconds()
                job_id, n = f"scan:{step[0]}", 1
                while scheduler.get_job(job_id) is not None:  # a name reused after a reload
                    n += 1
                    job_id = f"scan:{step[0]}#{n}"
                scheduler.add_job(
                    self.scan_step,
                    "interval",
                    seconds=seconds,
                    args=[Step.of(step, self.backoff_cap)],
                    id=job_id,
                    executor=self._scans,
                    max_instances=1,
                    coalesce=True,
                    misfire_grace_time=max(int(seconds), 1),
                    next_run_time=when,
                )

    def scan_job(self, rule: str) -> Job | None:
        """The scheduler's job that scans ``rule`` (its step's), if any."""
        if self._scheduler is None:
            return None
        for job in self._scheduler.get_jobs():
            if job.id.startswith("scan:") and rule in job.args[0].names:
                return job
        return None

    def _started(self, http: str | None) -> None:
        """The startup line: what runs, against which database (no password), where."""
        rules, notifiers = sorted(self._running), sorted(self.notifiers)
        database = redact(self.db.dsn)
        sources = sorted(self.sources)
        fed = f", {len(sources)} sources ({', '.join(sources)})" if sources else ""
        log.info(
            "slawatch %s running: %d rules (%s), %d notifiers (%s)%s, database %s%s",
            __version__,
            len(rules),
            ", ".join(rules) or "none",
            len(notifiers),
            ", ".join(notifiers) or "none",
            fed,
            database,
            f", admin HTTP on {http}" if http else "",
            extra={
                "version": __version__,
                "rules": rules,
                "notifiers": notifiers,
                "sources": sources,
                "database": database,
                "http": http,
            },
        )

    def stop(self) -> None:
        """Make :meth:`serve` return (from any thread)."""
        self._stop.set()

    def request_reload(self) -> None:
        """Make :meth:`serve` re-read rules and notifiers soon (what SIGHUP does)."""
        self._reload_asked = True

    def reload(self) -> bool:
        """Re-read rules and notifiers and apply them; False when the new set was refused
        (then everything goes on as it was, and the log says why)."""
        if self._load is None:
            log.warning("reload: this runner was not given a way to read its rules again")
            return False
        try:
            rules, notifiers = self._load()
        except ConfigError as exc:
            lines = str(exc).splitlines()
            log.error(
                "reload refused, the running rules and notifiers go on: %d errors",
                len(lines),
                extra={"errors": lines},
            )
            for line in lines:
                log.error("reload: %s", line)
            return False
        return self.apply(rules, notifiers)

    def apply(self, rules: list[Rule], notifiers: list[NotifierConfig]) -> bool:
        """Run ``rules`` and ``notifiers`` from now on, validated as a set (see
        :func:`slawatch.commands.load_config`).

        A rule not ready to run (needs a migrate, its table is gone) is reported and
        left out, or, when it was running, goes on as it was. Scans and deliveries
        in flight finish first. False (nothing changed) when the database cannot be
        read or a notifier cannot be built.
        """
        with self._reload_lock:
            try:
                with self.db.connection("reading the watched tables for a reload") as conn:
                    plans, problems = prepare_ready(conn, rules, outbox=self.outbox)
            except SlawatchError as exc:
                log.error("reload refused, the running rules and notifiers go on: %s", exc)
                return False
            notifiers = with_targets(rules, notifiers)
            configs = {c.name: c for c in notifiers}
            renewed = [n for n, c in configs.items() if self._configs.get(n) != c]
            built: dict[str, Notifier] = {}
            try:
                for name in renewed:
                    built[name] = build(configs[name])
            except Exception as exc:
                for notifier in built.values():
                    notifier.close()
                log.error(
                    "reload refused, the running rules and notifiers go on: notifier %s: %s",
                    name,
                    exc,
                )
                return False
            # The scans' threads follow the connections (Runner._threads_wanted).
            self._connections = _pool_size(self.scan_connections, notifiers, len(self.sources))
            self.db.prepared_max = max(self.db.prepared_max, _prepared_max(rules))
            self._apply_rules(rules, plans, problems)
            self._apply_notifiers(configs, built)
            # After the removed notifiers' workers stopped: nothing of ours is in flight.
            self.settle_orphans()
            self.db.resize(self._connections)
            return True

    def _apply_rules(
        self, rules: list[Rule], plans: dict[str, ClaimPlan], problems: dict[str, str]
    ) -> None:
        """Switch the scans over to ``rules`` (``plans`` for the ready ones)."""
        old = self._running
        running: dict[str, _Running] = {}
        added, changed = [], []
        for rule in rules:
            name = rule.name
            before = old.get(name)
            if name in problems:
                if before is None:
                    log.error("reload: %s; rule %s left out until then", problems[name], name)
                    continue
                # Never quiet by accident: the rule as it ran pages on. Waiting for a
                # migrate is the rolling deploy's order (docs/how-to/rolling-deploys.md):
                # a warning; a trigger created or the table gone is an error.
                if needs_migrate(problems[name]):
                    log.warning(
                        "reload: %s; rule %s goes on with its running definition until"
                        " 'slawatch migrate' records the new one (then reload to run it)",
                        problems[name],
                        name,
                    )
                else:
                    log.error(
                        "reload: %s; rule %s goes on as it was until then", problems[name], name
                    )
                running[name] = before
            elif before is None:
                running[name] = _Running.start(rule, plans[name], self.backoff_cap)
                self.metrics.rule_added(name)
                added.append(name)
            elif before.rule != rule:
                running[name] = replace(before, rule=rule, plan=plans[name])
                changed.append(name)
            else:
                running[name] = before
        removed = [name for name in old if name not in running]
        self._held.update(added + changed)  # a changed action may run what the old held
        # Scans look their rule up when they start: one assignment switches them over.
        self._running = running
        runs = set(known_types([r.rule for r in running.values()]))
        waiting = [r for r in rules if r.name in problems]
        self.unmigrated_types = frozenset(set(known_types(waiting)) - runs)
        self.definitions.invalidate()  # each scan compares its rule with the records anew
        for name in removed:
            self.definitions.forget(name)
        for name, r in running.items():
            self.descriptions[name] = r.rule.description
        for name in removed:
            self.descriptions.pop(name, None)
        if self._scheduler is not None:
            self._reschedule()
        log.info(
            "reload: %d rules (added: %s; changed: %s; removed: %s; not migrated: %s)",
            len(running),
            ", ".join(added) or "none",
            ", ".join(changed) or "none",
            ", ".join(removed) or "none",
            ", ".join(sorted(problems)) or "none",
            extra={
                "rules": sorted(running),
                "added": added,
                "changed": changed,
                "removed": removed,
                "not_migrated": sorted(problems),
            },
        )

    def _reschedule(self) -> None:
        """Make the scheduler's scan jobs match the running rules: each rule in one step
        job at its `every`, none for a rule gone. A step keeps its time while rules
        leave it; a rule added, or whose `every` changed, joins a step of its `every`
        with room (fewer than :data:`STEP_RULES` rules), else a new one.

        Derived from ``self._running`` and the jobs themselves, not from what a reload
        changed: a reload that failed halfway (and logged it) is mended by the next.
        """
        scheduler = self._scheduler
        assert scheduler is not None
        now = datetime.now(UTC)
        jobs = {j.id: j for j in scheduler.get_jobs() if j.id.startswith("scan:")}
        if self._threads_wanted() > self._scan_threads:
            # More rules (or connections): a new, larger executor, and every scan job
            # moves to it. The old one finishes what it runs now, then its threads end.
            previous, old = self._scans, self._scan_executor
            self._scan_threads = self._threads_wanted()
            self._scans = f"scans-{self._scan_threads}"
            self._scan_executor = ScanExecutor(self._scan_threads)
            scheduler.add_executor(self._scan_executor, self._scans)
            for job_id in jobs:
                scheduler.modify_job(job_id, executor=self._scans)
            scheduler.remove_executor(previous, shutdown=False)
            if old is not None:
                old.shutdown(wait=False)  # its threads end after the runs it was given
        scheduled: set[str] = set()
        room: dict[timedelta, list[Step]] = {}
        for job_id, job in jobs.items():
            step: Step = job.args[0]
            kept = [
                name
                for name in step.names
                if name not in scheduled
                and (running := self._running.get(name)) is not None
                and running.rule.every == job.trigger.interval
            ]
            if not kept:
                scheduler.remove_job(job_id)
                continue
            step.names = kept  # a run under way goes on with the list it has
            scheduled.update(kept)
            if len(kept) < STEP_RULES:
                room.setdefault(job.trigger.interval, []).append(step)
        new: list[str] = []
        for name in self._running:
            if name in scheduled:
                continue
            steps = room.get(self._running[name].rule.every, [])
            if steps:
                steps[0].names = [*steps[0].names, name]
                if len(steps[0].names) >= STEP_RULES:
                    steps.pop(0)
            else:
                new.append(name)
        self._add_steps(scheduler, new, now)

    def _threads_wanted(self) -> int:
        """Threads for the scans: one per rule up to ``scan_connections``, the pooled
        connections the scans share. A scan's work is on a connection: a scan thread
        beyond them would wait in the pool for one (a waiter's condition made, a wakeup
        of its thread at each return: at 1,000 idle rules a third of slawatch's own CPU,
        docs/performance.md, the rules curve), and take the connection the rest (the
        delivery workers, pruning, the admin API) was sized for. A rule whose turn
        comes while every scan thread is busy waits in the executor's queue instead."""
        return max(min(len(self._running), self.scan_connections), 1)

    def _apply_notifiers(
        self, configs: dict[str, NotifierConfig], built: dict[str, Notifier]
    ) -> None:
        removed = [n for n in self._configs if n not in configs]
        added = [n for n in built if n not in self._configs]
        changed = [n for n in built if n in self._configs]
        notifiers = {n: built.get(n) or self.notifiers[n] for n in configs}
        for name in [*removed, *changed]:
            # Its workers finish the batch in hand first.
            if self._dispatcher is not None:
                self._dispatcher.remove(name)
            self.notifiers[name].close()
        self.notifiers, self._configs = notifiers, configs
        for name in [*added, *changed]:
            if self._dispatcher is not None:
                self._dispatcher.add(notifiers[name], configs[name].concurrency)
            self.metrics.notifier_added(name)
        if removed or built:
            log.info(
                "reload: %d notifiers (added: %s; changed: %s; removed: %s)",
                len(notifiers),
                ", ".join(added) or "none",
                ", ".join(changed) or "none",
                ", ".join(removed) or "none",
                extra={
                    "notifiers": sorted(notifiers),
                    "added": added,
                    "changed": changed,
                    "removed": removed,
                },
            )

    def health(self) -> dict[str, Any]:
        """Whether :meth:`serve` is running whole (``/readyz``): the scheduler, every
        delivery worker, the NOTIFY listener (or polling instead, by design), and each
        event source's consumer thread (``sources``, when there are any), and per rule
        whether it runs the definition migrate recorded (``definition``).
        ``ok`` is all of them.

        The database is not among them: this runner's view of it changes only when its
        own work next succeeds or fails, which a backoff may put off for half a minute
        after the database changed; ``/readyz`` probes the database itself.
        """
        scheduler = self._scheduler is not None and bool(self._scheduler.running)
        alive = self._dispatcher.alive() if self._dispatcher is not None else {}
        listener = alive.pop("listen", False)
        workers = {name: alive.get(name, False) for name in self.notifiers}
        health: dict[str, Any] = {
            "scheduler": scheduler,
            "workers": workers,
            "listener": listener,
        }
        sources = {name: source.alive() for name, source in self.sources.items()}
        if sources:
            health["sources"] = sources
        # A rule whose recorded definition is another is not claimed here: not ready, so
        # that a load balancer prefers an instance that runs it (docs/how-to/rolling-deploys.md).
        stale = self.definitions.stale
        definition = {name: name not in stale for name in self._running}
        health["definition"] = definition
        # "ok" last: a reader that names the first failing check names the part.
        health["ok"] = (
            scheduler
            and all(workers.values())
            and listener
            and all(sources.values())
            and all(definition.values())
        )
        return health

    def close(self) -> None:
        """Close the notifiers and the database pool."""
        for notifier in self.notifiers.values():
            notifier.close()
        self.db.close()


def _prepared_max(rules: list[Rule]) -> int:
    """Prepared statements each pooled connection keeps: the default, and three per rule
    (its probe, its claim and at most a step's probes) on top, so that the rules'
    statements used in turn stay prepared however many rules there are."""
    return PREPARED_MAX + 3 * len(rules)


def staggered(now: datetime, count: int) -> list[datetime]:
    """First run times for ``count`` scans, spread evenly over the :data:`STAGGER` from
    ``now``: rules started together would otherwise all come due at the same instant at
    every tick, a burst of every scan at once for the executor and the pool.

    In steps of :data:`STEP_RULES` rules (more where that would make steps closer than
    :data:`SLOT`): the rules of one step come due together and are scanned by one job
    (Runner.scan_step), their probes one statement. Each wakeup of the scheduler's thread
    and of a scan thread costs about what an idle scan does; with a thousand rules a
    step of their own each (a millisecond apart) was a wakeup of both per scan
    (docs/performance.md)."""
    if count == 0:
        return []
    steps = max(min(-(-count // STEP_RULES), int(STAGGER / SLOT)), 1)
    return [now + timedelta(seconds=(i * steps // count) * STAGGER / steps) for i in range(count)]


def with_targets(rules: list[Rule], notifiers: list[NotifierConfig]) -> list[NotifierConfig]:
    """``notifiers`` and the senders of ``rules``' webhook actions (``action:<rule>``)."""
    return [*notifiers, *action_targets(rules)]


def _pool_size(scans: int, notifiers: list[NotifierConfig], sources: int = 0) -> int:
    """``scans`` connections that every rule's scans share (``SLAWATCH_SCAN_CONNECTIONS``:
    however many rules, an idle scan holds one for a probe, a busy one per batch), the
    delivery workers (``concurrency`` per notifier), the event sources, and one for the
    rest (the listener's probe, pruning, a metrics scrape, the admin API: each a few
    statements, and any connection the scans are not using serves them too). With the
    delivery listener's own connection, ``slawatch run`` opens at most this + 1."""
    return scans + sum(c.concurrency for c in notifiers) + sources + 1


@contextmanager
def _signals(handler: signal._HANDLER) -> Iterator[None]:
    """Install ``handler`` for SIGINT, SIGTERM and SIGHUP while inside (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
