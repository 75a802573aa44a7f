"""The delivery loop: due deliveries out of the outbox, to their notifiers.

Per notifier, a pass claims up to ``batch`` due deliveries under a lease (a
fresh owner id per claim, an expiry), sends them in one request/message
group/e-mail, and settles them: sent; or a retry at ``min(first *
2^(attempt-1), max)`` with jitter, or when the receiver said so (Retry-After);
or dead, with the error text, after the last attempt or at once when the
failure is permanent. Every write after the claim re-checks the lease owner,
so a process that stalled past its lease changes nothing; a claimed delivery is
not due while its lease runs, so the deliveries of a process that died become due
again by themselves when their leases run out.

Per episode and notifier, a resolved notice waits until the episode's firing
notifications to that notifier are settled (``claim_deliveries``): a receiver is
never told "resolved" before "firing". A batch that holds such a notice back is
settled by the claim of the next one, short or not, so the notice follows it in
the same pass. The claim also settles, unsent, what an active silence matches and
a firing notification of an acknowledged episode. Deliveries to a notifier no
longer configured are settled 'orphaned' (:func:`settle_orphans`); :func:`replay_deliveries`
puts dead and orphaned ones back, to their own notifier or another.

The workers drain the outbox in rows too (0020_outbox_rows.sql,
docs/explanation/outbox-rows.md), whichever shape the claims write: after its
deliveries, a worker leases one due row send at a time (:func:`lease_row_send`), sends
its alerts in chunks of the notifier's batch from the send's progress on, with the
payloads deliveries get, and settles it as deliveries are settled (fenced by the lease
owner; retry, dead; acks and silences skip alerts), in turns of :data:`ROWS_PER_TURN`
sends between its claims of deliveries (one turn after another while none is due).

:class:`Dispatcher` runs ``concurrency`` worker threads per notifier (a slow
receiver holds up only its own deliveries) and a listener that wakes them on
the claim's ``NOTIFY``, polling as the fallback. Each worker claims, sends and
settles its own batches, so a notifier has up to ``concurrency`` batches in
flight: one batch's round trip to the receiver overlaps the others' claims and
commits. Their leases keep them apart (SKIP LOCKED at the claim, a delivery
leased to one owner is not due until the lease expires). Workers never die: a
database outage, a receiver outage or an unexpected error is logged once when
it starts and once when it ends (one record per notifier, shared by its
workers), and the worker backs off (woken early by stop) and goes on.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from psycopg import sql
from psycopg.pq import Format
from psycopg.rows import dict_row, tuple_row

from slawatch.clock import Clock
from slawatch.config.files import shorten
from slawatch.config.rules import ACTION_TARGET
from slawatch.db import (
    Connection,
    Database,
    DatabaseUnavailable,
    one_statement,
    pipelined,
    prepares,
    raw_cursor,
)
from slawatch.delivery.notifiers import Notifier
from slawatch.delivery.storm import Folded, listings, summary_payload
from slawatch.delivery.storm import summarize as storm_summarize
from slawatch.engine.outbox import RowDataLoader, alert_payload, row_payloads
from slawatch.engine.probefn import render
from slawatch.engine.queries import queries
from slawatch.errors import DeliveryError, SlawatchError
from slawatch.outage import Backoff, Outage

log = logging.getLogger(__name__)
# The line per delivered batch, apart from the rest (``slawatch demo`` leaves it out).
activity = logging.getLogger("slawatch.activity")


class Metrics(Protocol):
    """What the dispatcher reports to (slawatch.operate.metrics.Metrics implements it)."""

    def delivered(self, batch: Settled) -> None:
        """A batch of deliveries settled."""


@dataclass(frozen=True)
class Settled:
    """What one settled batch of a notifier's deliveries reports to the metrics: the
    alerts sent (when each fired: the latency's start) and the others' outcomes."""

    notifier: str
    accepted: datetime  # when the notifier accepted the batch
    fired: list[datetime]  # when each alert sent fired (empty: no metrics were given)
    retried: int = 0  # will be tried again
    dead: int = 0  # will not
    silenced: int = 0  # settled unsent: a silence matched
    summarized: int = 0  # settled unsent: a storm summary stands for them
    summaries: int = 0  # storm summaries made
    acknowledged: int = 0  # settled unsent: their episode was acknowledged


CHANNEL = "slawatch_delivery"
POLL = 1.0  # seconds: the fallback when no NOTIFY arrives
PROBE_WAIT = 3.0  # seconds for our own NOTIFY to come back after LISTEN
BACKOFF_CAP = 30.0  # seconds: the longest wait of a worker after a failure
DEFAULT_LISTED = 20  # alerts listed in a storm summary when the notifier says nothing


@dataclass
class PassResult:
    """What a delivery pass did."""

    sent: int = 0
    retried: int = 0
    dead: int = 0
    silenced: int = 0  # settled without sending: a silence matched (not in ``total``)
    acknowledged: int = 0  # settled without sending: their episode was acknowledged
    summarized: int = 0  # settled without sending: a storm summary stands for them
    summaries: int = 0  # storm summaries made (each sent as one more delivery)

    def __iadd__(self, other: PassResult) -> PassResult:
        self.sent += other.sent
        self.retried += other.retried
        self.dead += other.dead
        self.silenced += other.silenced
        self.acknowledged += other.acknowledged
        self.summarized += other.summarized
        self.summaries += other.summaries
        return self

    @property
    def total(self) -> int:
        return self.sent + self.retried + self.dead


@dataclass(frozen=True)
class Replayed:
    """What a replay did: ``dead`` and ``orphaned`` deliveries back to pending; ``taken``
    left as they were (moving them ``to`` another notifier, their alert had a delivery
    to it already); ``left`` as they were (their notifier is not configured: name
    another with ``to``); ``resolved`` notices to be sent again after their replayed
    firing notifications (they went out before them)."""

    dead: int = 0
    orphaned: int = 0
    taken: int = 0
    left: int = 0
    resolved: int = 0

    @property
    def count(self) -> int:
        """Deliveries back to pending."""
        return self.dead + self.orphaned


# What `replay` answers of the firing notifications it sent again (rule, key, episode,
# fired_at, target), for replay_row_sends to send their resolved notices kept in rows again.
_ACROSS = ("across_rules", "across_keys", "across_episodes", "across_fired", "across_targets")


def replay_deliveries(
    conn: Connection,
    now: datetime,
    rule: str | None,
    notifier: str | None,
    *,
    to: str | None = None,
    configured: Collection[str] | None = None,
) -> Replayed:
    """Dead and orphaned deliveries (of ``rule``'s alerts, to ``notifier``; None: any) back
    to pending, to their own notifier or to ``to``, and only to a notifier in
    ``configured`` (None: any), in one transaction that wakes the delivery workers."""
    q = queries()
    params = {
        "now": now,
        "rule": rule,
        "notifier": notifier,
        "to": to,
        "configured": None if configured is None else sorted(configured),
    }
    across: dict[str, object] = {name: [] for name in _ACROSS}
    with conn.transaction():
        row = conn.execute(q["replay"], params).fetchone()
        done = Replayed(*(int(v) for v in row[: -len(_ACROSS)])) if row else Replayed()
        if row:
            across = dict(zip(_ACROSS, row[-len(_ACROSS) :], strict=True))
        # The outbox in rows: dead and orphaned sends likewise (replay_row_sends), and
        # the resolved notices of the other shape of the firing notifications each sent
        # again (docs/explanation/outbox-rows.md).
        row = conn.execute(q["replay_row_sends"], params | across).fetchone()
        if row:
            done = Replayed(*(a + int(b) for a, b in zip(astuple(done), row, strict=True)))
        if done.count or done.resolved:
            conn.execute(q["wake_deliveries"])
    return done


def replay(conn: Connection, now: datetime, rule: str | None, notifier: str | None) -> int:
    """:func:`replay_deliveries` to their own notifiers, whichever they are; how many."""
    return replay_deliveries(conn, now, rule, notifier).count


def replay_problem(
    conn: Connection,
    notifier: str | None,
    to: str | None,
    configured: Collection[str],
    flag: str = "",
) -> str | None:
    """Why ``replay`` cannot take these names, as one line naming the option (``flag``
    before each option's name: ``--`` on the command line); None when it can. A
    notifier no longer configured may be named with ``to`` (where its dead and orphaned
    deliveries go), as long as it has some. A webhook action's target (``action:<rule>``)
    is not a notifier: nothing moves to it (its receiver would take a notification as
    the action) or from it (the action would be sent to a notifier, never settled)."""
    if to is not None and to.startswith(ACTION_TARGET):
        return (
            f"{flag}to: {shorten(to)} is a rule's webhook action, not a notifier:"
            " nothing is moved to it"
        )
    if to is not None and notifier is not None and notifier.startswith(ACTION_TARGET):
        return (
            f"{flag}notifier: {shorten(notifier)} is a rule's webhook action: its deliveries"
            " are not moved to a notifier ('replay --actions' sends them again)"
        )
    if to is not None and to not in configured:
        return f"{flag}to: no notifier named {shorten(to)} is configured"
    if to is not None and notifier is None:
        return f"{flag}to: goes with {flag}notifier (the notifier whose deliveries to move)"
    if notifier is None or notifier in configured:
        return None
    if to is None:
        return (
            f"{flag}notifier: no notifier named {shorten(notifier)} is configured (to send its"
            f" dead and orphaned deliveries to another one: {flag}to NAME)"
        )
    row = conn.execute(queries()["replay_leftovers"], {"notifier": notifier}).fetchone()
    if not (row and row[0]):
        row = conn.execute(queries()["row_leftovers"], {"notifier": notifier}).fetchone()
    if not (row and row[0]):
        return (
            f"{flag}notifier: no notifier named {shorten(notifier)} is configured, and no dead or"
            " orphaned deliveries go to one"
        )
    return None


def settle_orphans(
    db: Database, configured: Collection[str], clock: Clock, grace: timedelta = timedelta(0)
) -> dict[str, int]:
    """Settle as 'orphaned' the pending deliveries to notifiers not in ``configured``
    (removed from the configuration), with a ``grace`` only those due for that long;
    how many, per such notifier. One in flight in another process (its lease not run out by
    ``clock``) is left to that process. The clock is read only when there is something
    to settle."""
    names = sorted(configured)
    q = queries()

    def work(conn: Connection) -> dict[str, int]:
        # Deliveries, then the sends of the outbox in rows (orphan_row_sends).
        counts: dict[str, int] = {}
        for pending, orphan in (
            ("orphans_pending", "orphan_deliveries"),
            ("row_orphans_pending", "orphan_row_sends"),
        ):
            row = conn.execute(q[pending], {"configured": names}).fetchone()
            if not (row and row[0]):
                continue
            now = clock.now()
            due_before = now - grace if grace else None
            params = {"configured": names, "now": now, "due_before": due_before}
            for name, count in conn.execute(q[orphan], params).fetchall():
                counts[str(name)] = counts.get(str(name), 0) + int(count)
        return counts

    return db.run("settling orphaned deliveries", work)


def lease_for(notifier: Notifier) -> timedelta:
    """Long enough for one send to time out, with room to record the outcome."""
    return timedelta(seconds=2 * notifier.timeout + 2)


def retry_delay(
    notifier: Notifier, attempt: int, error: DeliveryError, jitter: float = 1.0
) -> timedelta:
    """When to try again after failed attempt ``attempt``: the receiver's Retry-After,
    else the notifier's backoff times ``jitter``."""
    if error.retry_after is not None:
        return timedelta(seconds=error.retry_after)
    return notifier.retry.delay(attempt) * jitter


# One record per notifier (instance) in the process: a receiver that is down is
# one warning when it starts failing and one line when it accepts again.
_receivers: weakref.WeakKeyDictionary[Notifier, Outage] = weakref.WeakKeyDictionary()
_receivers_lock = threading.Lock()


def receiver_outage(notifier: Notifier) -> Outage:
    """The outage record of ``notifier``'s receiver."""
    with _receivers_lock:
        outage = _receivers.get(notifier)
        if outage is None:
            outage = _receivers[notifier] = Outage(
                f"notifier {notifier.name}:",
                log,
                down="receiver failing",
                up="receiver accepting again",
                level=logging.WARNING,
            )
        return outage


def folded_counts(folded: Sequence[Folded]) -> PassResult:
    """What a fold settled: the alerts folded into summaries and the summaries made."""
    return PassResult(
        summarized=sum(f.folded for f in folded), summaries=sum(1 for f in folded if f.made)
    )


@dataclass
class _Batch:
    """Deliveries claimed under one lease (``owner``), with their alerts; and how many
    more the claim settled as silenced or acknowledged (they count towards a full
    batch). With a storm notifier: the deliveries folded into summaries before the claim
    (``folded``), and the listed alerts of each summary in ``rows`` (by the summary's
    alert id)."""

    owner: uuid.UUID
    rows: list[dict[str, Any]]
    silenced: int = 0
    folded: list[Folded] = field(default_factory=list)
    listings: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    acknowledged: int = 0

    @property
    def claimed(self) -> int:
        return len(self.rows) + self.silenced + self.acknowledged

    @property
    def holds(self) -> bool:
        """A resolved notice waits for one of these firing notifications (per-episode
        order, see claim_deliveries): once they are sent, claim again to send it."""
        return any(r["holds"] for r in self.rows)

    @property
    def summarized(self) -> int:
        return folded_counts(self.folded).summarized

    @property
    def summaries(self) -> int:
        return folded_counts(self.folded).summaries


def _listed(notifier: Notifier) -> int:
    """Alerts a summary lists (also for a summary made before ``storm`` was turned off)."""
    return notifier.storm.listed if notifier.storm is not None else DEFAULT_LISTED


# The claim rendered once with $n placeholders (slawatch.db.execute_raw): its text is
# longer than psycopg caches the parse of (4,096 characters), so it was parsed at each run.
# Prepared where the pooler allows (slawatch.db.may_prepare), and run on its generic
# plan there (_GENERIC): planned once per connection, not at every run.
CLAIM = render(
    sql.SQL(queries()["claim_deliveries"]),
    ("now", "owner", "lease", "limit", "notifier", "sent_alerts", "sent_owner"),
)


# The claim on its generic plan from its first run, in the claim's own transaction only
# (set_config(..., true), SET LOCAL: the pooled connection's other statements keep
# PostgreSQL's choice, which for the claim is a custom plan at every run). Planning was
# a quarter to a third of a claim's server CPU; the generic plan runs as fast as the
# custom ones (queries.sql, claim_deliveries). Without JIT: a cached plan keeps its
# plan but not its compiled code, and the generic plan's estimate grows with the
# pending deliveries and the ranges (no pruning at plan time, a LIMIT of unknown size)
# past jit_above_cost, so each claim over a backlog compiled its expressions again
# (385 ms a claim of 100 over 12,000 pending in 7 ranges, 14 ms without). This and the
# claim go in one request (slawatch.db.pipelined: one Sync, one implicit transaction),
# so the setting costs no round trip; it cost three (BEGIN, this, COMMIT) in an explicit
# transaction. Behind a transaction pooler nothing is prepared, and the claim is
# planned at each run as before.
_GENERIC = (
    "SELECT set_config('plan_cache_mode', 'force_generic_plan', true),"
    " set_config('jit', 'off', true)"
)
# Back to the connection's own settings for what follows the claim in its transaction.
_SETTLED = (
    "SELECT set_config(name, reset_val, true) FROM pg_settings"
    " WHERE name IN ('plan_cache_mode', 'jit')"
)


def id_array(ids: Collection[int]) -> str:
    """``ids`` as an array literal (``{1,2,3}``) for a ``::bigint[]`` parameter: a
    seventh of the time psycopg takes to adapt a list of ints (it looks at every one
    for the array's type)."""
    return "{" + ",".join(map(str, ids)) + "}"


def claim_deliveries(
    db: Database, notifier: Notifier, now: datetime, sent: _Batch | None = None
) -> _Batch:
    """Lease up to a batch of due deliveries to a fresh owner; settle ``sent`` (a batch
    the receiver accepted) as sent in the same statement, and what of it that statement
    could not lock at once in one more (mark_sent). If the statement fails, both
    stay undone: ``sent`` is sent again once its lease expires (at least once).

    For a notifier with ``storm``, the same transaction first folds storms into
    summaries under the notifier's storm lock (slawatch/delivery/storm.py)."""
    owner = uuid.uuid4()
    claim = {
        "now": now,
        "owner": owner,
        "lease": lease_for(notifier),
        "limit": notifier.batch,
        "notifier": notifier.name,
        "sent_alerts": id_array([r["alert_id"] for r in sent.rows] if sent else ()),
        "sent_owner": sent.owner if sent else None,
    }
    args = CLAIM.args(claim)
    storm = notifier.storm
    done: set[int] = set()  # of ``sent``, those the claim settled

    def run(conn: Connection) -> _Batch:
        # One unit, so Database.run may run it again. Without storm it is one request:
        # where nothing is prepared, the one claim statement, its own transaction; where
        # the claim is prepared, _GENERIC and the claim pipelined with one Sync, which
        # PostgreSQL runs as one implicit transaction (slawatch.db.pipelined): no BEGIN
        # and COMMIT round trips per batch either way (a listing is read only for a
        # summary made before storm was turned off, after the claim committed). With
        # storm the lock must be held from the fold to the end of the claim, in a
        # transaction.
        generic = prepares(conn)
        cur = raw_cursor(conn, dict_row)
        # On this cursor only (a microsecond): the pooled connection's other users
        # keep psycopg's own jsonb loader.
        cur.adapters.register_loader("jsonb", RowDataLoader)
        if storm:
            with conn.transaction():
                folded = storm_summarize(conn, notifier.name, storm, now)
                if generic:
                    conn.execute(_GENERIC)  # for the claim alone: not the fold, not listings
                got = cur.execute(CLAIM.query, args, prepare=True).fetchall()
                if generic and any(r["kind"] == "summary" for r in got):
                    conn.execute(_SETTLED)
                return _claimed(conn, got, folded)
        if generic:
            with pipelined(conn):
                conn.execute(_GENERIC)
                cur.execute(CLAIM.query, args, prepare=True)
        else:
            with one_statement(conn):
                cur.execute(CLAIM.query, args, prepare=True)
        return _claimed(conn, cur.fetchall(), [])

    def _claimed(conn: Connection, got: list[dict[str, Any]], folded: list[Folded]) -> _Batch:
        rows = [r for r in got if r["settled"] != "sent"]
        for r in got:
            if r["settled"] == "sent":
                done.update(r["sent"])
        send = [r for r in rows if r["settled"] is None]
        summaries = [r["alert_id"] for r in send if r["kind"] == "summary"]
        listed = listings(conn, summaries, _listed(notifier))
        silenced = sum(1 for r in rows if r["settled"] == "silenced")
        acked = len(rows) - len(send) - silenced
        return _Batch(owner, send, silenced, folded, listed, acked)

    batch = db.run(f"claiming deliveries for {notifier.name}", run)
    if sent is not None and (left := [r for r in sent.rows if r["id"] not in done]):
        # Rows another claim held locked for a moment (see claim_deliveries in queries.sql).
        mark = {
            "ids": id_array([r["id"] for r in left]),
            "alerts": id_array([r["alert_id"] for r in left]),
            "owner": sent.owner,
            "now": now,
        }
        db.run(
            f"recording deliveries for {notifier.name}",
            lambda conn: conn.execute(queries()["mark_sent"], mark),
        )
    if batch.silenced:
        log.debug("notifier %s: %d deliveries silenced", notifier.name, batch.silenced)
    if batch.acknowledged:
        log.debug("notifier %s: %d deliveries acknowledged", notifier.name, batch.acknowledged)
    _log_folded(notifier, batch.folded)
    return batch


def _log_folded(notifier: Notifier, folded: list[Folded]) -> None:
    for f in folded:
        log.log(
            logging.WARNING if f.made else logging.INFO,
            "notifier %s: %s of rule %s: %d deliveries summarized (summary alert %d)",
            notifier.name,
            "storm" if f.made else "storm goes on",
            f.rule,
            f.folded,
            f.summary_id,
        )


def _payloads(
    notifier: Notifier, batch: _Batch, descriptions: Mapping[str, str], admin_url: str | None
) -> list[dict[str, Any]]:
    listed = _listed(notifier)
    return [
        summary_payload(r, batch.listings.get(r["alert_id"], []), listed, descriptions, admin_url)
        if r["kind"] == "summary"
        else alert_payload(r, descriptions.get(r["rule"], ""))
        for r in batch.rows
    ]


def _send(
    notifier: Notifier,
    batch: _Batch,
    descriptions: Mapping[str, str],
    admin_url: str | None = None,
) -> DeliveryError | None:
    """Send one batch; the error if the receiver did not take it (its outage recorded)."""
    receiver = receiver_outage(notifier)
    started = time.monotonic()
    try:
        notifier.send(_payloads(notifier, batch, descriptions, admin_url))
    except DeliveryError as exc:
        error = exc
    except Exception as exc:  # a notifier bug must not stop the loop; keep its words
        error = DeliveryError(notifier.scrub(f"{type(exc).__name__}: {exc}"))
    else:
        receiver.ok()
        return None
    receiver.failed(str(error), started)
    return error


def _deliver(
    db: Database,
    notifier: Notifier,
    clock: Clock,
    batch: _Batch,
    descriptions: Mapping[str, str],
    claim_next: bool,
    metrics: Metrics | None = None,
    admin_url: str | None = None,
) -> tuple[PassResult, _Batch]:
    """Send a claimed batch and settle it. With ``claim_next``, a full batch that was
    accepted is settled by the claim of the next one, which is returned.

    A batch that ``holds`` a resolved notice back is settled by a claim even when it
    is short: that claim takes the notice now that its firing notifications went out.

    Counted (metrics, the batch's log line) once settled: a batch whose outcome was
    not recorded is sent again, and counted then. Silenced, acknowledged and summarized
    deliveries were settled by the claim and are counted with the batch whatever
    becomes of it."""
    started = time.monotonic()
    unsent = PassResult(
        silenced=batch.silenced,
        acknowledged=batch.acknowledged,
        summarized=batch.summarized,
        summaries=batch.summaries,
    )
    if not batch.rows:  # all settled by the claim already (silenced, acknowledged, summarized)
        _settled(notifier, unsent, started, metrics, clock.now(), [])
        if claim_next and batch.claimed >= notifier.batch:
            return unsent, claim_deliveries(db, notifier, clock.now())
        return unsent, _Batch(batch.owner, [])
    error = _send(notifier, batch, descriptions, admin_url)
    accepted = clock.now()
    if error is not None:
        failed = _settle_failure(db, notifier, clock.now(), batch.owner, batch.rows, error)
        failed += unsent
        _settled(notifier, failed, started, metrics, accepted, [])
        return failed, _Batch(batch.owner, [])
    done = PassResult(sent=len(batch.rows))
    done += unsent
    # The claim's times are text (queries.sql); only the metrics want them as datetimes.
    fired = [] if metrics is None else [datetime.fromisoformat(r["fired_at"]) for r in batch.rows]
    if claim_next and (batch.claimed >= notifier.batch or batch.holds):
        following = claim_deliveries(db, notifier, clock.now(), sent=batch)
        _settled(notifier, done, started, metrics, accepted, fired)
        return done, following
    # A short batch: nothing more was due (or held back), so no claim to ride on.
    sent = {
        "ids": id_array([r["id"] for r in batch.rows]),
        "alerts": id_array([r["alert_id"] for r in batch.rows]),
        "owner": batch.owner,
        "now": clock.now(),
    }
    query = queries()["mark_sent"]
    db.run(f"recording deliveries for {notifier.name}", lambda conn: conn.execute(query, sent))
    _settled(notifier, done, started, metrics, accepted, fired)
    return done, _Batch(batch.owner, [])


def _settled(
    notifier: Notifier,
    result: PassResult,
    started: float,
    metrics: Metrics | None,
    accepted: datetime,
    fired: list[datetime],
) -> None:
    """One log line for a settled batch, and its metrics.

    A batch that only retried is a DEBUG line: while a receiver is down its outage
    line says it, and a line per attempt would drown the log."""
    ms = (time.monotonic() - started) * 1000
    unsent = result.silenced or result.summarized or result.acknowledged
    level = logging.INFO if result.sent or result.dead or unsent else logging.DEBUG
    silenced = f", {result.silenced} silenced" if result.silenced else ""
    summarized = f", {result.summarized} summarized" if result.summarized else ""
    acked = f", {result.acknowledged} acknowledged" if result.acknowledged else ""
    activity.log(
        level,
        "notifier %s: %d sent, %d retried, %d dead%s%s%s in %.0f ms",
        notifier.name,
        result.sent,
        result.retried,
        result.dead,
        silenced,
        summarized,
        acked,
        ms,
        extra={
            "notifier": notifier.name,
            "sent": result.sent,
            "retried": result.retried,
            "dead": result.dead,
            "silenced": result.silenced,
            "summarized": result.summarized,
            "acknowledged": result.acknowledged,
            "ms": round(ms, 1),
        },
    )
    if metrics is not None:
        metrics.delivered(
            Settled(
                notifier.name,
                accepted,
                fired,
                retried=result.retried,
                dead=result.dead,
                silenced=result.silenced,
                summarized=result.summarized,
                summaries=result.summaries,
                acknowledged=result.acknowledged,
            )
        )


def deliver_batch(
    db: Database,
    notifier: Notifier,
    clock: Clock,
    descriptions: Mapping[str, str] | None = None,
    metrics: Metrics | None = None,
    admin_url: str | None = None,
) -> PassResult:
    """Claim, send and settle at most one batch of ``notifier``'s due deliveries.

    Each delivery is settled by its own attempt count: in a failed batch, those
    at their last attempt go dead, the others retry after their own backoff.
    """
    batch = claim_deliveries(db, notifier, clock.now())
    return _deliver(db, notifier, clock, batch, descriptions or {}, False, metrics, admin_url)[0]


def _settle_failure(
    db: Database,
    notifier: Notifier,
    now: datetime,
    owner: uuid.UUID,
    rows: list[dict[str, Any]],
    error: DeliveryError,
) -> PassResult:
    q = queries()
    last = notifier.retry.attempts
    dead = [r for r in rows if error.permanent or r["attempts"] >= last]
    retry = [r for r in rows if not (error.permanent or r["attempts"] >= last)]
    # One jitter for the batch: deliveries at the same attempt stay together.
    jitter = random.uniform(0.8, 1.0)
    nexts = [now + retry_delay(notifier, r["attempts"], error, jitter) for r in retry]

    def settle(conn: Connection) -> None:
        with conn.transaction():  # one unit, so Database.run may run it again
            if dead:
                conn.execute(
                    q["mark_dead"],
                    {
                        "ids": id_array([r["id"] for r in dead]),
                        "alerts": id_array([r["alert_id"] for r in dead]),
                        "owner": owner,
                        "error": str(error),
                    },
                )
            if retry:
                conn.execute(
                    q["mark_retry"],
                    {
                        "ids": id_array([r["id"] for r in retry]),
                        "alerts": id_array([r["alert_id"] for r in retry]),
                        "nexts": nexts,
                        "owner": owner,
                        "error": str(error),
                    },
                )

    db.run(f"recording deliveries for {notifier.name}", settle)
    if dead:
        why = "permanent failure" if error.permanent else f"attempt {last} was the last"
        log.error("notifier %s: %d deliveries dead (%s): %s", notifier.name, len(dead), why, error)
    if retry:
        log.debug(
            "notifier %s: %d deliveries will retry from %s: %s",
            notifier.name,
            len(retry),
            min(nexts).isoformat(timespec="seconds"),
            error,
        )
    return PassResult(retried=len(retry), dead=len(dead))


# The outbox in rows (0020_outbox_rows.sql; docs/explanation/outbox-rows.md): sends a
# worker takes in a row before it goes back to its notifier's deliveries where one is
# due, so that neither shape waits for the other's whole backlog.
ROWS_PER_TURN = 10


@dataclass
class RowSend:
    """One leased send of a row to a notifier (``row_id`` None: nothing was due): the row's
    ``rule``, ``kind`` and ``fired_at``, its elements from ``done`` on as the row's arrays
    (element j of them is the row's element ``done + 1 + j``; the times as text), and per
    element why it is settled unsent (``skips``; None: none is); the ``skipped`` recorded
    before, and whether the lease statement settled the send before it (``settled``)."""

    owner: uuid.UUID
    row_id: int | None
    attempts: int = 0
    done: int = 0
    size: int = 0
    skipped: list[str | None] = field(default_factory=list)
    rule: str = ""
    kind: str = "firing"
    fired_at: str = ""
    keys: list[str] = field(default_factory=list)
    episodes: list[int] = field(default_factory=list)
    ns: list[int] = field(default_factory=list)
    severities: list[str] = field(default_factory=list)
    deadlines: list[str | None] = field(default_factory=list)
    due_ats: list[str | None] = field(default_factory=list)
    row_data: list[Any] = field(default_factory=list)
    skips: list[str | None] | None = None
    settled: bool = False
    folded: list[Folded] = field(default_factory=list)  # storms folded before the lease

    @property
    def left(self) -> int:
        """The elements leased: from ``done`` on."""
        return len(self.keys)

    def payloads(self, chunk: range | list[int], description: str) -> list[dict[str, Any]]:
        """The payloads of the elements at ``chunk`` (positions in the arrays)."""
        if isinstance(chunk, range):
            a, b = chunk.start, chunk.stop
            elements: Iterable[tuple[Any, ...]] = zip(
                self.keys[a:b],
                self.episodes[a:b],
                self.ns[a:b],
                self.severities[a:b],
                self.deadlines[a:b],
                self.due_ats[a:b],
                self.row_data[a:b],
                strict=True,
            )
        else:
            elements = (
                (
                    self.keys[j],
                    self.episodes[j],
                    self.ns[j],
                    self.severities[j],
                    self.deadlines[j],
                    self.due_ats[j],
                    self.row_data[j],
                )
                for j in chunk
            )
        return row_payloads(self.rule, self.kind, self.fired_at, description, elements)


class RowDataBinaryLoader(RowDataLoader):
    """:class:`RowDataLoader` for a json value in binary form (the lease's answer):
    PostgreSQL sends json's text as its binary form."""

    format = Format.BINARY


# The lease: a call of slawatch.lease_row_send (0025_lease_row_send.sql), which PL/pgSQL
# plans once per server session on its generic plan without JIT, behind a transaction
# pooler too; short enough for psycopg to keep its parse, prepared where the pooler allows.
LEASE = queries()["lease_row_send"]


@dataclass(frozen=True)
class RowSent:
    """A send whose last chunk was accepted, to settle: its owner, ``done`` and ``skipped``."""

    row_id: int
    owner: uuid.UUID
    done: int
    skipped: list[str | None] | None


def lease_row_send(
    db: Database, notifier: Notifier, now: datetime, sent: RowSent | None = None
) -> RowSend:
    """Lease one due send of ``notifier`` to a fresh owner; settle ``sent`` as sent in the
    same statement (queries.sql, lease_row_send), or, where that statement could not lock
    it at once, in one more (mark_row_sent).

    For a notifier with ``storm``, the same transaction first folds storms under the
    notifier's storm lock, as claim_deliveries does (slawatch/delivery/storm.py): the
    sends due of a storm are folded before any of them is leased, also those that came
    after the last claim of deliveries (docs/reference/notifiers.md, "storm")."""
    owner = uuid.uuid4()
    params = {
        "now": now,
        "owner": owner,
        "lease": lease_for(notifier),
        "notifier": notifier.name,
        "sent_row": sent.row_id if sent else None,
        "sent_owner": sent.owner if sent else None,
        "sent_done": sent.done if sent else None,
        "sent_skipped": sent.skipped if sent else None,
    }
    storm = notifier.storm

    def run(conn: Connection) -> tuple[list[tuple[Any, ...]], list[Folded]]:
        # The answer in binary: its arrays of text and integers are read without the
        # text form's quoting and escapes (a seventh of the lease's Python, a little of
        # the server's). The elements' row_data come as one json array (queries.sql,
        # lease_row_send), whose binary form is its text.
        cur = conn.cursor(row_factory=tuple_row, binary=True)
        cur.adapters.register_loader("json", RowDataBinaryLoader)
        if storm is not None:
            with conn.transaction():  # the storm lock held from the fold to the lease's end
                folded = storm_summarize(conn, notifier.name, storm, now)
                return cur.execute(LEASE, params).fetchall(), folded
        with one_statement(conn):
            cur.execute(LEASE, params)
        return cur.fetchall(), []

    got, folded = db.run(f"leasing a row send for {notifier.name}", run)
    _log_folded(notifier, folded)
    (
        row_id,
        attempts,
        done,
        skipped,
        size,
        rule,
        kind,
        fired_at,
        keys,
        episodes,
        ns,
        severities,
        deadlines,
        due_ats,
        row_data,
        skips,
        settled,
    ) = got[0]
    if sent is not None and not settled:
        mark_row_sent(db, notifier, now, sent)
    if row_id is None:
        return RowSend(owner, None, settled=bool(settled), folded=folded)
    skipped = list(skipped or ())[:done]
    skipped += [None] * (done - len(skipped))
    return RowSend(
        owner,
        row_id,
        attempts,
        done,
        size,
        skipped,
        rule=rule,
        kind=kind,
        fired_at=fired_at,
        keys=keys,
        episodes=episodes,
        ns=ns,
        severities=severities,
        deadlines=deadlines,
        due_ats=due_ats,
        row_data=row_data,
        skips=skips,
        settled=bool(settled),
        folded=folded,
    )


def mark_row_sent(db: Database, notifier: Notifier, now: datetime, sent: RowSent) -> None:
    """Settle ``sent`` as sent, fenced by its owner (queries.sql, mark_row_sent)."""
    params = {
        "row_id": sent.row_id,
        "notifier": notifier.name,
        "owner": sent.owner,
        "now": now,
        "done": sent.done,
        "skipped": sent.skipped,
    }
    query = queries()["mark_row_sent"]
    db.run(f"recording a row send for {notifier.name}", lambda c: c.execute(query, params))


def _recorded(skipped: list[str | None]) -> list[str | None] | None:
    """``skipped`` as stored: NULL when no element was skipped."""
    return None if skipped.count(None) == len(skipped) else skipped


def deliver_row_send(
    db: Database,
    notifier: Notifier,
    clock: Clock,
    send: RowSend,
    descriptions: Mapping[str, str],
    lease_next: bool,
    metrics: Metrics | None = None,
) -> tuple[PassResult, RowSend | None]:
    """Send a leased row send in chunks of the notifier's batch from its ``done`` on, the
    progress recorded after each accepted chunk but the last; settle it (sent, by the lease
    of the next one with ``lease_next``; retry; dead). The next send leased, if any."""
    assert send.row_id is not None
    started = time.monotonic()
    q = queries()
    left, batch = send.left, notifier.batch
    skips: list[str | None] = send.skips if send.skips is not None else [None] * left
    skipped = send.skipped + skips
    # Positions in the row's arrays, a chunk per request: ranges where nothing is skipped.
    chunks: list[range | list[int]]
    if send.skips is not None and skips.count(None) != left:
        unsent = [j for j, s in enumerate(skips) if s is None]
        chunks = [unsent[a : a + batch] for a in range(0, len(unsent), batch)]
    else:
        chunks = [range(a, min(a + batch, left)) for a in range(0, left, batch)]
    to_send = sum(len(c) for c in chunks)
    description = descriptions.get(send.rule, "")
    receiver = receiver_outage(notifier)
    done, sent = send.done, 0
    fired: list[datetime] = []
    fired_at = datetime.fromisoformat(send.fired_at) if metrics is not None else None

    def unsent_counts(upto: int) -> PassResult:
        # What this run settled unsent: the skipped elements up to ordinal ``upto``.
        mine = skips[: upto - send.done]
        return PassResult(silenced=mine.count("silenced"), acknowledged=mine.count("acknowledged"))

    for k, chunk in enumerate(chunks):
        error: DeliveryError | None = None
        chunk_started = time.monotonic()
        try:
            notifier.send(send.payloads(chunk, description))
        except DeliveryError as exc:
            error = exc
        except Exception as exc:  # a notifier bug must not stop the loop; keep its words
            error = DeliveryError(notifier.scrub(f"{type(exc).__name__}: {exc}"))
        accepted = clock.now()
        if error is not None:
            receiver.failed(str(error), chunk_started)
            result = _settle_row_failure(db, notifier, clock.now(), send, to_send - sent, error)
            result.sent = sent
            result += unsent_counts(done)
            _settled(notifier, result, started, metrics, accepted, fired)
            return result, None
        receiver.ok()
        sent += len(chunk)
        if fired_at is not None:
            fired += [fired_at] * len(chunk)
        if k == len(chunks) - 1:
            break
        done = send.done + chunk[-1] + 1
        params = {
            "row_id": send.row_id,
            "notifier": notifier.name,
            "owner": send.owner,
            "now": accepted,
            "lease": lease_for(notifier),
            "done": done,
            "skipped": _recorded(skipped[:done]),
        }

        def progress(conn: Connection, p: dict[str, Any] = params) -> bool:
            return conn.execute(q["row_send_progress"], p).fetchone() is not None

        if not db.run(f"recording a row send for {notifier.name}", progress):
            # The lease was taken over (this worker stalled past it): the new owner
            # sends from the progress recorded; this one changes nothing more.
            log.warning(
                "notifier %s: lost the lease of row %d's send after %d alerts; its new"
                " owner goes on",
                notifier.name,
                send.row_id,
                sent,
            )
            result = PassResult(sent=sent)
            _settled(notifier, result, started, metrics, accepted, fired)
            return result, None
    result = PassResult(sent=sent)
    result += unsent_counts(send.size)
    finished = RowSent(send.row_id, send.owner, send.size, _recorded(skipped))
    now = clock.now()
    following = None
    if lease_next:
        following = lease_row_send(db, notifier, now, sent=finished)
    else:
        mark_row_sent(db, notifier, now, finished)
    _settled(notifier, result, started, metrics, now, fired)
    return result, following


def _settle_row_failure(
    db: Database,
    notifier: Notifier,
    now: datetime,
    send: RowSend,
    left: int,
    error: DeliveryError,
) -> PassResult:
    """A chunk failed: the send retries after the notifier's backoff (or Retry-After),
    from the progress recorded, or goes dead after the last attempt or at once when
    permanent. ``left``: its alerts not sent, counted as retried or dead."""
    last = notifier.retry.attempts
    dead = error.permanent or send.attempts >= last
    params: dict[str, Any] = {
        "row_id": send.row_id,
        "notifier": notifier.name,
        "owner": send.owner,
        "error": str(error),
    }
    if dead:
        query = queries()["mark_row_dead"]
    else:
        query = queries()["mark_row_retry"]
        params["next"] = now + retry_delay(notifier, send.attempts, error, random.uniform(0.8, 1.0))
    db.run(f"recording a row send for {notifier.name}", lambda c: c.execute(query, params))
    if dead:
        why = "permanent failure" if error.permanent else f"attempt {last} was the last"
        log.error(
            "notifier %s: row %d's send dead, %d alerts unsent (%s): %s",
            notifier.name,
            send.row_id,
            left,
            why,
            error,
        )
        return PassResult(dead=left)
    log.debug(
        "notifier %s: row %d's send will retry from %s: %s",
        notifier.name,
        send.row_id,
        params["next"].isoformat(timespec="seconds"),
        error,
    )
    return PassResult(retried=left)


def deliver_rows(
    db: Database,
    notifier: Notifier,
    clock: Clock,
    descriptions: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
    metrics: Metrics | None = None,
    turn: int | None = ROWS_PER_TURN,
) -> tuple[PassResult, int]:
    """Row sends of ``notifier`` one after the other until none is due, the receiver
    fails, ``stop`` is set or ``turn`` sends were leased (None: no bound) while a delivery
    of today's outbox is due; each accepted one settled by the lease of the next. What
    they did, and how many were leased.

    A turn used up with no delivery due goes on: the worker asks (:func:`due_by_shape`)
    before the turn's last send, whose settle then rides on the next lease as within a
    turn, where a turn that ended paid a statement for its settle and another for the
    question between turns (docs/explanation/outbox-rows.md, "Delivery")."""
    total, leased, in_turn = PassResult(), 0, 0
    send: RowSend | None = lease_row_send(db, notifier, clock.now())
    while send is not None:
        if send.folded:  # settled unsent by the lease's fold: counted as they are
            started = time.monotonic()
            summarized = folded_counts(send.folded)
            _settled(notifier, summarized, started, metrics, clock.now(), [])
            total += summarized
        if send.row_id is None:
            break
        leased += 1
        in_turn += 1
        more = stop is None or not stop.is_set()
        if more and turn is not None and in_turn >= turn:
            # The turn's last send: back to the deliveries after it if one is due, else
            # a new turn of sends.
            more, in_turn = not due_by_shape(db, notifier, clock.now())[0], 0
        result, send = deliver_row_send(
            db, notifier, clock, send, descriptions or {}, more, metrics
        )
        total += result
    return total, leased


def deliver_notifier(
    db: Database,
    notifier: Notifier,
    clock: Clock,
    descriptions: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
    metrics: Metrics | None = None,
    admin_url: str | None = None,
) -> PassResult:
    """Batches one after the other until none is due, then a turn of row sends
    (:func:`deliver_rows`), again while a turn was used up; stops early when the
    receiver fails (it is down), or after the batch or send in hand once ``stop`` is set.

    Each accepted full batch is settled by the statement that claims the next.
    ``admin_url``: the admin API's address, for the link in storm summaries.
    """
    total = PassResult()
    if stop is not None and stop.is_set():
        return total
    deliveries, sends = due_by_shape(db, notifier, clock.now())
    while deliveries or sends:
        if deliveries:
            batch = claim_deliveries(db, notifier, clock.now())
            while batch.claimed or batch.folded:
                more = stop is None or not stop.is_set()
                result, batch = _deliver(
                    db, notifier, clock, batch, descriptions or {}, more, metrics, admin_url
                )
                total += result
            if stop is not None and stop.is_set():
                return total
        # Then the sends of the outbox in rows, a turn of them, and back to the
        # deliveries while the turn was used up (more may be due of either shape).
        result, leased = PassResult(), 0
        if sends:
            result, leased = deliver_rows(db, notifier, clock, descriptions, stop, metrics)
            total += result
            if result.retried or result.dead:
                return total
        if stop is not None and stop.is_set():
            return total
        if leased < ROWS_PER_TURN and not (result.sent or result.summaries):
            return total
        # A turn used up, or one that sent something or made a storm summary (a
        # delivery): which shape has more due. A resolved notice of today's outbox
        # waits for a firing row sent now (claim_deliveries): it follows in this pass,
        # as one held by a batch does; so does a summary the lease's fold made. One
        # query between turns, where a claim of deliveries that took nothing was.
        deliveries, sends = due_by_shape(db, notifier, clock.now())
    return total


def due_by_shape(db: Database, notifier: Notifier, now: datetime) -> tuple[bool, bool]:
    """Whether ``notifier`` has a delivery due at ``now`` that no lease holds (what a claim
    could take, or a resolved notice held back behind its firing one), and whether it has
    a row send so due (the outbox in rows: what a lease could take). Asked before a worker
    claims after it wakes, and between its turns of row sends: the claim is a large
    statement (planned at every run behind a transaction pooler), this function's query
    is planned once per server process (0017_deliveries_due.sql,
    0024_deliveries_due_by_shape.sql)."""
    query, params = queries()["deliveries_due"], {"notifier": notifier.name, "now": now}

    def ask(conn: Connection) -> tuple[bool, bool]:
        row = conn.execute(query, params).fetchone()
        return (bool(row[0]), bool(row[1])) if row else (False, False)

    return db.run(f"looking for due deliveries of {notifier.name}", ask)


def deliveries_due(db: Database, notifier: Notifier, now: datetime) -> bool:
    """Whether ``notifier`` has a delivery or a row send due at ``now`` that no lease
    holds (:func:`due_by_shape`, either shape)."""
    return any(due_by_shape(db, notifier, now))


def deliver_due(
    db: Database,
    notifiers: Mapping[str, Notifier],
    clock: Clock,
    descriptions: Mapping[str, str] | None = None,
    admin_url: str | None = None,
) -> PassResult:
    """One pass over every notifier (``run --once``)."""
    total = PassResult()
    for notifier in notifiers.values():
        total += deliver_notifier(db, notifier, clock, descriptions, admin_url=admin_url)
    return total


class _Workers:
    """The worker threads of one notifier, with a stop of their own (a reload may
    remove the notifier while the others go on)."""

    def __init__(self, notifier: Notifier, concurrency: int) -> None:
        self.notifier = notifier
        self.stop = threading.Event()
        # One event per worker: a worker busy when a NOTIFY came must still see it.
        self.wake = [threading.Event() for _ in range(max(concurrency, 1))]
        self.threads: list[threading.Thread] = []
        # Failures other than an unreachable database (which the database logs): a broken
        # schema, a bug. One record per notifier, so N workers failing alike are one line.
        self.trouble = Outage(f"delivery worker for {notifier.name}", log)


class Dispatcher:
    """Delivery worker threads, ``concurrency[name]`` per notifier (1 if not
    given), woken by NOTIFY or by the poll.

    No failure ends a thread: each waits with a capped backoff (``backoff_cap``
    seconds, cut short by :meth:`stop`) and tries again. :meth:`add` and
    :meth:`remove` start and stop one notifier's workers while the others run.
    """

    def __init__(
        self,
        db: Database,
        notifiers: Mapping[str, Notifier],
        clock: Clock,
        descriptions: Mapping[str, str] | None = None,
        poll: float = POLL,
        backoff_cap: float = BACKOFF_CAP,
        concurrency: Mapping[str, int] | None = None,
        metrics: Metrics | None = None,
        admin_url: str | None = None,
    ) -> None:
        self.db, self.clock, self.descriptions, self.poll = db, clock, descriptions, poll
        self.backoff_cap, self.metrics, self.admin_url = backoff_cap, metrics, admin_url
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._groups = {
            name: _Workers(n, (concurrency or {}).get(name, 1)) for name, n in notifiers.items()
        }
        self._listener: threading.Thread | None = None
        self._started = False
        self.polling = False  # LISTEN is not used here: the workers poll

    @property
    def notifiers(self) -> dict[str, Notifier]:
        """The notifiers whose workers run (or will run at :meth:`start`)."""
        with self._lock:
            return {name: g.notifier for name, g in self._groups.items()}

    def start(self) -> None:
        """Start the workers of every notifier and the listener."""
        with self._lock:
            self._started = True
            groups = list(self._groups.values())
        for group in groups:
            self._start(group)
        self._listener = threading.Thread(target=self._listen, name="listen", daemon=True)
        self._listener.start()

    def _start(self, group: _Workers) -> None:
        name = group.notifier.name
        for i, wake in enumerate(group.wake):
            suffix = f"-{i + 1}" if len(group.wake) > 1 else ""
            t = threading.Thread(
                target=self._work, args=(group, wake), name=f"deliver-{name}{suffix}", daemon=True
            )
            group.threads.append(t)
            t.start()

    def add(self, notifier: Notifier, concurrency: int = 1) -> None:
        """Start workers for ``notifier`` (a name not running now)."""
        group = _Workers(notifier, concurrency)
        with self._lock:
            if notifier.name in self._groups:
                raise ValueError(f"notifier {notifier.name!r} has workers already")
            self._groups[notifier.name] = group
            started = self._started
        if started:
            self._start(group)

    def remove(self, name: str) -> Notifier | None:
        """Stop ``name``'s workers, each after the batch in hand; return its notifier."""
        with self._lock:
            group = self._groups.pop(name, None)
        if group is None:
            return None
        group.stop.set()
        for event in group.wake:
            event.set()
        for t in group.threads:
            t.join()
        return group.notifier

    def stop(self) -> None:
        """Let each worker finish the batch in hand, then return."""
        self._stop.set()
        with self._lock:
            groups = list(self._groups.values())
        for group in groups:
            group.stop.set()
        self.wake()
        for group in groups:
            for t in group.threads:
                t.join()
        if self._listener is not None:
            self._listener.join()

    def wake(self) -> None:
        """Make every worker look for due deliveries now."""
        with self._lock:
            groups = list(self._groups.values())
        for group in groups:
            for event in group.wake:
                event.set()

    def alive(self) -> dict[str, bool]:
        """Per notifier: whether every one of its worker threads is running; and
        ``"listen"``: the listener (or True when the workers poll instead, by design)."""
        with self._lock:
            groups = dict(self._groups)
        alive = {
            name: bool(g.threads) and all(t.is_alive() for t in g.threads)
            for name, g in groups.items()
        }
        listener = self._listener is not None and self._listener.is_alive()
        alive["listen"] = listener or self.polling
        return alive

    def _work(self, group: _Workers, wake: threading.Event) -> None:
        backoff = Backoff(cap=self.backoff_cap)
        notifier, trouble = group.notifier, group.trouble
        while not group.stop.is_set():
            since = time.monotonic()
            try:
                deliver_notifier(
                    self.db,
                    notifier,
                    self.clock,
                    self.descriptions,
                    group.stop,
                    self.metrics,
                    self.admin_url,
                )
            except DatabaseUnavailable:
                wait = backoff.next()
            except SlawatchError as exc:
                trouble.failed(str(exc), since)
                wait = backoff.next()
            except Exception as exc:
                trouble.failed(f"unexpected {type(exc).__name__}: {exc}", since, exc_info=exc)
                wait = backoff.next()
            else:
                trouble.ok()
                backoff.reset()
                wait = self.poll
            wake.wait(wait)
            wake.clear()

    def _listen(self) -> None:
        if self.db.pooler == "transaction":
            log.info("SLAWATCH_POOLER=transaction: no LISTEN; polling every %gs", self.poll)
            self.polling = True
            return
        backoff = Backoff(cap=self.backoff_cap)
        trouble = Outage("delivery listener", log, level=logging.WARNING)
        while not self._stop.is_set():
            since = time.monotonic()
            try:
                if not self._listen_until_stopped(backoff, trouble):
                    return
            except DatabaseUnavailable:
                pass  # the database's outage line says it
            except SlawatchError as exc:
                trouble.failed(str(exc), since)
            except Exception as exc:
                trouble.failed(f"unexpected {type(exc).__name__}: {exc}", since, exc_info=exc)
            self._stop.wait(backoff.next())

    def _listen_until_stopped(self, backoff: Backoff, trouble: Outage) -> bool:
        """LISTEN and wake the workers on each NOTIFY until stopped.

        Returns False when LISTEN does not work here (the workers poll instead).
        """
        with self.db.dedicated("listening for new deliveries") as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            if not self._notify_arrives(conn):
                # Through a transaction pooler LISTEN runs on a server session that is
                # handed to other clients next: it is accepted, and nothing ever comes.
                log.warning(
                    "LISTEN does not reach this connection (transaction pooler?); "
                    "polling every %gs",
                    self.poll,
                )
                self.polling = True
                return False
            backoff.reset()
            trouble.ok()
            while not self._stop.is_set():
                # A short timeout only to notice stop(); a NOTIFY returns at once.
                for _ in conn.notifies(timeout=0.5, stop_after=1):
                    self.wake()
        return True

    def _notify_arrives(self, conn: Connection) -> bool:
        """Whether a NOTIFY sent from another (pooled) connection reaches ``conn``."""
        token = uuid.uuid4().hex
        self.db.run(
            "probing LISTEN",
            lambda c: c.execute("SELECT pg_notify(%s, %s)", (CHANNEL, token)),
        )
        deadline = time.monotonic() + PROBE_WAIT
        while (left := deadline - time.monotonic()) > 0:
            if self._stop.is_set():
                return True
            for notify in conn.notifies(timeout=min(left, 0.5), stop_after=1):
                if notify.payload == token:
                    return True
                self.wake()  # a claim's NOTIFY arrived meanwhile
        return False
