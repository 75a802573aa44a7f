"""End to end: alerts from claim to an in-process webhook receiver, batches of 100.

Realistic alerts: a rule copying four columns of an order (about 360 bytes
of JSON per alert). Three ways of feeding the delivery workers (woken by the
claim's NOTIFY), each reporting the claim-to-receipt latency (claim committed
-> request received):

- burst: DUE overdue rows claimed in claim batches as fast as possible:
  alerts/s, and latencies that include the wait behind the backlog;
- steady: RATE new alerts/s (a claim of RATE/10 rows every 100 ms) for
  SECONDS: the latency an operator sees in normal running;
- trickle: SINGLES claims of one row each, 50 ms apart: a lone alert;
- drain: DUE alerts claimed before the workers start, then delivered: the delivery
  path alone (the burst's rate is bounded by how fast the claim makes alerts).

Beside them, in the same run, the limit of the transport: the very request
bodies of the burst POSTed again straight to the same receiver, one after the
other, with no database.

    .venv/bin/python bench/delivery.py [--due 20000] [--concurrency 4] [--rounds 3]
    .venv/bin/python bench/delivery.py --drain-only --outbox alerts,rows --rounds 5
        # the drain alone, today's outbox and SLAWATCH_OUTBOX=rows (rows of up to 100
        # alerts, docs/explanation/outbox-rows.md) interleaved, each beside its own
        # bodies POSTed straight; --pooler transaction: the workers prepare nothing

Rounds alternate concurrency 1 and the given concurrency when --compare is
set, and the table shows the median of each. Uses SLAWATCH_BENCH_DSN, else
SLAWATCH_DSN, else the embedded server (.slawatch/).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import psycopg
from benchdb import Scratch, scratch_database

from slawatch.clock import Clock
from slawatch.config.notifiers import WebhookConfig
from slawatch.config.rules import Rule
from slawatch.config.settings import Outbox
from slawatch.db import Database, Pooler
from slawatch.delivery.dispatcher import Dispatcher
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.engine.claim import claim_batch, plan_claim
from slawatch.engine.migrate import migrate
from slawatch.engine.queries import queries

DESCRIPTION = "Paid orders not shipped within 48 hours"


class Receiver:
    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.bodies: list[bytes] = []
        self.done = threading.Event()
        self.expect = 0
        self.lock = threading.Lock()
        me = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                now = time.perf_counter()
                ids = [a["id"] for a in json.loads(body)["alerts"]]
                with me.lock:
                    me.bodies.append(body)
                    for i in ids:
                        me.arrived.setdefault(i, now)
                    if len(me.arrived) >= me.expect:
                        me.done.set()
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self, expect: int) -> None:
        with self.lock:
            self.arrived, self.bodies, self.expect = {}, [], expect
            self.done.clear()


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(int(len(values) * p), len(values) - 1)]


@dataclass
class Round:
    concurrency: int
    burst_rate: float
    burst_p50: float
    burst_p99: float
    steady_p50: float
    steady_p99: float
    steady_lost: int
    trickle_p50: float
    trickle_p99: float
    raw_rate: float
    alert_bytes: float
    drain_rate: float


def make_dispatcher(db: Database, hook: WebhookNotifier, concurrency: int) -> Dispatcher:
    """A Dispatcher for the hook; older code without per-notifier concurrency runs one."""
    kwargs: dict[str, Any] = {}
    if "concurrency" in inspect.signature(Dispatcher).parameters:
        kwargs["concurrency"] = {"hook": concurrency}
    elif concurrency != 1:
        raise SystemExit("this slawatch has no per-notifier concurrency: use --concurrency 1")
    descriptions = {"late": DESCRIPTION, "backlog": DESCRIPTION}
    return Dispatcher(db, {"hook": hook}, Clock(), descriptions, **kwargs)


def one_round(args: argparse.Namespace, receiver: Receiver, concurrency: int) -> Round:
    steady_total = args.rate * args.seconds
    rows = args.due + steady_total + args.singles
    with scratch_database() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        for table, count in (("orders", rows), ("backlog", args.due)):
            conn.execute(
                f"CREATE TABLE {table} (id bigint PRIMARY KEY, user_id bigint,"
                " total_cents integer, status text, paid_at timestamptz)"
            )
            conn.execute(
                f"INSERT INTO {table} SELECT g, 100000 + g %% 7919, 1000 + g %% 90000, 'paid',"
                " now() - interval '3 days' FROM generate_series(1, %s::int) g",
                (count,),
            )
        rule = Rule.model_validate(
            {
                "name": "late",
                "description": DESCRIPTION,
                "table": "orders",
                "key": "id",
                "deadline": "paid_at",
                "after": "48h",
                "open_when": "status = 'paid'",
                "columns": ["id", "user_id", "total_cents", "paid_at"],
                "batch": args.claim_batch,
                "notify": ["hook"],
            }
        )
        # The drain's alerts: the same, from a table of their own (made before the workers
        # start, they would slow the burst's claims down).
        backlog = rule.model_copy(update={"name": "backlog", "table": "backlog"})
        migrate(conn, [rule, backlog])
        conn.execute("VACUUM ANALYZE orders, backlog")
        plan = plan_claim(rule, "timestamp with time zone")
        hook = WebhookNotifier(
            WebhookConfig(name="hook", type="webhook", url=receiver.url, batch=100)
        )
        key = 0
        with Database(dsn, size=concurrency + 3, timeout=30) as db:
            dispatcher = make_dispatcher(db, hook, concurrency)
            dispatcher.start()
            time.sleep(0.5)

            # Burst.
            receiver.reset(args.due)
            committed: dict[str, float] = {}
            start = time.perf_counter()
            while key < args.due:
                got = claim_batch(conn, plan, datetime.now(UTC))
                t = time.perf_counter()
                for _ in range(got):
                    key += 1
                    committed[f"late:{key}:e1:n1"] = t
            if not receiver.done.wait(300):
                raise SystemExit("burst: not every alert arrived within 300 s")
            end = max(receiver.arrived.values())
            burst = [(receiver.arrived[i] - committed[i]) * 1000 for i in committed]
            burst_rate = args.due / (end - start)
            bodies = list(receiver.bodies)

            # Steady: RATE alerts/s as claims of RATE/10 every 100 ms.
            per_tick = max(args.rate // 10, 1)
            steady_plan = plan_claim(
                rule.model_copy(update={"batch": per_tick}), "timestamp with time zone"
            )
            receiver.reset(steady_total)
            committed = {}
            tick = time.perf_counter()
            for _ in range(args.seconds * 10):
                got = claim_batch(conn, steady_plan, datetime.now(UTC))
                t = time.perf_counter()
                for _ in range(got):
                    key += 1
                    committed[f"late:{key}:e1:n1"] = t
                tick += 0.1
                time.sleep(max(tick - time.perf_counter(), 0))
            receiver.done.wait(120)
            steady = [(receiver.arrived[i] - committed[i]) * 1000 for i in receiver.arrived]
            steady_lost = len(committed) - len(steady)

            # Trickle: one alert at a time, the receiver otherwise idle.
            receiver.reset(args.singles)
            single = plan_claim(rule.model_copy(update={"batch": 1}), "timestamp with time zone")
            committed = {}
            for _ in range(args.singles):
                claim_batch(conn, single, datetime.now(UTC))
                key += 1
                committed[f"late:{key}:e1:n1"] = time.perf_counter()
                time.sleep(0.05)
            receiver.done.wait(60)
            dispatcher.stop()
            trickle = [(receiver.arrived[i] - committed[i]) * 1000 for i in receiver.arrived]

            # Drain: a backlog of DUE alerts, made before the workers start.
            receiver.reset(args.due)
            backlog_plan = plan_claim(backlog, "timestamp with time zone")
            while claim_batch(conn, backlog_plan, datetime.now(UTC)):
                pass
            dispatcher = make_dispatcher(db, hook, concurrency)
            start = time.perf_counter()
            dispatcher.start()
            if not receiver.done.wait(300):
                raise SystemExit("drain: not every alert arrived within 300 s")
            drain_rate = args.due / (max(receiver.arrived.values()) - start)
            dispatcher.stop()
        hook.close()

    # The transport's limit: the burst's own request bodies, POSTed straight.
    receiver.reset(args.due)
    with httpx.Client() as client:
        t0 = time.perf_counter()
        for body in bodies:
            client.post(receiver.url, content=body, headers={"content-type": "application/json"})
        raw_rate = args.due / (time.perf_counter() - t0)
    alerts = sum(len(json.loads(b)["alerts"]) for b in bodies)
    return Round(
        concurrency=concurrency,
        burst_rate=burst_rate,
        burst_p50=statistics.median(burst),
        burst_p99=pct(burst, 0.99),
        steady_p50=statistics.median(steady),
        steady_p99=pct(steady, 0.99),
        steady_lost=steady_lost,
        trickle_p50=statistics.median(trickle),
        trickle_p99=pct(trickle, 0.99),
        raw_rate=raw_rate,
        alert_bytes=(sum(len(b) for b in bodies) - len(bodies) * len('{"alerts":[]}')) / alerts,
        drain_rate=drain_rate,
    )


def backlog_rule(batch: int = 1000) -> Rule:
    """The drain's rule: four columns of an overdue paid order, to the webhook."""
    return Rule.model_validate(
        {
            "name": "backlog",
            "description": DESCRIPTION,
            "table": "backlog",
            "key": "id",
            "deadline": "paid_at",
            "after": "48h",
            "open_when": "status = 'paid'",
            "columns": ["id", "user_id", "total_cents", "paid_at"],
            "batch": batch,
            "notify": ["hook"],
        }
    )


