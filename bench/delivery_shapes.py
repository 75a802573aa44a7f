"""The lean outbox's delivery side, measured before it is built: a drain of B100's rows
(bench/outbox_shapes.py: one outbox row per delivery batch of 100 alerts, its keys,
episodes, n, deadlines, severities and rows' data as arrays) beside today's drain, each
against straight POSTs of the same bodies.

Each round runs every variant once, interleaved, the order turning each round:

- ``today``: bench/delivery.py's ``drain_once``: ``--alerts`` claimed into today's
  outbox, then delivered by slawatch's Dispatcher (webhook batch 100, ``--concurrency``
  workers, the webhook notifier's default 4);
- ``B100``: the same alerts as rows of 100 in outbox_shapes' ``shapes.batch`` (copied
  from the alerts slawatch's own claim wrote, so the bodies are the same: checked in the
  first round), drained by ``--concurrency`` worker threads, each in a loop: one
  statement that settles the row it sent last (one UPDATE of the row, not HOT:
  ``pending`` is in the due index's predicate), leases the next due row (FOR UPDATE SKIP
  LOCKED; a HOT update: the lease columns are not indexed) and answers its alerts
  unnested, a row each, the times as text (as today's claim); the payloads made by
  slawatch's own ``alert_payload``; one POST of the 100 through slawatch's
  ``WebhookNotifier.send`` (as today: the webhook sends a batch per request); the last
  row settled by the lease that finds nothing more due;
- ``B100+probes``: the same, with today's per-alert acks and silences probes in the
  lease (a probe of ``slawatch.ack``'s primary key and of ``silence_rule_ends`` per alert,
  both tables empty as in today's drain); an alert they match is not sent;
- ``B100 arrays``: B100 answering the leased row as it is (its arrays, the times as text
  arrays), zipped into the payloads by the worker: no row per alert to decode.

After each drain, its own request bodies are POSTed straight, one after the other, one
client, no database (bench/delivery.py's ``post_straight``): the transport's ceiling,
under the same moment's load.

What the prototype skips of today's guarantees (docs/performance.md, "The lean outbox:
the delivery side measured"): held resolved notices (every alert here is a first
notification), exception rows for failed sends (the receiver accepts every request),
storms, a lease per notifier (one notifier here).

Per variant, medians of the rounds: alerts/s (workers' start to the last arrival), the
ratio to the straight POSTs after it, and CPU per 100 alerts: this Python process (the
workers, and the receiver's threads: the same in every variant) and the drain's own
server processes (from /proc: the server must run on this machine).

    SLAWATCH_BENCH_DSN=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/delivery_shapes.py [--alerts 20000] [--rounds 5]
    .venv/bin/python bench/delivery_shapes.py --quick   # 2,000 alerts, one round (~10 s)

Every database it makes is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdb import Scratch
from common import machine
from delivery import (
    DESCRIPTION,
    Receiver,
    backends_cpu,
    drain_once,
    fill_outbox,
    post_straight,
)
from outbox_shapes import SHAPES_DDL

from slawatch.config.notifiers import WebhookConfig
from slawatch.db import Database, raw_cursor
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.engine.outbox import RowDataLoader, alert_payload
from slawatch.engine.probefn import Rendered, render

# B100's rows from the alerts today's claim wrote (bench/delivery.py's fill_outbox): 100
# alerts a row in claim order, as the B100 claim writes them. The row also carries the
# rule's `after` (due_at is the deadline plus it; one interval per row), which
# outbox_shapes' table leaves out.
TO_ROWS = """
ALTER TABLE shapes.batch ADD COLUMN due_after interval NOT NULL DEFAULT '0';
INSERT INTO shapes.batch (rule, fired_at, kind, alerts, keys, episodes, ns, severities,
                          deadlines, row_data, due_after, notifiers, status, attempts,
                          pending, next_attempt_at)
