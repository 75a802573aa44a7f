"""Storms: many alerts of one rule at once go to a notifier as one summary.

A carrier outage makes 20,000 orders late in one scan; nobody wants 20,000 pages.
A notifier with ``storm: {threshold: 100, listed: 20, wait: 10s}`` gets, when more
than ``threshold`` notifications of one rule are due for it at once, one summary
message ("20,000 rows overdue for order_unshipped, first 20 listed, see ...")
instead. Every alert is still claimed and recorded as before; only its delivery
to that notifier changes.

Where: at the delivery claim (``summarize_storms`` in queries.sql), not at the scan's
claim. The outbox then holds the whole storm whichever claim batches, rules' batch
sizes or processes wrote it, the claim stays one statement per batch, and the
threshold is per notifier, as the decision is. Each claim of a storm-enabled
notifier first takes a transaction-level advisory lock for that notifier, so one
claim at a time (in any process) counts and folds: concurrent workers and several
processes make exactly one summary of the same alerts.

How: a summary is an alert of kind ``summary`` with one delivery, to that notifier,
written in the transaction that settles the deliveries it replaces as
``summarized`` (each pointing at it by ``summary_id``). It is then delivered like
any alert: leased, retried, dead-lettered, fenced, with an idempotency id
``{rule}:storm:{notifier}:{first alert id}``. Its delivery waits ``wait`` before it
is due; until it is first attempted, every later due notification of the rule for
that notifier is folded into it (however few), so a storm spread over several
claim batches of one drain is one summary. Once attempted, its content is fixed
(each retry sends the same); later alerts are a new storm or go one by one.

What counts: first attempts of notifications (first notices and re-notifications).
Resolved notices always go one by one (they close what the receiver opened), and a
delivery matched by an active silence is silenced, one of an acknowledged episode
acknowledged, neither counted (silences and acks win).

The outbox in rows (docs/explanation/outbox-rows.md) folds the same way: a firing row's
send due and never attempted counts by its alerts from its ``done`` on, those skipped,
silenced or acknowledged left out (recorded in its ``skipped``); folded, it is settled
``summarized`` pointing at the summary (``summary_id``), and the summary lists its
alerts after those of deliveries. A worker's lease of a row send folds first under the
same lock (dispatcher.lease_row_send), so rows that come due between two claims of
deliveries fold into the open summary too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, get_args
from urllib.parse import urlencode

from psycopg.rows import dict_row

from slawatch.config.notifiers import StormSettings
from slawatch.config.rules import Severity
from slawatch.db import Connection
from slawatch.engine.outbox import alert_id, alert_payload, iso
from slawatch.engine.queries import queries

# Lowest first (as rules.Severity lists them): a summary takes the highest severity
# of what it stands for. Named apart from outbox.SEVERITIES, an SQL fragment.
SEVERITY_ORDER = list(get_args(Severity))


@dataclass(frozen=True)
class Folded:
    """What one claim did about a rule's storm: ``folded`` deliveries settled
    'summarized' into the summary alert ``summary_id``, ``made`` by this claim or an
    open one grown."""

    rule: str
    summary_id: int
    made: bool
    folded: int


def summarize(conn: Connection, notifier: str, storm: StormSettings, now: datetime) -> list[Folded]:
    """Take the notifier's storm lock and fold its storms (in the caller's transaction,
    which must then claim: the lock is held until it ends)."""
    q = queries()
    conn.execute(q["storm_lock"], {"notifier": notifier})
    params = {
        "notifier": notifier,
        "now": now,
        "threshold": storm.threshold,
        "wait": storm.wait,
        "severities": SEVERITY_ORDER,
    }
    rows = conn.execute(q["summarize_storms"], params).fetchall()
    return [Folded(str(r), int(s), bool(m), int(f)) for r, s, m, f in rows if f]


def listings(
    conn: Connection, summary_ids: list[int], listed: int
) -> dict[int, list[dict[str, Any]]]:
    """Per summary alert id, its first ``listed`` alerts (at least the first one, whose
    fired_at starts the link's time range)."""
    if not summary_ids:
        return {}
    params = {"ids": summary_ids, "limit": max(listed, 1)}
    cur = conn.cursor(row_factory=dict_row)
    got: dict[int, list[dict[str, Any]]] = {i: [] for i in summary_ids}
    for row in cur.execute(queries()["storm_listing"], params).fetchall():
        del row["part"], row["place"]  # their order: deliveries, then the outbox's rows
        got[row.pop("summary_id")].append(row)
    return got


def alerts_link(admin_url: str | None, rule: str, since: datetime | str) -> str | None:
    """The admin API's list of the rule's summarized alerts from the storm's first one
    on (``/v1/alerts?rule=...&status=summarized&since=...``); None without an address.
    It lists every notifier's summarized alerts of the rule since then: the storm's,
    and a later storm's if one came."""
    if not admin_url:
        return None
    query = urlencode({"rule": rule, "status": "summarized", "since": iso(since)})
    return f"{admin_url.rstrip('/')}/v1/alerts?{query}"


def summary_payload(
    row: Mapping[str, Any],
    listing: list[dict[str, Any]],
    listed: int,
    descriptions: Mapping[str, str],
    admin_url: str | None,
) -> dict[str, Any]:
    """A summary as receivers see it: the alert fields (``status`` "summary", ``n`` 0,
    ``row`` the summary's own record), ``count``, ``first`` (the first ``listed``
    alerts, whole), ``listed``, ``since`` and ``link``; ``description`` says it in words."""
    rule, count = row["rule"], int(row["row_data"]["count"])
    about = descriptions.get(rule, "")
    first = [alert_payload(a, about) for a in listing[:listed]]
    since = listing[0]["fired_at"] if listing else row["fired_at"]
    link = alerts_link(admin_url, rule, since)
    words = f"{count:,} rows overdue for {rule}" + (f" ({about})" if about else "")
    words += f", first {len(first)} listed" if first else ""
    words += f", see {link}" if link else ""
    return {
        "id": alert_id(rule, row["key"], 0, 0, "summary"),
        "status": "summary",
        "rule": rule,
        "key": row["key"],
        "episode": 0,
        "n": 0,
        "severity": row["severity"],
        "deadline": None,
        "due_at": None,
        "fired_at": iso(row["fired_at"]),
        "row": row["row_data"],
        "count": count,
        "listed": len(first),
        "first": first,
        "since": iso(since),
        "link": link,
        "description": words,
    }