def server_cpu(conn: psycopg.Connection[Any]) -> Callable[[], float] | None:
    """A reading of the CPU seconds the server of ``conn`` has used so far: every child
    of its postmaster, and what exited ones left in the postmaster's own account
    (cutime, cstime), from /proc. None when the server is not a process of this
    machine that we may read (elsewhere, in a container)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    try:
        with open(f"/proc/{row[0] if row else 0}/stat") as f:
            postmaster = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")

    def read() -> float:
        total = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile: its time is in the postmaster's cutime
            if int(pid) == postmaster:
                total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
            elif int(fields[1]) == postmaster:
                total += int(fields[11]) + int(fields[12])
        return total / tick

    return read


def backends_cpu(conn: psycopg.Connection[Any]) -> float:
    """CPU seconds used so far by the server processes of ``conn``'s database other
    than ``conn``'s own (the drain's workers and listener, which connected for it):
    unlike :func:`server_cpu`, nothing of other work on the same server."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid()"
    ).fetchall()
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for (pid,) in rows:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


# The outbox as 0014_delivery_lease.sql left it, before 0015_rotate.sql's id ranges:
# plain tables (as tests/integration/helpers.py's UNROTATED, with 0014's fillfactor),
# the baseline of --claims-only.
PLAIN = """
DROP TABLE slawatch.alert, slawatch.delivery;
CREATE TABLE slawatch.alert (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule        text        NOT NULL,
    key         text        NOT NULL,
    episode     integer     NOT NULL,
    n           integer     NOT NULL,
    severity    text        NOT NULL,
    deadline    timestamptz,
    due_at      timestamptz,
    fired_at    timestamptz NOT NULL,
    row_data    jsonb       NOT NULL,
    kind        text        NOT NULL DEFAULT 'firing'
                            CONSTRAINT alert_kind
                            CHECK (kind IN ('firing', 'resolved', 'summary')),
    CONSTRAINT alert_once UNIQUE (rule, key, episode, n)
);
CREATE INDEX alert_rule_fired ON slawatch.alert (rule, fired_at);
CREATE TABLE slawatch.delivery (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    alert_id         bigint      NOT NULL,
    notifier         text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                                 CONSTRAINT delivery_status
                                 CHECK (status IN ('pending', 'sent', 'dead', 'silenced',
                                                   'summarized', 'acknowledged', 'orphaned')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL,
    lease_owner      uuid,
    lease_expires_at timestamptz,
    last_error       text,
    sent_at          timestamptz,
    summary_id       bigint,
    CONSTRAINT delivery_once UNIQUE (alert_id, notifier)
) WITH (fillfactor = 40);
CREATE INDEX delivery_summary ON slawatch.delivery (summary_id, alert_id)
    WHERE summary_id IS NOT NULL;
CREATE INDEX delivery_due ON slawatch.delivery (notifier, next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX delivery_dead ON slawatch.delivery (alert_id) WHERE status = 'dead';
CREATE INDEX delivery_orphaned ON slawatch.delivery (notifier, alert_id)
    WHERE status = 'orphaned';
CREATE TRIGGER action_settled
    AFTER UPDATE OF status ON slawatch.delivery
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.notifier LIKE 'action:%')
    EXECUTE FUNCTION slawatch.action_delivery_settled();
"""


