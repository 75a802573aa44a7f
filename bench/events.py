"""Events (issue 15): what an event rule's ingest, firing and timers cost, beside raw SQL.

Prints, in one run, each figure of the issue's performance table with its goal:

1. `slawatch.event()`, 1,000 start events per transaction (distinct keys, with ids),
   vs 1,000 raw single-row `INSERT … ON CONFLICT` of the same events into a bare
   table of the timer table's columns (primary key only), and `slawatch.events(jsonb)`
   for the same batch beside them, and the rows event() writes (the dedupe row, the
   timer row in a copy of the timer table with its indexes) written by hand, and the
   least a function in event()'s place costs (PL/pgSQL with SECURITY DEFINER doing
   only the start's insert into another copy of the timer table); both ways
   a client sends statements: one round trip each (an application's own transaction)
   and pipelined (psycopg's executemany: the server's own cost shows). Interleaved
   rounds, medians.
2. `POST /v1/events`, batches of 1,000 from 4 client processes, to `slawatch run` in a
   subprocess, vs `slawatch.events(jsonb)` with the same batches from 4 connections.
3. Firing N due timers: the rule's claim + outbox (slawatch.engine.claim, batches of
   10,000) vs the same work in raw SQL, one statement that updates a batch of a bare
   timer table through a partial index and inserts its alert and delivery rows, vs that
   statement with the guarantees the claim gives besides (the alert at most once, the
   `_again` and `_due_at` index entries, the episode's history row; --fire-parts: less
   one each, to see what each costs), and vs that bare UPDATE alone. Each on a fresh
   copy of the same data, interleaved. The claim writes the outbox in each shape of
   --outbox (SLAWATCH_OUTBOX, docs/explanation/outbox-rows.md; by default both, the
   default shape first): the default shape's rows unlabeled, the other's a row of its
   own, and the WAL per timer of each (server-wide).
3b. The rule's "anything due?" probe at 100 k, 300 k and 1 M open timers (none due),
   prepared and past its 5 custom plans (PostgreSQL's generic plan in use), beside the
   EXISTS form it replaced: flat where that one grew with the table.
4. p99 lateness, due -> alert committed (seen through LISTEN on the claim's NOTIFY),
   with --timers open timers, 1,000 falling due per second and 1,000 new starts per
   second ingested beside them, `slawatch run` scanning the rule `every: 1s`.
5. Bytes per open timer (heap + indexes: pg_total_relation_size / rows) of that table.
6. 100 k events published to RabbitMQ, Redis Streams and NATS JetStream: each broker's
   own publish rate, beside the rate `slawatch run` stores them at (a source per broker,
   batches of 1,000; "n/a" while slawatch has no sources).

Beside each rate, the PostgreSQL backend's own CPU time per item (read from /proc when
the server runs on this machine): on a busy machine the wall-clock ratios move by
±20 % from run to run, the CPU times much less. Not a test: the figures depend on the
machine (and on what else runs on it).

    .venv/bin/python bench/events.py                      # 1 M timers: 6-10 minutes on 2 cores
    .venv/bin/python bench/events.py --timers 100000      # about 5 minutes
    .venv/bin/python bench/events.py --quick              # under a minute: does it run?
    .venv/bin/python bench/events.py --skip fire,brokers  # of: ingest,http,fire,timerprobe,
    #                                                        lateness,brokers
    .venv/bin/python bench/events.py --only ingest        # those sections alone
    .venv/bin/python bench/events.py --only fire --fire-parts  # what each guarantee costs
    .venv/bin/python bench/events.py --only fire --outbox rows  # the default shape alone

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/);
every database it makes is dropped at the end. Brokers on 127.0.0.1 (RabbitMQ
guest/guest on 5672, Redis on 6379, NATS with JetStream on 4222); one that is not
reachable is reported as such.
"""

# ruff: noqa: RUF001, RUF002, RUF003
# (the output prints × and – on purpose)

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, get_args

import httpx
import orjson
import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdb import Scratch
from common import machine, med, pct

from slawatch.config.rules import Rule
from slawatch.config.settings import DEFAULT_OUTBOX, Outbox
from slawatch.engine.claim import anything_due, batches
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare

RULE = "parcel_undelivered"
START, STOP = "parcel_shipped", "parcel_delivered"
WITHIN = timedelta(hours=72)
DATA = {"carrier": "ups", "service": "ground"}  # small data: the case
TIMERS = f'"slawatch"."{RULE}_timers"'
BATCH = 1000  # events per transaction, request or call
FIRE_BATCH = 10_000  # the rule's claim batch (the default)
CLIENTS = 4
TOKEN = "bench-token-0123456789abcdef"


def rule_dict(every: str = "30s") -> dict[str, Any]:
    """Parcels shipped and not delivered within 72 h: no re-notification, one notifier."""
    return {
        "name": RULE,
        "description": "Parcels shipped and not delivered within 72 hours",
        "events": {"start": START, "stop": [STOP], "within": "72h"},
        "every": every,
        "batch": FIRE_BATCH,
        "notify": ["ops"],
    }


def event_rule(every: str = "30s") -> Rule:
    return Rule.model_validate(rule_dict(every))


def key(i: int) -> str:
    """A tracking number: random-looking, so the primary key grows as a real one does.
    (The same as the loader's SQL: '1Z' || upper(left(md5(i::text), 16)).)"""
    return "1Z" + hashlib.md5(str(i).encode()).hexdigest()[:16].upper()


def starts(first: int, n: int, at: datetime) -> list[dict[str, Any]]:
    """``n`` start events (keys and ids ``first`` ...) in their JSON form."""
    stamp = at.isoformat()
    return [
        {"type": START, "key": key(i), "at": stamp, "id": f"evt-{i}", "data": DATA}
        for i in range(first, first + n)
    ]


def rate_text(x: float) -> str:
    return f"{x:,.0f}/s" if x == x else "-"


def backend_cpu(pid: int) -> float:
    """Seconds the server process ``pid`` has run on a CPU (NaN: not on this machine).
    Beside wall time on a busy machine: what the work cost, without the waits."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


@dataclass
class Sample:
    """One measurement: items per second, the server's CPU µs per item, and the WAL
    bytes per item (server-wide: NaN where not read)."""

    rate: float
    cpu_us: float
    wal_b: float = float("nan")


class Meter:
    """Wall time and the backend's CPU time around some work on ``conn``."""

    def __init__(self, conn: psycopg.Connection[Any], wal: bool = False) -> None:
        self.pid = conn.info.backend_pid
        # ``wal``: also the WAL written meanwhile (server-wide), read on ``conn``.
        self.conn = conn if wal else None
        self.wal = float("nan")

    def lsn(self) -> float:
        if self.conn is None:
            return float("nan")
        row = self.conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        return float(row[0]) if row else float("nan")

    def __enter__(self) -> Meter:
        self.wal = self.lsn()
        self.cpu, self.t = backend_cpu(self.pid), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.secs = time.perf_counter() - self.t
        self.cpu = backend_cpu(self.pid) - self.cpu
        self.wal = self.lsn() - self.wal

    def per(self, items: int) -> Sample:
        return Sample(items / self.secs, self.cpu / items * 1e6, self.wal / items)


def rates(samples: list[Sample]) -> list[float]:
    return [x.rate for x in samples]


def cpu_text(samples: list[Sample]) -> str:
    x = med([s.cpu_us for s in samples])
    return f"{x:,.0f} µs" if x == x else "-"


# ---------------------------------------------------------------- 1. SQL ingest