SELECT rule, min(fired_at), kind, count(*), array_agg(key ORDER BY id),
       array_agg(episode ORDER BY id), array_agg(n ORDER BY id),
       array_agg(severity ORDER BY id), array_agg(deadline ORDER BY id),
       array_agg(row_data ORDER BY id), min(due_at - deadline), '{hook}', '{pending}', '{0}',
       1, min(fired_at)
  FROM (SELECT a.*, (row_number() OVER (ORDER BY id) - 1) / 100 AS part
          FROM slawatch.alert a) a
 GROUP BY part, rule, kind
 ORDER BY part
"""

_TEXT = (
    "replace(to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), '.000000', '') || 'Z'"
)

# Settle the row this worker sent last (leased to `sent_owner`), lease the next due row
# to `owner`, and answer its alerts: one statement, one asynchronous commit per row, as
# today's claim_deliveries is per batch. {probes}: the acks and silences probes.
LEASE = """
WITH sent AS (
    UPDATE shapes.batch b
       SET status = '{{sent}}', pending = 0, sent_at = ARRAY[%(now)s::timestamptz],
           lease_owner = NULL, lease_expires_at = NULL, last_error = NULL
     WHERE b.id = %(sent_id)s AND b.lease_owner = %(sent_owner)s::uuid
    RETURNING b.id
), due AS (
    SELECT b.id FROM shapes.batch b
     WHERE b.pending > 0 AND b.next_attempt_at <= %(now)s
       AND (b.lease_expires_at IS NULL OR b.lease_expires_at <= %(now)s)
       AND coalesce(b.lease_owner <> %(sent_owner)s::uuid, true)
       AND %(notifier)s = ANY(b.notifiers)
       AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
     ORDER BY b.next_attempt_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE shapes.batch b
       SET lease_owner = %(owner)s, lease_expires_at = %(now)s + %(lease)s::interval,
           attempts = ARRAY[b.attempts[1] + 1]
      FROM due
     WHERE b.id = due.id
    RETURNING b.id, b.rule, b.kind, b.fired_at, b.due_after, b.keys, b.episodes, b.ns,
              b.severities, b.deadlines, b.row_data
)
{answer}"""

# The alerts a row each, as today's claim answers.
UNNESTED = """SELECT l.id, e.i, l.rule, e.key, e.episode, e.n, l.kind, e.severity,
       {deadline} AS deadline, {due_at} AS due_at, {fired_at} AS fired_at,
       e.row_data, {muted} AS muted
  FROM leased l
 CROSS JOIN LATERAL unnest(l.keys, l.episodes, l.ns, l.severities, l.deadlines, l.row_data)
       WITH ORDINALITY AS e(key, episode, n, severity, deadline, row_data, i)
 ORDER BY e.i
"""

# The row as it is, its arrays zipped by the worker (the times as text, as above).
ARRAYS = """SELECT l.id, l.rule, l.kind, {fired_at} AS fired_at, l.keys, l.episodes, l.ns,
       l.severities, ARRAY(SELECT {deadline} FROM unnest(l.deadlines) e(deadline)) AS deadlines,
       ARRAY(SELECT {due_at} FROM unnest(l.deadlines) e(deadline)) AS due_ats, l.row_data
  FROM leased l
"""

# Today's probes (claim_deliveries' acked and muted), per alert of the row.
PROBES = """CASE
    WHEN l.kind = 'firing' AND EXISTS (
         SELECT 1 FROM slawatch.ack k
          WHERE k.rule = l.rule AND k.key = e.key AND k.episode = e.episode)
    THEN 'acknowledged'
    WHEN EXISTS (
         SELECT 1 FROM slawatch.silence s
          WHERE s.rule = l.rule AND s.ends_at > %(now)s AND s.starts_at <= %(now)s
            AND (s.key IS NULL OR s.key = e.key) AND e.row_data @> s.matchers)
    THEN 'silenced' END"""


@dataclass(frozen=True)
class Variant:
    """A way of draining B100's rows: with today's acks and silences probes; the alerts
    answered as a row's arrays (zipped in Python) instead of a row each."""

    name: str
    probes: bool = False
    arrays: bool = False