def fill_outbox(
    conn: psycopg.Connection[Any], alerts: int, ranges: int = 1, outbox: Outbox = "alerts"
) -> None:
    """``alerts`` overdue orders claimed: as many pending deliveries to ``hook``, in
    ``ranges`` id ranges (``slawatch.history_rotate`` opens the next one after each
    share; 0: the outbox unpartitioned, as before 0015_rotate.sql). ``outbox``: the
    shape the claim writes (SLAWATCH_OUTBOX; "rows": rows of up to 100 alerts and a
    send each, docs/explanation/outbox-rows.md)."""
    conn.execute(
        "CREATE TABLE backlog (id bigint PRIMARY KEY, user_id bigint,"
        " total_cents integer, status text, paid_at timestamptz)"
    )
    conn.execute(
        "INSERT INTO backlog SELECT g, 100000 + g %% 7919, 1000 + g %% 90000, 'paid',"
        " now() - interval '3 days' FROM generate_series(1, %s::int) g",
        (alerts,),
    )
    rule = backlog_rule()
    migrate(conn, [rule])
    if ranges == 0:
        conn.execute(PLAIN)
    conn.execute("VACUUM ANALYZE backlog")
    plan = plan_claim(rule, "timestamp with time zone", outbox_in=outbox)
    claimed, opened = 0, 1
    while got := claim_batch(conn, plan, datetime.now(UTC)):
        claimed += got
        if opened < ranges and claimed >= alerts * opened // ranges:
            # A day later each time: the range opened last is never "opened now".
            at = datetime.now(UTC) + timedelta(days=opened)
            row = conn.execute("SELECT slawatch.history_rotate(%s, '0 seconds')", (at,)).fetchone()
            if not (row and row[0]):
                raise SystemExit("fill: slawatch.history_rotate opened no range")
            opened += 1
    conn.execute("VACUUM ANALYZE slawatch.alert, slawatch.delivery")
    if outbox == "rows":
        conn.execute("VACUUM ANALYZE slawatch.outbox_row, slawatch.outbox_send")