# The timer table's columns (engine/timers.py), with only the primary key.
BARE_TIMERS = """
CREATE TABLE bare_timers (
    key text PRIMARY KEY, started_at timestamptz, due_at timestamptz,
    open boolean NOT NULL DEFAULT false, stopped_at timestamptz,
    too_fast boolean NOT NULL DEFAULT false, data jsonb NOT NULL DEFAULT '{}',
    events jsonb NOT NULL DEFAULT '[]', n integer NOT NULL DEFAULT 0, next timestamptz,
    seen timestamptz, ep integer NOT NULL DEFAULT 0
)"""
# What a start does to a new key, written by hand: the first start wins.
RAW_INSERT = """
INSERT INTO bare_timers (key, started_at, due_at, open, data, events)
VALUES (%(key)s, %(at)s, %(at)s + interval '72 hours', true, %(data)s, '[]')
ON CONFLICT (key) DO NOTHING"""
EVENT = "SELECT slawatch.event(%(type)s, %(key)s, %(at)s, %(data)s, %(id)s)"
# The rows and index entries slawatch.event() writes for a start with an id, written by
# hand in one statement: the dedupe row (slawatch.event_seen) and the timer row in a
# copy of the timer table with all its indexes. What the function layer adds is the rest.
SAME_TIMERS = f"CREATE TABLE same_timers (LIKE {TIMERS} INCLUDING ALL)"
RAW_SAME = """
WITH seen AS (
    INSERT INTO slawatch.event_seen (type, id, at) VALUES (%(type)s, %(id)s, now())
    ON CONFLICT (type, id) DO NOTHING
    RETURNING 1)
INSERT INTO same_timers (key, started_at, due_at, open, data, events)
SELECT %(key)s, %(at)s, %(at)s + interval '72 hours', true, %(data)s, '[]'
 WHERE EXISTS (SELECT FROM seen)
ON CONFLICT (key) DO NOTHING"""
EVENTS = "SELECT type, outcome, events FROM slawatch.events(%s::jsonb, %s)"
# The least a function in slawatch.event()'s place can cost: PL/pgSQL with SECURITY
# DEFINER and its search_path, as slawatch.event() is, doing only the raw insert into
# another copy of the timer table with its indexes (no checks, no dedupe row). Beside
# the raw insert it is the best ratio any such function can reach on that table.
FLOOR_TIMERS = f"CREATE TABLE floor_timers (LIKE {TIMERS} INCLUDING ALL)"
FLOOR_FUNCTION = """
CREATE FUNCTION floor_event(type text, key text, at timestamptz DEFAULT NULL,
                            data jsonb DEFAULT NULL, id text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $f$
#variable_conflict use_column
BEGIN
    INSERT INTO public.floor_timers (key, started_at, due_at, open, data, events)
    VALUES ($2, $3, $3 + interval '72 hours', true, $4, '[]')
    ON CONFLICT (key) DO NOTHING;
    RETURN 'accepted';
END $f$"""
FLOOR = "SELECT floor_event(%(type)s, %(key)s, %(at)s, %(data)s, %(id)s)"


def ingest_args(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**e, "at": datetime.fromisoformat(e["at"]), "data": Jsonb(e["data"])} for e in batch]


def send(conn: psycopg.Connection[Any], statement: str, args: list[Any], pipelined: bool) -> None:
    """``statement`` once per argument set, in one transaction: pipelined, or one round
    trip each (prepared, as an application's driver would after a few calls)."""
    with conn.transaction():
        if pipelined:
            with conn.cursor() as cur:
                cur.executemany(statement, args)
        else:
            for a in args:
                conn.execute(statement, a, prepare=True)


def ingest_variants(
    conn: psycopg.Connection[Any],
) -> dict[str, Callable[[list[dict[str, Any]], datetime], None]]:
    """Each way to store one batch, by name."""

    def events_jsonb(batch: list[dict[str, Any]], now: datetime) -> None:
        with conn.transaction():
            rows = conn.execute(EVENTS, (orjson.dumps(batch).decode(), now)).fetchall()
        assert sum(r[2] for r in rows if r[1] == "accepted") == len(batch), rows

    return {
        "raw, round trips": lambda b, _: send(conn, RAW_INSERT, ingest_args(b), False),
        "event(), round trips": lambda b, _: send(conn, EVENT, ingest_args(b), False),
        "raw, pipelined": lambda b, _: send(conn, RAW_INSERT, ingest_args(b), True),
        "event(), pipelined": lambda b, _: send(conn, EVENT, ingest_args(b), True),
        "events(jsonb)": events_jsonb,
        "raw, same rows, pipelined": lambda b, _: send(conn, RAW_SAME, ingest_args(b), True),
        "function floor, pipelined": lambda b, _: send(conn, FLOOR, ingest_args(b), True),
    }


def measure_ingest(dsn: str, rounds: int) -> dict[str, list[Sample]]:
    """Each variant: interleaved rounds of one batch each (after one round to warm up),
    a checkpoint before each so each pays the same full-page images."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [event_rule()])
        conn.execute(BARE_TIMERS)
        conn.execute(SAME_TIMERS)
        conn.execute(FLOOR_TIMERS)
        conn.execute(FLOOR_FUNCTION)
    out: dict[str, list[Sample]] = {}
    with psycopg.connect(dsn) as conn:
        variants = ingest_variants(conn)
        nxt = 0
        for r in range(rounds + 1):
            for name, store in variants.items():
                now = datetime.now(UTC)
                batch = starts(nxt, BATCH, now)
                nxt += BATCH
                conn.execute("CHECKPOINT")
                conn.commit()
                with Meter(conn) as meter:
                    store(batch, now)
                if r:
                    out.setdefault(name, []).append(meter.per(BATCH))
        stored = conn.execute(f"SELECT count(*) FROM {TIMERS}").fetchone()
        assert stored and stored[0] == 3 * BATCH * (rounds + 1), stored
    return out


# ---------------------------------------------------------------- slawatch run, in a subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def slawatch_run(
    dsn: str, every: str, http: str = "", sources: dict[str, dict[str, Any]] | None = None
) -> Iterator[Path]:
    """`slawatch run` with the event rule, a console notifier and ``sources`` (name ->
    sources/<name>.yaml); yields its log file."""
    with tempfile.TemporaryDirectory() as tmp:
        rules, notifiers, folder = Path(tmp, "rules"), Path(tmp, "notifiers"), Path(tmp, "src")
        for d in (rules, notifiers, folder):
            d.mkdir()
        (rules / f"{RULE}.yaml").write_text(json.dumps(rule_dict(every)))
        (notifiers / "ops.yaml").write_text(json.dumps({"name": "ops", "type": "console"}))
        for name, source in (sources or {}).items():
            (folder / f"{name}.yaml").write_text(json.dumps({"name": name, **source}))
        env = dict(
            os.environ,
            SLAWATCH_DSN=dsn,
            SLAWATCH_LOG_LEVEL="WARNING",
            SLAWATCH_HTTP=http,
            SLAWATCH_API_TOKEN=TOKEN,
        )
        exe = Path(sys.executable).with_name("slawatch")
        cmd = [str(exe), "--rules", str(rules), "--notifiers", str(notifiers)]
        cmd += ["--sources", str(folder)] if sources else []
        log = Path(tmp, "run.log")
        with log.open("w") as out:
            proc = subprocess.Popen([*cmd, "run"], env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                yield log
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def wait_for(what: str, check: Callable[[], bool], timeout: float, log: Path | None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.1)
    tail = log.read_text()[-2000:] if log is not None and log.exists() else ""
    raise RuntimeError(f"{what}: not within {timeout:.0f} s\n{tail}")


# ---------------------------------------------------------------- 2. HTTP ingest


def route_missing(url: str) -> str | None:
    """None when `POST /v1/events` takes a batch; else why the row is not measured."""
    body = {"events": starts(10**9, 1, datetime.now(UTC))}
    r = httpx.post(f"{url}/v1/events", json=body, headers=auth(), timeout=30)
    if r.status_code in (404, 405):
        return "n/a (route not built)"
    if r.status_code != 202 or r.json().get("accepted") != 1:
        return f"n/a (answered {r.status_code}: {r.text[:200]})"
    return None


def auth() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


def _http_client(url: str, bodies: list[bytes], go: Any, out: Any) -> None:
    with httpx.Client(base_url=url, headers=auth(), timeout=120) as client:
        out.put(("ready", 0.0))
        go.wait()
        for body in bodies:
            r = client.post("/v1/events", content=body)
            if r.status_code != 202:
                out.put(("error", f"{r.status_code}: {r.text[:300]}"))
                return
        out.put(("done", time.perf_counter()))


def _sql_client(dsn: str, bodies: list[bytes], go: Any, out: Any) -> None:
    with psycopg.connect(dsn) as conn:
        out.put(("ready", 0.0))
        go.wait()
        for body in bodies:
            with conn.transaction():
                conn.execute(EVENTS, (body.decode(), datetime.now(UTC))).fetchall()
        out.put(("done", time.perf_counter()))


def in_parallel(target: Callable[..., None], where: str, work: list[list[bytes]]) -> float:
    """Events/s of one process per list of bodies, started together (each body a batch)."""
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(where, bodies, go, out)) for bodies in work]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            out.get(timeout=60)
        t0 = time.perf_counter()
        go.set()
        ends = []
        for _ in procs:
            kind, value = out.get(timeout=600)
            if kind == "error":
                raise RuntimeError(f"POST /v1/events: {value}")
            ends.append(value)
    finally:
        for p in procs:
            p.join(30)
    return sum(len(b) for b in work) * BATCH / (max(ends) - t0)


def measure_http(
    dsn: str, rounds: int, per_client: int
) -> tuple[dict[str, list[float]], str | None]:
    """HTTP vs SQL ingest, interleaved; the reason when the route is not there."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [event_rule()])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    got: dict[str, list[float]] = {"http": [], "sql": []}
    with slawatch_run(dsn, "30s", f"127.0.0.1:{port}") as log:
        wait_for("slawatch run's admin API", lambda: healthy(url), 60, log)
        missing = route_missing(url)
        nxt = 0

        def work(wrap: bool) -> list[list[bytes]]:
            """Each client's batches: JSON arrays, or ``{"events": [...]}`` to POST."""
            nonlocal nxt
            out = []
            for _ in range(CLIENTS):
                bodies = []
                for _ in range(per_client):
                    batch = orjson.dumps(starts(nxt, BATCH, datetime.now(UTC)))
                    nxt += BATCH
                    bodies.append(b'{"events":' + batch + b"}" if wrap else batch)
                out.append(bodies)
            return out

        for r in range(rounds + 1):
            for name in ("http", "sql"):
                if name == "http" and missing:
                    continue
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("CHECKPOINT")
                if name == "http":
                    rate = in_parallel(_http_client, url, work(True))
                else:
                    rate = in_parallel(_sql_client, dsn, work(False))
                if r:
                    got[name].append(rate)
    return got, missing


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# ---------------------------------------------------------------- 3. firing due timers