VARIANTS = (
    Variant("B100"),
    Variant("B100+probes", probes=True),
    Variant("B100 arrays", arrays=True),
)


def lease_query(v: Variant) -> Rendered:
    """The lease, rendered once with $n placeholders (as the dispatcher's claim is)."""
    answer = (ARRAYS if v.arrays else UNNESTED).format(
        deadline=_TEXT.format("e.deadline"),
        due_at=_TEXT.format("(e.deadline + l.due_after)"),
        fired_at=_TEXT.format("l.fired_at"),
        muted=PROBES if v.probes else "NULL::text",
    )
    text = LEASE.format(answer=answer)
    return render(sql.SQL(text), ("now", "owner", "lease", "notifier", "sent_id", "sent_owner"))


def worker(
    db: Database,
    hook: WebhookNotifier,
    query: Rendered,
    arrays: bool,
    failed: list[BaseException],
) -> None:
    """Lease, send and settle rows until none is due."""
    descriptions = {"backlog": DESCRIPTION}
    sent_id: int | None = None
    sent_owner: uuid.UUID | None = None
    try:
        while True:
            owner = uuid.uuid4()
            params = {
                "now": datetime.now(UTC),
                "owner": owner,
                "lease": timedelta(seconds=2 * hook.timeout + 2),
                "notifier": "hook",
                "sent_id": sent_id,
                "sent_owner": sent_owner,
            }

            def lease(conn: Any, params: dict[str, Any] = params) -> list[dict[str, Any]]:
                cur = raw_cursor(conn, dict_row)
                cur.adapters.register_loader("jsonb", RowDataLoader)
                return cur.execute(query.query, query.args(params), prepare=True).fetchall()

            rows = db.run("leasing a row", lease)  # and settling sent_id
            if not rows:
                return
            if arrays:
                (r,) = rows
                base = {"rule": r["rule"], "kind": r["kind"], "fired_at": r["fired_at"]}
                description = descriptions.get(r["rule"], "")
                send = [
                    alert_payload(
                        {**base, "key": k, "episode": e, "n": n, "severity": s, "deadline": d,
                         "due_at": u, "row_data": j},
                        description,
                    )
                    for k, e, n, s, d, u, j in zip(
                        r["keys"], r["episodes"], r["ns"], r["severities"], r["deadlines"],
                        r["due_ats"], r["row_data"], strict=True,
                    )
                ]  # fmt: skip
            else:
                send = [
                    alert_payload(r, descriptions.get(r["rule"], ""))
                    for r in rows
                    if not r["muted"]
                ]
            if send:
                hook.send(send)
            sent_id, sent_owner = rows[0]["id"], owner
    except BaseException as exc:  # reported by the drain, which would otherwise wait
        failed.append(exc)
        raise


def fill_rows(conn: psycopg.Connection[Any], alerts: int) -> None:
    """``alerts`` claimed by slawatch's claim into today's outbox, then copied into
    B100's rows (today's outbox is left as it is: nothing reads it)."""
    fill_outbox(conn, alerts)
    conn.execute(SHAPES_DDL)
    conn.execute(TO_ROWS)
    conn.execute("VACUUM ANALYZE shapes.batch")
    row = conn.execute("SELECT count(*), sum(alerts) FROM shapes.batch").fetchone()
    if not row or row[1] != alerts:
        raise SystemExit(f"fill: {row} rows and alerts in shapes.batch, {alerts} alerts expected")