def backend_cpu(conn: psycopg.Connection[Any]) -> Callable[[], float]:
    """A reading of the CPU seconds the server process of ``conn`` has used so far."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    path, tick = f"/proc/{row[0] if row else 0}/stat", os.sysconf("SC_CLK_TCK")

    def read() -> float:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    return read


def old_queries(ref: str) -> dict[str, str]:
    """The named queries of slawatch/sql/queries.sql at git revision ``ref``."""
    import subprocess

    from slawatch.engine.queries import parse_queries

    text = subprocess.run(
        ["git", "show", f"{ref}:slawatch/sql/queries.sql"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(parse_queries(text))


@dataclass(frozen=True)
class Variant:
    """One way of running --claims-only: a claim statement over an outbox layout
    (``ranges`` id ranges; 0: unpartitioned)."""

    name: str
    ranges: int
    query: str
    generic: bool = False  # run as the dispatcher does now: on its generic plan


def claims_once(
    scratch: Scratch,
    template: str,
    alerts: int,
    concurrency: int,
    query: str,
    generic: bool = False,
) -> dict[str, float]:
    """The server's side of a drain alone, on a copy of ``template`` (an outbox that
    :func:`fill_outbox` filled with ``alerts``): ``concurrency`` connections (a worker
    each) take turns, each claim (``query``) settling that worker's previous batch as
    sent, as a worker whose receiver accepts at once does (so up to ``concurrency - 1``
    batches are in flight, leased, at each claim), until nothing is due. The claim
    statement as the workers run it (prepared from its 6th run; with ``generic`` on its
    generic plan, as the dispatcher runs it where it prepares). Per 100 alerts:
    ``server_cpu`` ms of the claiming backends (from /proc: the server must run on this
    machine); ``hot``: the share of the outbox's updates that were HOT; ``mb``: the
    outbox's heap after it; ``generic``: the share of the prepared claims' runs on a
    generic plan."""
    name = f"run{len(scratch.names)}"
    dsn = scratch.create(name, template)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conns = [psycopg.connect(dsn, autocommit=True) for _ in range(concurrency)]
            try:
                for c in conns if generic else ():
                    c.execute("SET plan_cache_mode = force_generic_plan")
                cpus = [backend_cpu(c) for c in conns]
                before = sum(read() for read in cpus)
                sent: list[tuple[list[int], list[int], Any]] = [([], [], None)] * concurrency
                claimed, busy = 0, True
                while busy:
                    busy = False
                    for k, c in enumerate(conns):
                        owner = uuid.uuid4()
                        params = {
                            "now": datetime.now(UTC),
                            "owner": owner,
                            "lease": timedelta(seconds=22),
                            "limit": 100,
                            "notifier": "hook",
                            "sent": sent[k][0],
                            "sent_alerts": sent[k][1],
                            "sent_owner": sent[k][2],
                        }
                        rows = c.execute(query, params).fetchall()
                        ids = [r[0] for r in rows if r[3] != "sent"]
                        claimed += len(ids)
                        busy = busy or bool(ids) or bool(sent[k][0])
                        alert_ids = [r[4] for r in rows if r[3] != "sent"]
                        sent[k] = (ids, alert_ids, owner)
                used = sum(read() for read in cpus) - before
                generic = custom = 0
                for c in conns:
                    for g, cu in c.execute(
                        "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                    ).fetchall():
                        generic, custom = generic + g, custom + cu
            finally:
                for c in conns:
                    c.close()
            if claimed != alerts:
                raise SystemExit(f"claims: {claimed} deliveries claimed, {alerts} expected")
            stats = (
                "SELECT sum(n_tup_upd), sum(n_tup_hot_upd) FROM pg_stat_user_tables"
                " WHERE schemaname = 'slawatch' AND relname ~ '^delivery(_h[0-9]+)?$'"
            )
            deadline = time.monotonic() + 10  # the closed backends' counters arrive shortly
            while True:
                upd, hot = conn.execute(stats).fetchone() or (0, 0)
                upd, hot = upd or 0, hot or 0
                if upd >= 2 * alerts or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            (size,) = conn.execute(
                "SELECT sum(pg_relation_size(c.oid)) FROM pg_class c"
                " WHERE c.relnamespace = 'slawatch'::regnamespace AND c.relkind = 'r'"
                " AND c.relname ~ '^delivery(_h[0-9]+)?$'"
            ).fetchone() or (0,)
    finally:
        scratch.drop(name)
    return {
        "server_cpu": used * 1e5 / alerts,
        "hot": hot / upd if upd else 0.0,
        "mb": float(size or 0) / 1e6,
        "generic": generic / (generic + custom) if generic + custom else 0.0,
    }


def claims_compare(
    variants: list[Variant], alerts: int, concurrency: int, rounds: int
) -> dict[str, list[dict[str, float]]]:
    """:func:`claims_once` of each variant in turn, ``rounds`` times (interleaved: a
    moment's load on the shared machine falls on every variant alike); each layout's
    outbox is filled once, copied for each run."""
    scratch = Scratch()
    runs: dict[str, list[dict[str, float]]] = {v.name: [] for v in variants}
    with scratch:
        templates: dict[int, str] = {}
        for ranges in sorted({v.ranges for v in variants}):
            name = f"filled{ranges}"
            with psycopg.connect(scratch.create(name), autocommit=True) as conn:
                fill_outbox(conn, alerts, ranges)
            templates[ranges] = name
        for _ in range(rounds):
            for v in variants:
                got = claims_once(
                    scratch, templates[v.ranges], alerts, concurrency, v.query, v.generic
                )
                runs[v.name].append(got)
                print(
                    f"  {v.name:<16} server CPU per 100 alerts {got['server_cpu']:.2f} ms,"
                    f" HOT {got['hot']:.0%}, heap {got['mb']:.1f} MB,"
                    f" generic plans {got['generic']:.0%}",
                    flush=True,
                )
    return runs


def drain_once(
    server: str | None,
    receiver: Receiver,
    alerts: int,
    concurrency: int,
    cpu: dict[str, float] | None = None,
    outbox: Outbox = "alerts",
    pooler: Pooler = "auto",
) -> tuple[float, list[bytes]]:
    """``alerts`` claimed into the outbox, then delivered by workers started after:
    alerts/s from the start of the workers to the last arrival, and the request bodies.
    ``cpu``, if given, gets the CPU seconds of the drain: ``python`` (this process, its
    receiver thread included) and ``server`` (when :func:`server_cpu` can read it).
    ``outbox``: the shape the claim fills (SLAWATCH_OUTBOX); the Dispatcher drains both.
    ``pooler``: the workers' SLAWATCH_POOLER ("transaction": nothing prepared, as behind
    a transaction pooler, with no pooler in between)."""
    scratch = Scratch()
    if server:
        scratch.server = server
    with scratch, psycopg.connect(scratch.create("db"), autocommit=True) as conn:
        dsn = scratch.dsn("db")
        fill_outbox(conn, alerts, outbox=outbox)
        hook = WebhookNotifier(
            WebhookConfig(name="hook", type="webhook", url=receiver.url, batch=100)
        )
        receiver.reset(alerts)
        server_seconds = server_cpu(conn)
        with Database(dsn, size=concurrency + 3, timeout=30, pooler=pooler) as db:
            dispatcher = make_dispatcher(db, hook, concurrency)
            python0, server0 = time.process_time(), server_seconds() if server_seconds else 0.0
            start = time.perf_counter()
            dispatcher.start()
            if not receiver.done.wait(300):
                raise SystemExit("drain: not every alert arrived within 300 s")
            rate = alerts / (max(receiver.arrived.values()) - start)
            if cpu is not None:
                cpu["python"] = time.process_time() - python0
                if server_seconds:
                    cpu["server"] = server_seconds() - server0
                    cpu["backends"] = backends_cpu(conn)
            dispatcher.stop()
        hook.close()
        return rate, list(receiver.bodies)


def post_straight(receiver: Receiver, bodies: list[bytes], passes: int = 3) -> float:
    """The same request bodies POSTed one after the other with one client, ``passes``
    times over (one pass is a fraction of a second: on a shared machine a moment's load
    would swing it): alerts/s."""
    alerts = sum(len(json.loads(b)["alerts"]) for b in bodies)
    receiver.reset(alerts * passes)
    with httpx.Client() as client:
        t0 = time.perf_counter()
        for _ in range(passes):
            for body in bodies:
                client.post(
                    receiver.url, content=body, headers={"content-type": "application/json"}
                )
        return alerts * passes / (time.perf_counter() - t0)


def measure(
    dsn: str | None = None,
    alerts: int = 20000,
    rounds: int = 3,
    concurrency: int = 4,
    outbox: Outbox = "alerts",
) -> dict[str, float]:
    """The issue's delivery row: ``rounds`` drains of ``alerts`` (webhook batch 100,
    ``concurrency`` batches in flight), each followed by the straight POSTs of its own
    bodies. ``dsn``: the server to make scratch databases on (None: SLAWATCH_BENCH_DSN,
    SLAWATCH_DSN or the embedded one). ``outbox``: the shape the claim fills
    (SLAWATCH_OUTBOX). Medians: ``slawatch`` and ``straight`` in alerts/s, ``ratio``
    (of each round's two rates); CPU ms per 100 alerts delivered, ``python_cpu`` (the
    workers and the receiver) and, where it can be read, ``server_cpu`` (every process
    of the PostgreSQL server, other work on it too) and ``backends_cpu`` (the drain's
    own server processes)."""
    return measure_shapes(dsn, alerts, rounds, concurrency, (outbox,))[outbox]


def measure_shapes(
    dsn: str | None = None,
    alerts: int = 20000,
    rounds: int = 3,
    concurrency: int = 4,
    outboxes: tuple[Outbox, ...] = ("alerts", "rows"),
    pooler: Pooler = "auto",
) -> dict[str, dict[str, float]]:
    """:func:`measure` for each shape of the outbox in ``outboxes`` (SLAWATCH_OUTBOX),
    interleaved: each round drains every shape once, the order turning by one each
    round, and each drain is followed by the straight POSTs of its own bodies. By shape,
    :func:`measure`'s medians."""
    receiver = Receiver()
    drained: dict[str, list[float]] = {o: [] for o in outboxes}
    straight: dict[str, list[float]] = {o: [] for o in outboxes}
    cpus: dict[str, list[dict[str, float]]] = {o: [] for o in outboxes}
    try:
        for r in range(rounds):
            turn = r % len(outboxes)
            for outbox in outboxes[turn:] + outboxes[:turn]:
                cpus[outbox].append({})
                rate, bodies = drain_once(
                    dsn, receiver, alerts, concurrency, cpus[outbox][-1], outbox, pooler
                )
                drained[outbox].append(rate)
                straight[outbox].append(post_straight(receiver, bodies))
    finally:
        receiver.server.shutdown()
    out: dict[str, dict[str, float]] = {}
    for outbox in outboxes:
        d, s = drained[outbox], straight[outbox]
        got = {
            "ratio": statistics.median(a / b for a, b in zip(d, s, strict=True)),
            "slawatch": statistics.median(d),
            "straight": statistics.median(s),
            "rounds": float(rounds),
        }
        for key in ("python", "server", "backends"):
            if all(key in c for c in cpus[outbox]):
                got[f"{key}_cpu"] = statistics.median(c[key] for c in cpus[outbox]) * 1e5 / alerts
        out[outbox] = got
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--due", type=int, default=20_000, help="alerts in the burst")
    parser.add_argument("--claim-batch", type=int, default=1000, help="rows per burst claim")
    parser.add_argument("--rate", type=int, default=1000, help="steady: new alerts per second")
    parser.add_argument("--seconds", type=int, default=10, help="steady: how long")
    parser.add_argument("--singles", type=int, default=100, help="trickle: lone alerts")
    parser.add_argument("--concurrency", type=int, default=4, help="batches in flight")
    parser.add_argument("--rounds", type=int, default=1, help="runs; the table shows medians")
    parser.add_argument(
        "--compare", action="store_true", help="alternate rounds at concurrency 1 and the given"
    )
    parser.add_argument("--json", action="store_true", help="also print each round as JSON")
    parser.add_argument(
        "--drain-only", action="store_true", help="only the drain against straight POSTs"
    )
    parser.add_argument(
        "--outbox",
        default="alerts",
        help="--drain-only: the outbox's shapes, comma-separated, interleaved by round"
        " (SLAWATCH_OUTBOX: alerts, rows; e.g. alerts,rows)",
    )
    parser.add_argument(
        "--pooler",
        default="auto",
        choices=("auto", "none", "session", "transaction"),
        help="--drain-only: the workers' SLAWATCH_POOLER (transaction: nothing prepared)",
    )
    parser.add_argument(
        "--claims-only",
        action="store_true",
        help="only the claim statement: the server's CPU per 100 alerts, HOT updates",
    )
    parser.add_argument(
        "--ranges",
        type=int,
        default=4,
        help="--claims-only: the partitioned outbox's id ranges (beside an unpartitioned one)",
    )
    parser.add_argument(
        "--old-ref",
        default="main",
        help="--claims-only: also the claim statement of this git revision ('' for none)",
    )
    args = parser.parse_args()
    if args.due < 100 or args.rate < 10 or args.seconds < 1 or args.singles < 1:
        parser.error("--due >= 100, --rate >= 10, --seconds >= 1, --singles >= 1")
    if not 1 <= args.concurrency <= 64 or args.rounds < 1:
        parser.error("--concurrency from 1 to 64, --rounds >= 1")
    if args.ranges < 1:
        parser.error("--ranges >= 1")

    if args.claims_only:
        new = queries()["claim_deliveries"]
        old = old_queries(args.old_ref)["claim_deliveries"] if args.old_ref else None
        variants = [Variant("unpartitioned", 0, old or new)]
        if old is not None:
            variants.append(Variant(f"ranges {args.old_ref}", args.ranges, old))
        variants.append(Variant("ranges now", args.ranges, new, generic=True))
        print(
            f"claims of {args.due:,} deliveries, 100 x {args.concurrency} workers in turn;"
            f" unpartitioned outbox and {args.ranges} id ranges;"
            f" {'statement of ' + args.old_ref + ' and ' if old else ''}this one",
            flush=True,
        )
        runs = claims_compare(variants, args.due, args.concurrency, args.rounds)
        base = runs[variants[0].name]
        print(f"{args.rounds} round(s), medians; ratio: per round to {variants[0].name}")
        for v in variants:
            per = runs[v.name]
            ratio = statistics.median(
                r["server_cpu"] / b["server_cpu"] for r, b in zip(per, base, strict=True)
            )
            print(
                f"{v.name:<16} server CPU per 100 alerts"
                f" {statistics.median(r['server_cpu'] for r in per):.2f} ms ({ratio:.2f}x),"
                f" HOT updates {statistics.median(r['hot'] for r in per):.0%},"
                f" outbox heap {statistics.median(r['mb'] for r in per):.1f} MB,"
                f" generic plans {statistics.median(r['generic'] for r in per):.0%}"
            )
        return

    if args.drain_only:
        shapes = tuple(o.strip() for o in args.outbox.split(",") if o.strip())
        if not shapes or any(o not in ("alerts", "rows") for o in shapes):
            parser.error("--outbox: alerts, rows or both, comma-separated")
        print(
            f"drain {args.due:,} alerts, webhook batch 100 x {args.concurrency},"
            f" {args.rounds} round(s), outbox {', '.join(shapes)} interleaved,"
            f" pooler {args.pooler}; medians;"
            f" load average {os.getloadavg()[0]:.1f} at the start",
            flush=True,
        )
        t0 = time.perf_counter()
        by_shape = measure_shapes(
            None,
            args.due,
            args.rounds,
            args.concurrency,
            shapes,
            args.pooler,
        )
        for shape, got in by_shape.items():
            print(
                f"outbox {shape}: slawatch {got['slawatch']:,.0f} alerts/s,"
                f" straight POSTs {got['straight']:,.0f} alerts/s, ratio {got['ratio']:.2f};"
                f" CPU per 100 alerts: Python {got['python_cpu']:.2f} ms, server "
                + (f"{got['server_cpu']:.2f} ms" if "server_cpu" in got else "not readable")
                + (
                    f" (the drain's own backends {got['backends_cpu']:.2f} ms)"
                    if "backends_cpu" in got
                    else ""
                )
            )
        print(f"{time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f} at the end")
        return

    levels = [1, args.concurrency] if args.compare else [args.concurrency]
    receiver = Receiver()
    results: list[Round] = []
    with scratch_database() as first, psycopg.connect(first) as conn:
        version = conn.execute("SHOW server_version").fetchone()
    for _ in range(args.rounds):
        for level in levels:
            r = one_round(args, receiver, level)
            results.append(r)
            if args.json:
                print(json.dumps(r.__dict__), flush=True)
    receiver.server.shutdown()

    print(
        f"\nPostgreSQL {version[0] if version else '?'}; burst {args.due:,} alerts "
        f"(claim batch {args.claim_batch:,}), steady {args.rate:,}/s for {args.seconds}s, "
        f"webhook batch 100, {args.rounds} round(s), medians\n"
    )
    head = (
        f"{'concurrency':>11} {'drain/s':>8} {'ratio':>6} {'burst/s':>8} {'raw POST/s':>10}"
        f" {'ratio':>6} {'B/alert':>7}"
        f" {'burst p50':>9} {'p99':>7} {'steady p50':>10} {'p99':>7} {'lost':>4}"
        f" {'trickle p50':>11} {'p99':>7}"
    )
    print(head)
    for level in levels:
        rs = [r for r in results if r.concurrency == level]

        def med(field: str, rs: list[Round] = rs) -> float:
            return statistics.median(getattr(r, field) for r in rs)

        ratio = statistics.median(r.burst_rate / r.raw_rate for r in rs)
        drained = statistics.median(r.drain_rate / r.raw_rate for r in rs)
        print(
            f"{level:>11} {med('drain_rate'):>8,.0f} {drained:>6.2f}"
            f" {med('burst_rate'):>8,.0f} {med('raw_rate'):>10,.0f} {ratio:>6.2f}"
            f" {med('alert_bytes'):>7.0f} {med('burst_p50'):>9.0f} {med('burst_p99'):>7.0f}"
            f" {med('steady_p50'):>10.1f} {med('steady_p99'):>7.1f}"
            f" {max(r.steady_lost for r in rs):>4}"
            f" {med('trickle_p50'):>11.1f} {med('trickle_p99'):>7.1f}"
        )
    print("\ndrain: a backlog of --due alerts delivered by workers started after it was claimed")
    print("(the delivery path alone); burst: claimed while the workers run (bounded by the")
    print("claim's own rate); ratios to the same request bodies POSTed straight, no database")
    print("latencies in ms, claim committed -> request received; 'lost': steady alerts not")
    print("received within 120 s of the last claim (should be 0)")


if __name__ == "__main__":
    main()