# Open timers as slawatch.event() leaves them after a start (checked by check_loader):
# `due` of them due (from 73 h ago on, 1 ms apart), the rest due in `later_from`.
LOAD_TIMERS = f"""
INSERT INTO {TIMERS} (key, started_at, due_at, open, data, events)
SELECT k, at, at + interval '72 hours', true, %(data)s::jsonb, '[]'::jsonb
  FROM (SELECT '1Z' || upper(left(md5(g::text), 16)) AS k,
               CASE WHEN g < %(first)s::bigint + %(due)s::bigint
                    THEN %(due_from)s::timestamptz - interval '72 hours'
                         + (g - %(first)s::bigint) * %(gap)s::interval
                    ELSE %(later_from)s::timestamptz - interval '72 hours'
                         + (g - %(first)s::bigint) * interval '1 second' END AS at
          FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(n)s::bigint - 1) g) x
 ORDER BY at"""


def load_timers(
    conn: psycopg.Connection[Any],
    first: int,
    n: int,
    due: int,
    due_from: datetime,
    gap: timedelta,
    later_from: datetime,
) -> None:
    """``n`` open timers (keys ``first`` ...): ``due`` of them due from ``due_from``,
    ``gap`` apart; the others due from ``later_from`` on, a second apart."""
    chunk = 250_000
    for start in range(first, first + n, chunk):
        size = min(chunk, first + n - start)
        conn.execute(
            LOAD_TIMERS,
            {
                "data": Jsonb(DATA),
                "type": START,
                "first": start,
                "n": size,
                "due": max(0, min(size, first + due - start)),
                "due_from": due_from + (start - first) * gap,
                "gap": gap,
                "later_from": later_from + timedelta(seconds=start - first),
            },
        )


def check_loader(conn: psycopg.Connection[Any]) -> None:
    """The loader writes what slawatch.event() writes for a start (but the key)."""
    at = datetime.now(UTC).replace(microsecond=0)
    with conn.transaction():
        conn.execute(
            EVENT, {"type": START, "key": "shape", "at": at, "data": Jsonb(DATA), "id": None}
        )
        load_timers(conn, 10**12, 1, 0, at, timedelta(0), at + WITHIN)
        rows = conn.execute(
            f"SELECT to_jsonb(t) - 'key' FROM {TIMERS} t WHERE key IN ('shape', %s)",
            (key(10**12),),
        ).fetchall()
        conn.execute(f"DELETE FROM {TIMERS} WHERE key IN ('shape', %s)", (key(10**12),))
    if len(rows) != 2 or rows[0][0] != rows[1][0]:
        raise RuntimeError(f"the loader's timer differs from slawatch.event()'s: {rows}")


# The same work in raw SQL: a bare timer table, one partial index on the deadline of the
# timers not yet fired, one statement per batch.
BARE_FIRE_SETUP = f"""
CREATE TABLE bare_timers AS SELECT key, started_at, due_at, open, data, events,
       0 AS n FROM {TIMERS};
ALTER TABLE bare_timers ADD PRIMARY KEY (key);
CREATE INDEX bare_timers_due ON bare_timers (due_at) WHERE n = 0 AND open;
"""
BARE_PICK = """
    UPDATE bare_timers SET n = n + 1
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM bare_timers
                              WHERE due_at < %(now)s::timestamptz AND n = 0 AND open
                              ORDER BY due_at LIMIT %(batch)s::integer
                                FOR UPDATE SKIP LOCKED))
       AND due_at < %(now)s::timestamptz AND n = 0 AND open"""
BARE_FIRE = f"""
WITH fired AS ({BARE_PICK}
    RETURNING key, due_at,
              jsonb_build_object('data', data, 'started_at', started_at, 'events', events)
              AS row_data
), alerts AS (
    INSERT INTO slawatch.alert (rule, key, episode, n, severity, deadline, due_at,
                                fired_at, row_data)
    SELECT 'bare', key, 1, 1, 'warning', due_at, due_at, %(now)s::timestamptz, row_data
      FROM fired
    RETURNING id
), deliveries AS (
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT id, 'ops', %(now)s::timestamptz FROM alerts
    RETURNING 1
)
SELECT count(*) FROM alerts"""
BARE_UPDATE = f"WITH fired AS ({BARE_PICK}\n    RETURNING 1)\nSELECT count(*) FROM fired"