def drain_rows(
    scratch: Scratch,
    template: str,
    receiver: Receiver,
    alerts: int,
    concurrency: int,
    variant: Variant,
) -> dict[str, float]:
    """B100's rows of a copy of ``template`` drained by ``concurrency`` workers: alerts/s
    and CPU seconds (``python``: this process; ``server``: the drain's own backends)."""
    name = f"run{len(scratch.names)}"
    dsn = scratch.create(name, template)
    query = lease_query(variant)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            hook = WebhookNotifier(
                WebhookConfig(name="hook", type="webhook", url=receiver.url, batch=100)
            )
            receiver.reset(alerts)
            failed: list[BaseException] = []
            with Database(dsn, size=concurrency + 3, timeout=30) as db:
                threads = [
                    threading.Thread(
                        target=worker, args=(db, hook, query, variant.arrays, failed), daemon=True
                    )
                    for _ in range(concurrency)
                ]
                python0 = time.process_time()
                start = time.perf_counter()
                for t in threads:
                    t.start()
                deadline = time.monotonic() + 300
                while not receiver.done.wait(0.1):
                    if failed or time.monotonic() > deadline:
                        raise SystemExit(f"B100 drain: not every alert arrived: {failed!r}")
                rate = alerts / (max(receiver.arrived.values()) - start)
                python = time.process_time() - python0
                server = backends_cpu(conn)
                for t in threads:
                    t.join()
                if failed:
                    raise SystemExit(f"B100 drain: a worker failed: {failed[0]!r}")
            hook.close()
            posts = len(receiver.bodies)
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pending > 0),"
                " count(*) FILTER (WHERE attempts[1] <> 1) FROM shapes.batch"
            ).fetchone()
            rows = alerts // 100 + (alerts % 100 > 0)
            if row != (0, 0) or posts != rows:
                raise SystemExit(f"B100 drain: rows pending, resent: {row}; {posts} POSTs")
            hot = hot_share(conn, 2 * rows)
    finally:
        scratch.drop(name)
    return {"rate": rate, "python": python, "server": server, "hot": hot}


def hot_share(conn: psycopg.Connection[Any], updates: int) -> float:
    """The share of the rows' updates that were HOT (a lease and a settle per row:
    ``updates``), once the closed backends' counters have arrived (or after 10 s)."""
    stats = (
        "SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0)"
        " FROM pg_stat_user_tables WHERE schemaname = 'shapes'"
    )
    deadline = time.monotonic() + 10
    while True:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        upd, hot = conn.execute(stats).fetchone() or (0, 0)
        if upd >= updates or time.monotonic() > deadline:
            return float(hot) / float(upd) if upd else float("nan")
        time.sleep(0.1)