# The raw statement with what slawatch's claim guarantees besides (docs/performance.md):
# the alert at most once (ON CONFLICT on alert_once), a notified timer kept in an index
# (the rule's `_again`), every deadline indexed (the timer table's `_due_at`, the SLA
# report's), and the episode's row in the history (slawatch.episode).
BARE_GUARDED_SETUP = f"""
CREATE TABLE bare_guarded AS SELECT key, started_at, due_at, open, data, events,
       0 AS n, NULL::timestamptz AS seen, NULL::timestamptz AS next, 0 AS ep FROM {TIMERS};
ALTER TABLE bare_guarded ADD PRIMARY KEY (key);
CREATE INDEX bare_guarded_due ON bare_guarded (due_at) WHERE n = 0 AND open;
CREATE INDEX bare_guarded_again ON bare_guarded (next) WHERE n > 0 AND open;
CREATE INDEX bare_guarded_every ON bare_guarded (due_at);
"""
BARE_GUARDED = """
WITH fired AS (
    UPDATE bare_guarded SET n = n + 1, ep = ep + 1, seen = due_at
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM bare_guarded
                              WHERE due_at < %(now)s::timestamptz AND n = 0 AND open
                              ORDER BY due_at LIMIT %(batch)s::integer
                                FOR UPDATE SKIP LOCKED))
       AND due_at < %(now)s::timestamptz AND n = 0 AND open
    RETURNING key, ep, due_at,
              jsonb_build_object('data', data, 'started_at', started_at, 'events', events)
              AS row_data
), alerts AS (
    INSERT INTO slawatch.alert (rule, key, episode, n, severity, deadline, due_at,
                                fired_at, row_data)
    SELECT 'bare', key, ep, 1, 'warning', due_at, due_at, %(now)s::timestamptz, row_data
      FROM fired
    ON CONFLICT DO NOTHING
    RETURNING id
), deliveries AS (
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT id, 'ops', %(now)s::timestamptz FROM alerts
    RETURNING 1
), history AS (
    INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at)
    SELECT 'bare', key, ep, due_at, due_at, %(now)s::timestamptz FROM fired
    ON CONFLICT (rule, key, episode) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM alerts"""
# --fire-parts: the guarded statement without one guarantee each, to see what each costs.
GUARDED_HISTORY = """, history AS (
    INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at)
    SELECT 'bare', key, ep, due_at, due_at, %(now)s::timestamptz FROM fired
    ON CONFLICT (rule, key, episode) DO NOTHING
    RETURNING 1
)"""
GUARDED_ONCE = "\n    ON CONFLICT DO NOTHING\n    RETURNING id"
# Each part's statement, and what runs before it on the fresh copy.
GUARDED_PARTS = {
    "no history": (BARE_GUARDED.replace(GUARDED_HISTORY, ""), ""),
    "no alert once": (BARE_GUARDED.replace(GUARDED_ONCE, "\n    RETURNING id"), ""),
    "no index entries": (BARE_GUARDED, "DROP INDEX bare_guarded_again, bare_guarded_every"),
}
assert all(s != BARE_GUARDED for s, before in GUARDED_PARTS.values() if not before)


def fire_base(scratch: Scratch, due: int) -> None:
    """The template: the rule migrated, ``due`` due timers and as many not yet due,
    and the bare table with the same rows."""
    dsn = scratch.create("fire")
    now = datetime.now(UTC)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [event_rule()])
        load_timers(
            conn,
            0,
            2 * due,
            due,
            now - timedelta(hours=2),
            timedelta(milliseconds=1),
            now + timedelta(days=1),
        )
        conn.execute(BARE_FIRE_SETUP)
        conn.execute(BARE_GUARDED_SETUP)
        conn.execute(f"VACUUM ANALYZE {TIMERS}")
        conn.execute("VACUUM ANALYZE bare_timers")
        conn.execute("VACUUM ANALYZE bare_guarded")


def fire_step(conn: psycopg.Connection[Any], variant: str, now: datetime) -> Callable[[], int]:
    """One batch per call, the timers it fired."""
    if variant in FIRE_SHAPES:
        return batches(conn, prepare(conn, event_rule(), outbox=FIRE_SHAPES[variant]), now)
    statement = {"raw": BARE_FIRE, "guarded": BARE_GUARDED, "update": BARE_UPDATE}.get(variant)
    if statement is None:
        statement, before = GUARDED_PARTS[variant]
        if before:
            conn.execute(before)
    params = {"now": now, "batch": FIRE_BATCH}

    def step() -> int:
        row = conn.execute(statement, params, prepare=True).fetchone()
        return int(row[0]) if row else 0

    return step


def prewarm(conn: psycopg.Connection[Any]) -> None:
    """The same cache state for every variant: both tables and their indexes read once,
    then a checkpoint (each variant pays the same full-page images after it)."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
    tables = "%s::regclass, 'bare_timers'::regclass, 'bare_guarded'::regclass"
    conn.execute(
        "SELECT pg_prewarm(c.oid) FROM pg_class c"
        f" WHERE c.relkind IN ('r', 'i') AND (c.oid IN ({tables})"
        " OR c.oid IN (SELECT indexrelid FROM pg_index"
        f"   WHERE indrelid IN ({tables})))",
        (TIMERS, TIMERS),
    )
    conn.execute("CHECKPOINT")


FIRE_VARIANTS = ("slawatch", "raw", "guarded", "update")
# --outbox: slawatch's claim writing the outbox in each shape (SLAWATCH_OUTBOX,
# docs/explanation/outbox-rows.md), the default shape (DEFAULT_OUTBOX) first; the
# default's is the variant "slawatch" itself, the other's "slawatch <shape>".
OUTBOXES: tuple[Outbox, ...] = tuple(sorted(get_args(Outbox), key=lambda o: o != DEFAULT_OUTBOX))


def fire_variant(outbox: Outbox) -> str:
    return "slawatch" if outbox == DEFAULT_OUTBOX else f"slawatch {outbox}"


FIRE_SHAPES: dict[str, Outbox] = {fire_variant(o): o for o in OUTBOXES}


def measure_fire(
    scratch: Scratch,
    due: int,
    rounds: int,
    parts: bool = False,
    outboxes: tuple[Outbox, ...] = OUTBOXES,
) -> dict[str, list[Sample]]:
    """Timers fired per second by each variant (``parts``: and the guarded statement
    without each of its guarantees), each drain on a fresh copy. ``outboxes``: the
    shapes slawatch's claim writes, each a variant, their order turned each round
    (beside more than the default shape, the WAL each drain wrote too, server-wide)."""
    fire_base(scratch, due)
    out: dict[str, list[Sample]] = {}
    now = datetime.now(UTC)
    wal = outboxes != (DEFAULT_OUTBOX,)
    for r in range(rounds):
        turn = r % len(outboxes)
        ours = [fire_variant(o) for o in outboxes[turn:] + outboxes[:turn]]
        for variant in [*ours, *FIRE_VARIANTS[1:], *(GUARDED_PARTS if parts else ())]:
            dsn = scratch.create("run", template="fire")
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    step = fire_step(conn, variant, now)
                    prewarm(conn)
                    fired = 0
                    with Meter(conn, wal) as meter:
                        while True:
                            got = step()
                            fired += got
                            if got < FIRE_BATCH:
                                break
                assert fired == due, (variant, fired, due)
                out.setdefault(variant, []).append(meter.per(fired))
            finally:
                scratch.drop("run")
    return out


# ---------------------------------------------------------------- 3b. the probe's curve


# The rule's "anything due?" probe as it was before it read the earliest deadline from
# its index (slawatch.engine.claim._PROBE; old_probe): EXISTS (... WHERE due_at < $1 ...). Its
# generic plan, kept after 5 runs, is a scan of the whole table.
def old_probe(rule: Rule) -> str:
    seen, nxt = f'"{rule.seen_column}"', f'"{rule.next_column}"'
    return f"""
SELECT EXISTS (SELECT 1 FROM {TIMERS} WHERE due_at < %(cutoff)s
                  AND {seen} IS DISTINCT FROM due_at AND (open))
    OR EXISTS (SELECT 1 FROM {TIMERS} WHERE {nxt} < %(renotify_by)s::timestamptz
                  AND {seen} = due_at AND (open))
    OR EXISTS (SELECT 1 FROM {TIMERS} WHERE {seen} IS NOT NULL
                  AND ({seen} IS DISTINCT FROM due_at OR (open) IS NOT TRUE))"""


PROBE_SIZES = (100_000, 300_000, 1_000_000)
PROBE_RUNS = 30  # timed runs per size, after 10 that let PostgreSQL keep a generic plan


def probe_ms(pid: int, run: Callable[[], object]) -> tuple[float, float]:
    """The median wall time of PROBE_RUNS runs (ms, with the round trip), after 10
    untimed ones, and the server process's CPU time per run (ms)."""
    for _ in range(10):
        run()
    times = []
    cpu = backend_cpu(pid)
    for _ in range(PROBE_RUNS):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1000)
    return med(times), (backend_cpu(pid) - cpu) / PROBE_RUNS * 1000


def measure_probe(
    scratch: Scratch, sizes: tuple[int, ...]
) -> tuple[list[tuple[int, dict[str, float]]], dict[str, float]]:
    """The probe's time (ms, prepared, past its 5 custom plans) at each number of open
    timers, none due: slawatch's probe (claim.anything_due) and :func:`old_probe`; and
    the bytes per open timer at the last size (:func:`timer_bytes`)."""
    dsn = scratch.create("probe")
    now = datetime.now(UTC)
    out = []
    rule = event_rule()
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [rule])
        loaded = 0
        for size in sizes:
            load_timers(conn, loaded, size - loaded, 0, now, timedelta(0), now + timedelta(days=1))
            loaded = size
            conn.execute(f"VACUUM ANALYZE {TIMERS}")
            # A connection per size: a fresh plan cache, as a new scanner's.
            with psycopg.connect(dsn, autocommit=True) as probe:
                pid = probe.info.backend_pid
                ours, ours_cpu = probe_ms(
                    pid, partial(anything_due, probe, prepare(probe, rule), now)
                )
                old, old_cpu = probe_ms(
                    pid,
                    partial(
                        probe.execute,
                        old_probe(rule),
                        {"cutoff": now, "renotify_by": now},
                        prepare=True,
                    ),
                )
                generic = probe.execute(
                    "SELECT count(*) FILTER (WHERE generic_plans > 0), count(*)"
                    " FROM pg_prepared_statements"
                ).fetchone()
            assert generic
            out.append(
                (
                    size,
                    {
                        "ours": ours,
                        "ours cpu": ours_cpu,
                        "old": old,
                        "old cpu": old_cpu,
                        "generic": float(generic[0]),
                        "prepared": float(generic[1]),
                    },
                )
            )
        sizes_of = timer_bytes(conn)
    scratch.drop("probe")
    return out, sizes_of


# ---------------------------------------------------------------- 4. lateness, 5. bytes


def timer_bytes(conn: psycopg.Connection[Any]) -> dict[str, float]:
    """Bytes per open timer: the whole table (heap, indexes, TOAST, maps), its parts, and
    the mean stored size of its two jsonb columns."""
    conn.execute(f"VACUUM ANALYZE {TIMERS}")
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE open), pg_total_relation_size(%s::regclass),"
        " pg_relation_size(%s::regclass), pg_indexes_size(%s::regclass),"
        f" avg(pg_column_size(data)), avg(pg_column_size(events)) FROM {TIMERS}",
        (TIMERS, TIMERS, TIMERS),
    ).fetchone()
    assert row
    n, total, heap, idx, data, events = (float(x) for x in row)
    parts = conn.execute(
        "SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass"
        " ORDER BY 2 DESC",
        (TIMERS,),
    ).fetchall()
    return {
        "open": n,
        "total": total / n,
        "heap": heap / n,
        "indexes": idx / n,
        # Each non-empty index (an empty one is a few pages whatever the rows).
        **{f"index {k}": v / n for k, v in parts if v > 8192 * 4},
        "column data": data,
        "column events": events,
    }


class Committed:
    """Each alert's lateness (seen - due_at, seconds), seen when its claim commits: the
    claim's NOTIFY wakes this listener, which reads the alerts written since."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.late: list[tuple[datetime, float]] = []  # (due_at, lateness)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.error: BaseException | None = None
        self.thread.start()

    def _listen(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute("LISTEN slawatch_delivery")
                last = 0
                while not self.stop.is_set():
                    for _ in conn.notifies(timeout=0.2, stop_after=1):
                        pass
                    rows = conn.execute(
                        "SELECT id, due_at FROM slawatch.alert WHERE id > %s ORDER BY id", (last,)
                    ).fetchall()
                    seen = datetime.now(UTC)
                    for ident, due in rows:
                        self.late.append((due, (seen - due).total_seconds()))
                        last = ident
        except BaseException as exc:  # reported by the caller
            self.error = exc

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


class Feeder:
    """New starts at ``rate``/s through slawatch.events (one batch a second), due after
    the run: the ingest a live system has beside its firing timers."""

    def __init__(self, dsn: str, first: int, rate: int) -> None:
        self.dsn, self.next, self.rate = dsn, first, rate
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._feed, daemon=True)
        self.thread.start()

    def _feed(self) -> None:
        with psycopg.connect(self.dsn) as conn:
            tick = time.monotonic()
            while not self.stop.is_set():
                now = datetime.now(UTC)
                batch = starts(self.next, self.rate, now)
                self.next += self.rate
                with conn.transaction():
                    conn.execute(EVENTS, (orjson.dumps(batch).decode(), now)).fetchall()
                self.sent += self.rate
                tick += 1.0
                self.stop.wait(max(0.0, tick - time.monotonic()))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


@dataclass
class Lateness:
    timers: int
    due: int
    fired: int
    p50: float
    p99: float
    worst: float
    fed: int
    bytes: dict[str, float]
    load_secs: float


def measure_lateness(scratch: Scratch, timers: int, rate: int, secs: int) -> Lateness:
    """`slawatch run` (every: 1s) on ``timers`` open timers, ``rate`` of them falling due
    each second for ``secs`` seconds; the bytes per open timer before the run."""
    dsn = scratch.create("late")
    window = rate * secs
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [event_rule("1s")])
        check_loader(conn)
        t = time.perf_counter()
        # Due from tomorrow on, not during the run.
        far = datetime.now(UTC) + timedelta(days=1)
        load_timers(conn, 0, timers, 0, far, timedelta(0), far)
        load_secs = time.perf_counter() - t
        size = timer_bytes(conn)
        conn.execute("CHECKPOINT")
    with slawatch_run(dsn, "1s") as log, psycopg.connect(dsn, autocommit=True) as conn:

        def scanned() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM slawatch.scan WHERE rule = %s", (RULE,)
            ).fetchone()
            return bool(row and row[0])

        wait_for("the first scan of slawatch run", scanned, 60, log)
        committed = Committed(dsn)
        # The window: `rate` timers a second falling due from 3 s from now on (written
        # now, as a live system's would have been, 72 h ago).
        start = datetime.now(UTC) + timedelta(seconds=3)
        load_timers(conn, timers, window, window, start, timedelta(seconds=1 / rate), far)
        feeder = Feeder(dsn, 10**9, rate)
        end = start + timedelta(seconds=secs)
        try:
            wait_for(
                "the window's alerts",
                lambda: len(committed.late) >= window or committed.error is not None,
                secs + 60,
                log,
            )
        finally:
            feeder.close()
            committed.close()
        if committed.error is not None:
            raise committed.error
    late = [x for due, x in committed.late if start <= due <= end]
    return Lateness(
        timers=timers,
        due=window,
        fired=len(late),
        p50=med(late),
        p99=pct(late, 0.99),
        worst=max(late, default=float("nan")),
        fed=feeder.sent,
        bytes=size,
        load_secs=load_secs,
    )


# ---------------------------------------------------------------- 6. brokers


def broker_bodies(first: int, n: int) -> list[bytes]:
    """``n`` start events (keys ``first`` ...), one message each, as producers send them."""
    return [orjson.dumps(e) for e in starts(first, n, datetime.now(UTC))]


class Broker:
    """One broker's queue or stream for one round: filled by :meth:`publish` (the
    broker's own publish rate), read by slawatch through :meth:`source`, then dropped."""

    label = ""

    def __init__(self) -> None:
        self.name = f"slawatch_bench_{uuid.uuid4().hex[:8]}"

    def publish(self, bodies: list[bytes]) -> float:
        """Messages per second, from the first sent until the broker holds them all."""
        raise NotImplementedError

    def source(self) -> dict[str, Any]:
        """The sources/<name>.yaml that reads them, a batch of 1,000 per transaction."""
        raise NotImplementedError

    def drop(self) -> None:
        raise NotImplementedError