def same_alerts(today: list[bytes], rows: list[bytes]) -> None:
    """Exit unless both drains sent the same alerts, field for field. Each drain's outbox
    was filled by claims of its own, of rows paid "3 days ago" then: their times are
    compared by form (each run of digits one 0) and by due_at - deadline."""

    def alerts(bodies: list[bytes]) -> dict[str, Any]:
        got = {}
        for a in (a for b in bodies for a in json.loads(b)["alerts"]):
            after = datetime.fromisoformat(a["due_at"]) - datetime.fromisoformat(a["deadline"])
            for k in ("deadline", "due_at", "fired_at"):
                a[k] = re.sub("[0-9]+", "0", a[k])
            a["row"]["paid_at"] = re.sub("[0-9]+", "0", a["row"]["paid_at"])
            got[a["id"]] = (a, after)
        return got

    if alerts(today) != alerts(rows):
        raise SystemExit("B100 sent other alerts than today's drain")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alerts", type=int, default=20_000)
    ap.add_argument(
        "--concurrency", type=int, default=4, help="workers (the webhook notifier's default)"
    )
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 3 for medians)")
    ap.add_argument("--quick", action="store_true", help="2,000 alerts, one round: does it run?")
    args = ap.parse_args()
    if args.quick:
        args.alerts, args.rounds = 2_000, 1
    if args.alerts < 100 or args.rounds < 1 or not 1 <= args.concurrency <= 16:
        ap.error("--alerts >= 100, --rounds >= 1, --concurrency from 1 to 16")
    names = ("today", *(v.name for v in VARIANTS))
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    straight: list[float] = []
    straight_python: list[float] = []
    loads = [os.getloadavg()[0]]
    began = time.perf_counter()
    receiver = Receiver()
    try:
        with Scratch() as scratch:
            with psycopg.connect(scratch.server, autocommit=True) as server:
                print(machine(server), flush=True)
            with psycopg.connect(scratch.create("rows"), autocommit=True) as conn:
                fill_rows(conn, args.alerts)
            sent: dict[str, list[bytes]] = {}
            for r in range(args.rounds):
                k = r % len(names)
                for n in names[k:] + names[:k]:  # the order turns each round
                    if n == "today":
                        cpu: dict[str, float] = {}
                        rate, bodies = drain_once(
                            None, receiver, args.alerts, args.concurrency, cpu
                        )
                        got = {
                            "rate": rate,
                            "python": cpu["python"],
                            "server": cpu.get("backends", float("nan")),
                        }
                    else:
                        variant = next(v for v in VARIANTS if v.name == n)
                        got = drain_rows(
                            scratch, "rows", receiver, args.alerts, args.concurrency, variant
                        )
                        bodies = list(receiver.bodies)
                    # Its own bodies POSTed straight, at once: the ratio's two rates
                    # under the same moment's load.
                    python0 = time.process_time()
                    got["straight"] = post_straight(receiver, bodies)  # 3 passes of them
                    straight_python.append((time.process_time() - python0) / 3)
                    straight.append(got["straight"])
                    runs[n].append(got)
                    if r == 0:
                        sent[n] = bodies
                for n in names[1:] if r == 0 else ():
                    same_alerts(sent["today"], sent[n])
                loads.append(os.getloadavg()[0])
                print(
                    f"round {r + 1}: "
                    + "; ".join(
                        f"{n} {runs[n][-1]['rate']:,.0f}/s"
                        f" ({runs[n][-1]['rate'] / runs[n][-1]['straight']:.2f}x)"
                        for n in names
                    ),
                    flush=True,
                )
    finally:
        receiver.server.shutdown()
    per100 = 1e5 / args.alerts
    print(
        f"\n{args.alerts:,} alerts, {args.concurrency} workers, {args.rounds} interleaved"
        f" round(s), medians; {time.perf_counter() - began:.0f} s;"
        f" load average (1 min) {min(loads):.1f}-{max(loads):.1f}"
    )
    print(
        f"{'variant':>12} {'alerts/s':>9} {'vs POSTs':>8}"
        f" {'Python ms/100':>13} {'server ms/100':>13} {'HOT':>4}"
    )
    print(
        f"{'straight':>12} {statistics.median(straight):9,.0f} {1:8.2f}"
        f" {statistics.median(straight_python) * per100:13.2f} {'':>13}"
    )
    for n in names:
        rs = runs[n]
        ratio = statistics.median(x["rate"] / x["straight"] for x in rs)
        print(
            f"{n:>12} {statistics.median(x['rate'] for x in rs):9,.0f} {ratio:8.2f}"
            f" {statistics.median(x['python'] for x in rs) * per100:13.2f}"
            f" {statistics.median(x['server'] for x in rs) * per100:13.2f}"
            + (f" {statistics.median(x['hot'] for x in rs):4.0%}" if "hot" in rs[0] else "")
        )
    print(
        "\nvs POSTs: the median of each drain's ratio to the straight POSTs of its own bodies"
        " right after it (goal: delivery >= 0.5x); straight: the median of them all."
        " Python: this process (workers and receiver); server: the drain's own backends"
        " (from /proc). HOT: the share of the B100 rows' updates (a lease and a settle each)"
        " that were HOT."
    )


if __name__ == "__main__":
    main()