class Rabbit(Broker):
    label = "RabbitMQ (durable queue, persistent)"

    def publish(self, bodies: list[bytes]) -> float:
        import pika

        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
        try:
            ch = conn.channel()
            ch.queue_declare(self.name, durable=True)
            props = pika.BasicProperties(delivery_mode=2, content_type="application/json")
            t = time.perf_counter()
            for body in bodies:
                ch.basic_publish("", self.name, body, props)
            while ch.queue_declare(self.name, passive=True).method.message_count < len(bodies):
                conn.sleep(0.01)
            return len(bodies) / (time.perf_counter() - t)
        finally:
            conn.close()

    def source(self) -> dict[str, Any]:
        return {"type": "amqp", "queue": self.name, "batch": BATCH}

    def drop(self) -> None:
        import pika

        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
        try:
            ch = conn.channel()
            for queue in (self.name, f"{self.name}.dead"):
                ch.queue_delete(queue)
        finally:
            conn.close()


class Redis(Broker):
    label = "Redis (stream, XADD pipelined)"

    def publish(self, bodies: list[bytes]) -> float:
        import redis

        with redis.Redis("127.0.0.1", 6379) as client:
            t = time.perf_counter()
            for i in range(0, len(bodies), BATCH):
                pipe = client.pipeline(transaction=False)
                for body in bodies[i : i + BATCH]:
                    pipe.xadd(self.name, {"event": body})
                pipe.execute()
            secs = time.perf_counter() - t
            assert client.xlen(self.name) == len(bodies)
        return len(bodies) / secs

    def source(self) -> dict[str, Any]:
        return {
            "type": "redis",
            "stream": self.name,
            "group": "slawatch",
            "field": "event",
            "batch": BATCH,
        }

    def drop(self) -> None:
        import redis

        with redis.Redis("127.0.0.1", 6379) as client:
            client.delete(self.name, f"{self.name}.dead")


class Nats(Broker):
    label = "NATS (JetStream stream)"

    def publish(self, bodies: list[bytes]) -> float:
        async def run() -> float:
            import nats

            nc = await nats.connect("nats://127.0.0.1:4222")
            js = nc.jetstream()
            try:
                await js.add_stream(name=self.name, subjects=[f"{self.name}.events"])
                t = time.perf_counter()
                for body in bodies:
                    await nc.publish(f"{self.name}.events", body)
                await nc.flush()
                while (await js.stream_info(self.name)).state.messages < len(bodies):
                    await asyncio.sleep(0.01)
                return len(bodies) / (time.perf_counter() - t)
            finally:
                await nc.close()

        return asyncio.run(run())

    def source(self) -> dict[str, Any]:
        return {
            "type": "nats",
            "stream": self.name,
            "subject": f"{self.name}.events",
            "durable": "slawatch",
            "batch": BATCH,
        }

    def drop(self) -> None:
        async def run() -> None:
            import nats
            from nats.js.errors import NotFoundError

            nc = await nats.connect("nats://127.0.0.1:4222")
            try:
                for stream in (self.name, f"{self.name}_dead"):
                    with contextlib.suppress(NotFoundError):
                        await nc.jetstream().delete_stream(stream)
            finally:
                await nc.close()

        asyncio.run(run())


BROKERS: list[type[Broker]] = [Rabbit, Redis, Nats]


def sources_missing() -> str | None:
    """None when `slawatch run` consumes sources/*.yaml; else what the column says."""
    try:
        __import__("slawatch.events.sources")
    except ImportError:
        return "n/a (sources not merged)"
    return None


def consume(dsn: str, broker: Broker, n: int) -> float:
    """Events/s `slawatch run` stored from ``broker``'s ``n`` waiting messages: from the
    first timer it wrote to the last (its start left out)."""
    with psycopg.connect(dsn, autocommit=True) as conn:

        def stored() -> int:
            row = conn.execute(f"SELECT count(*) FROM {TIMERS}").fetchone()
            return int(row[0]) if row else 0

        before = stored()
        with slawatch_run(dsn, "30s", sources={"bench": broker.source()}) as log:
            wait_for("the first event stored", lambda: stored() > before, 120, log)
            first = time.perf_counter()
            wait_for(f"{n:,} events stored", lambda: stored() >= before + n, 600, log)
            return (stored() - before) / (time.perf_counter() - first)


@dataclass
class BrokerRates:
    publish: list[float] = field(default_factory=list)
    consume: list[float] = field(default_factory=list)
    failed: str | None = None  # the broker was not reachable


def measure_brokers(dsn: str, n: int, rounds: int) -> dict[str, BrokerRates]:
    """Per broker, interleaved rounds: its publish rate for ``n`` messages, and (when
    slawatch has sources) slawatch's rate of storing them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [event_rule()])
    out = {kind.label: BrokerRates() for kind in BROKERS}
    nxt = 0
    for _ in range(rounds):
        for kind in BROKERS:
            got = out[kind.label]
            if got.failed:
                continue
            broker = kind()
            try:
                try:
                    got.publish.append(broker.publish(broker_bodies(nxt, n)))
                except Exception as exc:  # not reachable: said in the table, not a crash
                    got.failed = f"unavailable ({type(exc).__name__}: {str(exc)[:80]})"
                    continue
                if sources_missing() is None:
                    got.consume.append(consume(dsn, broker, n))
            finally:
                nxt += n
                with contextlib.suppress(Exception):
                    broker.drop()
    return out


# ---------------------------------------------------------------- the table


@dataclass
class Row:
    figure: str
    measured: str
    goal: str
    met: bool | None  # None: not measured

    @property
    def mark(self) -> str:
        return {True: "met", False: "NOT met", None: "-"}[self.met]


def ratio_row(
    figure: str, ours: list[float], base: list[float], goal: float, base_name: str
) -> Row:
    x = med(ours) / med(base)
    return Row(
        figure,
        f"{x:.2f}× ({rate_text(med(ours))} vs {base_name} {rate_text(med(base))})",
        f"≥ {goal}×",
        x >= goal,
    )


def print_samples(labels: dict[str, str], got: dict[str, list[Sample]], unit: str) -> None:
    """One line per variant: the median rate (min–max), the server's CPU per item."""
    for name, label in labels.items():
        xs = rates(got[name])
        print(
            f"  {label:<38} {med(xs):>8,.0f} {unit}/s ({min(xs):,.0f}–{max(xs):,.0f});"
            f" server CPU {cpu_text(got[name])}/{unit}"
        )
    print()


def print_table(rows: list[Row]) -> None:
    print("| figure | measured | goal | |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r.figure} | {r.measured} | {r.goal} | {r.mark} |")


# ---------------------------------------------------------------- each section's report


def report_ingest(scratch: Scratch, reps: int) -> list[Row]:
    got = measure_ingest(scratch.create("ingest"), reps)
    scratch.drop("ingest")
    print(f"SQL INGEST: {BATCH:,} start events per transaction (distinct keys, with ids)")
    print_samples({k: k for k in got}, got, "event")
    raw = "raw INSERT … ON CONFLICT"
    jsonb = med(rates(got["events(jsonb)"]))
    same = got["raw, same rows, pipelined"]
    floor = got["function floor, pipelined"]

    def cpu(samples: list[Sample]) -> float:
        return med([x.cpu_us for x in samples])

    return [
        ratio_row(
            "`slawatch.event` ingest, 1,000/transaction, one round trip each",
            rates(got["event(), round trips"]),
            rates(got["raw, round trips"]),
            0.7,
            raw,
        ),
        ratio_row(
            "the same, pipelined (the server's own cost)",
            rates(got["event(), pipelined"]),
            rates(got["raw, pipelined"]),
            0.7,
            raw,
        ),
        Row(
            "`slawatch.events(jsonb)`, the same 1,000 in one call",
            f"{rate_text(jsonb)} ({jsonb / med(rates(got['raw, round trips'])):.2f}× raw"
            f" round trips, {jsonb / med(rates(got['raw, pipelined'])):.2f}× raw pipelined)",
            "printed",
            None,
        ),
        Row(
            "`slawatch.event` pipelined vs the same rows written by hand (its dedupe row and"
            " timer row, the timer table's indexes, one statement)",
            f"{med(rates(got['event(), pipelined'])) / med(rates(same)):.2f}×"
            f" ({rate_text(med(rates(same)))}; server CPU {cpu_text(got['event(), pipelined'])}"
            f" vs {cpu_text(same)}; those rows cost {cpu(same) / cpu(got['raw, pipelined']):.2f}×"
            " the raw insert's CPU)",
            "printed",
            None,
        ),
        Row(
            "the least a function in its place costs (PL/pgSQL, SECURITY DEFINER, only the"
            " start's insert into a copy of the timer table), pipelined vs raw",
            f"{med(rates(floor)) / med(rates(got['raw, pipelined'])):.2f}×"
            f" ({rate_text(med(rates(floor)))}; server CPU {cpu_text(floor)};"
            f" `slawatch.event` {med(rates(got['event(), pipelined'])) / med(rates(floor)):.2f}×"
            " of it)",
            "printed",
            None,
        ),
    ]


def report_http(scratch: Scratch, reps: int, per_client: int) -> list[Row]:
    got, missing = measure_http(scratch.create("http"), reps, per_client)
    scratch.drop("http")
    print(
        f"HTTP INGEST: {CLIENTS} client processes, {per_client} batches of {BATCH:,} each per"
        f" round; beside it slawatch.events(jsonb) from {CLIENTS} connections"
    )
    shown = missing or f"{med(got['http']):,.0f} events/s"
    print(f"  POST /v1/events        {shown}")
    print(f"  slawatch.events()      {med(got['sql']):,.0f} events/s\n")
    figure = f"`POST /v1/events`, batches of 1,000, {CLIENTS} clients"
    if missing:
        return [Row(figure, missing, "≥ 0.5× SQL ingest", None)]
    return [ratio_row(figure, got["http"], got["sql"], 0.5, "slawatch.events()")]


def report_fire(
    scratch: Scratch,
    due: int,
    reps: int,
    parts: bool = False,
    outboxes: tuple[Outbox, ...] = OUTBOXES,
) -> list[Row]:
    """Firing (3.); ``outboxes``: the shapes slawatch's claim writes the outbox in
    (SLAWATCH_OUTBOX), interleaved with the others: the default shape's (DEFAULT_OUTBOX)
    rows unlabeled, each other shape a row of its own, labeled SLAWATCH_OUTBOX=<shape>."""
    got = measure_fire(scratch, due, reps, parts, outboxes)
    scratch.drop("fire")
    print(
        f"FIRING: {due:,} due timers (and as many not yet due), batches of {FIRE_BATCH:,},"
        " each drain on a fresh copy"
    )
    labels = {
        "slawatch": f"slawatch claim + outbox in {DEFAULT_OUTBOX}",
        "raw": "raw: bare UPDATE + alert + delivery",
        "guarded": "raw, with slawatch's guarantees",
        "update": "raw: bare UPDATE alone",
    }
    shapes = [o for o in outboxes if o != DEFAULT_OUTBOX]
    if DEFAULT_OUTBOX not in outboxes:  # the other shape alone: the default left out
        labels.pop("slawatch")
    ours = {fire_variant(o): f"slawatch claim + outbox in {o}" for o in outboxes}
    print_samples(ours | {k: v for k, v in labels.items() if k != "slawatch"}, got, "timer")
    if shapes:
        print("  WAL per timer (server-wide, medians):")
        shown = {fire_variant(o): f"slawatch, outbox in {o}" for o in outboxes}
        for name in [*shown, "raw", "guarded", "update"]:
            print(f"    {shown.get(name, name):<36} {med([s.wal_b for s in got[name]]):>8,.0f} B")
        print("  round by round (each drain against the raw statement of its round):")
        for name, label in shown.items():
            pairs = list(zip(got[name], got["raw"], strict=True))
            speed = sorted(a.rate / b.rate for a, b in pairs)
            spent = sorted(a.cpu_us / b.cpu_us for a, b in pairs)
            print(
                f"    {label:<36} {med(speed):.2f}× the rate ({speed[0]:.2f}–{speed[-1]:.2f}),"
                f" {med(spent):.2f}× the server CPU ({spent[0]:.2f}–{spent[-1]:.2f})"
            )
        print()
    extra = [
        ratio_row(
            f"firing due timers, outbox in {o} (SLAWATCH_OUTBOX={o})",
            rates(got[fire_variant(o)]),
            rates(got["raw"]),
            0.9,
            "raw claim + outbox",
        )
        for o in shapes
    ]
    if parts:
        print("  the guarded statement without one guarantee each (server CPU vs guarded):")
        guarded_cpu = med([s.cpu_us for s in got["guarded"]])
        for part in GUARDED_PARTS:
            cpu_us = med([s.cpu_us for s in got[part]])
            print(
                f"    {part:<36} {med(rates(got[part])):>8,.0f} timer/s;"
                f" server CPU {cpu_us:,.1f} µs/timer ({cpu_us / guarded_cpu:.2f}×)"
            )
        print()
    if DEFAULT_OUTBOX not in outboxes:
        return extra
    ours, raw, guarded, update = (rates(got[k]) for k in labels)
    x = med(ours) / med(update)
    cpu = {k: med([s.cpu_us for s in got[k]]) for k in labels}
    return [
        ratio_row("firing due timers (claim + outbox)", ours, raw, 0.9, "raw claim + outbox"),
        Row(
            "the same vs the raw statement with slawatch's guarantees (alert once, `_again`"
            " and `_due_at` entries, episode history)",
            f"{med(ours) / med(guarded):.2f}× ({rate_text(med(guarded))}; server CPU"
            f" {cpu['slawatch']:,.0f} vs {cpu['guarded']:,.0f} µs/timer; the guarantees"
            f" cost the raw statement {cpu['guarded'] / cpu['raw']:.2f}× its CPU)",
            "printed",
            None,
        ),
        Row(
            "the same vs the bare UPDATE alone",
            f"{x:.2f}× ({rate_text(med(update))}; raw claim + outbox"
            f" {med(raw) / med(update):.2f}× of it)",
            "printed",
            None,
        ),
        *extra,
    ]


def report_probe(scratch: Scratch, sizes: tuple[int, ...] = PROBE_SIZES) -> list[Row]:
    curve, b = measure_probe(scratch, sizes)
    print(
        'PROBE: the rule\'s "anything due?" probe, prepared, none due, past the 5 custom'
        f" plans (ms: median wall time of {PROBE_RUNS} runs, round trip included; the server"
        " process's CPU per run)"
    )
    for size, m in curve:
        print(
            f"  {size:>9,} open timers: slawatch {m['ours']:.3f} (CPU {m['ours cpu']:.3f}),"
            f" the EXISTS form it replaced {m['old']:.3f} (CPU {m['old cpu']:.3f});"
            f" generic plans in use: {m['generic']:.0f} of {m['prepared']:.0f} prepared"
        )
    index = ", ".join(
        f"{k.split(' ', 1)[1]} {v:.0f}" for k, v in b.items() if k.startswith("index ")
    )
    print(
        f"  bytes per open timer at {b['open']:,.0f} (loaded, vacuumed): {b['total']:.0f};"
        f" heap {b['heap']:.0f}, indexes {b['indexes']:.0f} ({index})\n"
    )
    (small, first), (big, last) = curve[0], curve[-1]
    # The server's CPU where it can be read (steadier on a busy machine), else wall time.
    what = "ours cpu" if last["ours cpu"] == last["ours cpu"] else "ours"
    growth = last[what] / first[what]
    return [
        Row(
            f"probe, {small:,} → {big:,} open timers (generic plan)",
            f"{first[what]:.3f} → {last[what]:.3f} ms {'server CPU' if what != 'ours' else ''}"
            f" ({growth:.2f}×; the EXISTS form {first['old']:.1f} → {last['old']:.1f} ms)",
            "flat (≤ 1.5×)",
            growth <= 1.5,
        )
    ]


def report_lateness(scratch: Scratch, timers: int, rate: int, secs: int) -> list[Row]:
    late = measure_lateness(scratch, timers, rate, secs)
    scratch.drop("late")
    print(
        f"LATENESS: `slawatch run`, every: 1s, {late.timers:,} open timers (loaded in"
        f" {late.load_secs:.0f} s) + {late.due:,} falling due, {rate:,} a second for {secs} s;"
        f" {late.fed:,} new starts ingested meanwhile"
    )
    print(
        f"  due -> alert committed: p50 {late.p50:.2f} s, p99 {late.p99:.2f} s,"
        f" worst {late.worst:.2f} s ({late.fired:,} of {late.due:,} seen)"
    )
    b = late.bytes

    def parts(kind: str) -> str:
        return ", ".join(
            f"{k.split(' ', 1)[1]} {v:.0f}" for k, v in b.items() if k.startswith(kind)
        )

    print(
        f"  bytes per open timer ({b['open']:,.0f} open, before the run): {b['total']:.0f};"
        f" heap {b['heap']:.0f} (of it, mean stored jsonb: {parts('column ')}),"
        f" indexes {b['indexes']:.0f} ({parts('index ')})\n"
    )
    return [
        Row(
            f"p99 lateness, {late.timers:,} open timers, {rate:,} firing/s, every: 1s",
            f"{late.p99:.2f} s (p50 {late.p50:.2f} s; {late.fired:,} of {late.due:,} fired)",
            "≤ 2 s (interval + 1 s)",
            late.p99 <= 2.0 and late.fired == late.due,
        ),
        Row(
            f"bytes per open timer (heap + indexes), {b['open']:,.0f} open",
            f"{b['total']:.0f} B (heap {b['heap']:.0f}, indexes {b['indexes']:.0f})",
            "≤ 250 B",
            b["total"] <= 250,
        ),
    ]


def report_brokers(scratch: Scratch, messages: int, reps: int) -> list[Row]:
    got = measure_brokers(scratch.create("brokers"), messages, reps)
    scratch.drop("brokers")
    missing = sources_missing()
    print(
        f"BROKERS: {messages:,} events per broker and round: published until the broker holds"
        f" them all, then stored by `slawatch run` (a source, batches of {BATCH:,})"
    )
    rows = []
    for label, r in got.items():
        publish = r.failed or f"publish {rate_text(med(r.publish))}"
        consumed = missing or r.failed or rate_text(med(r.consume))
        print(f"  {label:<38} {publish}; slawatch {consumed}")
        rows.append(
            Row(
                f"broker ingest, {label}, {messages:,} events",
                f"slawatch {consumed} ({publish})",
                "printed, beside the publish rate",
                None,
            )
        )
    print()
    return rows


SECTIONS = ("ingest", "http", "fire", "timerprobe", "lateness", "brokers")


def fire_outboxes(text: str) -> tuple[Outbox, ...] | None:
    """--outbox's shapes (SLAWATCH_OUTBOX), in order; None: not alerts/rows."""
    shapes = tuple(o.strip() for o in text.split(",") if o.strip())
    if not shapes or any(o not in ("alerts", "rows") for o in shapes):
        return None
    return shapes  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--timers", type=int, default=1_000_000, help="open timers (lateness, bytes)"
    )
    parser.add_argument("--due", type=int, default=100_000, help="due timers to fire")
    parser.add_argument("--rate", type=int, default=1000, help="timers falling due per second")
    parser.add_argument("--secs", type=int, default=60, help="seconds of the lateness run")
    parser.add_argument("--reps", type=int, default=5, help="rounds of ingest and HTTP (>= 3)")
    parser.add_argument("--fire-reps", type=int, default=3, help="rounds of firing (>= 3)")
    parser.add_argument("--broker-reps", type=int, default=3, help="rounds per broker (>= 3)")
    parser.add_argument(
        "--http-batches", type=int, default=10, help="batches per HTTP client per round"
    )
    parser.add_argument("--messages", type=int, default=100_000, help="events per broker")
    parser.add_argument(
        "--skip", default="", help="comma-separated: ingest,http,fire,timerprobe,lateness,brokers"
    )
    parser.add_argument(
        "--fire-parts",
        action="store_true",
        help="firing: also the raw statement with slawatch's guarantees less one each",
    )
    parser.add_argument(
        "--only", default="", help="comma-separated: run only these sections (names as --skip)"
    )
    parser.add_argument(
        "--outbox",
        default=",".join(OUTBOXES),
        help="firing: the outbox's shapes slawatch's claim writes, comma-separated,"
        " interleaved by round (SLAWATCH_OUTBOX: alerts, rows; default %(default)s,"
        " the default shape first, its figures unlabeled)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny: does it run?")
    args = parser.parse_args()
    if args.quick:
        args.timers, args.due, args.secs, args.reps = 20_000, 20_000, 5, 3
        args.fire_reps = args.broker_reps = 3
        args.http_batches, args.messages = 2, 5_000
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = (skip | only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section {sorted(unknown)[0]!r}: one of {', '.join(SECTIONS)}")
    if only:
        skip |= set(SECTIONS) - only
    outboxes = fire_outboxes(args.outbox)
    if outboxes is None:
        parser.error("--outbox: alerts, rows or both, comma-separated")
    began = time.perf_counter()
    rows: list[Row] = []
    with Scratch() as scratch:
        with psycopg.connect(scratch.server, autocommit=True) as server:
            print(machine(server))
        print(
            f"rule {RULE}: start {START}, stop {STOP}, within 72h, no renotify, one notifier;"
            f" data {json.dumps(DATA)}; server CPU: the PostgreSQL backend's own CPU time"
            " (its waits left out)\n"
        )
        if "ingest" not in skip:
            rows += report_ingest(scratch, args.reps)
        if "http" not in skip:
            rows += report_http(scratch, args.reps, args.http_batches)
        if "fire" not in skip:
            rows += report_fire(scratch, args.due, args.fire_reps, args.fire_parts, outboxes)
        if "timerprobe" not in skip:
            rows += report_probe(scratch, (20_000, 100_000) if args.quick else PROBE_SIZES)
        if "lateness" not in skip:
            rows += report_lateness(scratch, args.timers, args.rate, args.secs)
        if "brokers" not in skip:
            rows += report_brokers(scratch, args.messages, args.broker_reps)
    print(
        f"EVENTS: THE ISSUE'S TABLE (issue 15); medians of interleaved rounds: {args.reps}"
        f" (ingest, HTTP), {args.fire_reps} (firing), {args.broker_reps} (brokers)"
    )
    print_table(rows)
    print(
        f"\nwhole run: {time.perf_counter() - began:.0f} s, load average"
        f" {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} CPUs); scratch databases dropped"
    )


if __name__ == "__main__":
    main()
