"""A fault harness: real ``slawatch run`` processes against a real PostgreSQL and a
real webhook receiver, while the harness kills the processes, stops the
database or takes the receiver down; then one clean run settles and the
outcome is checked against what the harness did.

Shared by ``tests/integration/test_faults.py`` (short, in CI) and
``bench/faults.py`` (long, with a summary table). It imports nothing from
pytest so the bench can use it.

The workload: one table of rows whose deadlines fall due over the run, one
rule (scan every 1 s, re-notify every 2 s, at most 3 notifications per
episode) and one webhook notifier with a short retry. While faults happen, the
harness also changes some rows, and logs each change that committed:

- completes a row, or moves its deadline later, *before* it falls due;
- completes a row, or gives it a new deadline, right after the receiver saw
  its notification #1 (racing the re-notifications: #1..#k with k in 1..3);
- gives a row a new deadline (up to 2 s past, or up to 4 s ahead) after the
  receiver saw its last notification (#3): a new episode, which must page
  again from #1.

With ``resolve=True`` (bench/faults.py) the rule has ``resolve: true``: every episode
that ended (its row completed, or given a new deadline) must get one resolved notice,
received after the episode's notifications, and an episode still open none.

The expected alerts follow from that log alone (deadlines, changes, the cap),
never from what slawatch wrote; :meth:`FaultRun.verify` compares them with the
``slawatch.alert`` rows (or the elements of the outbox in rows, SLAWATCH_OUTBOX=rows)
and with the ids the receiver accepted.
"""

from __future__ import annotations

import enum
import heapq
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg

from slawatch.config.rules import RENOTIFY_LEAD
from tests.pgcluster import free_port

RULE = "fault"
TABLE = "fault_task"
CAP = 3  # notifications per episode: the rule's renotify.max
RENOTIFY = timedelta(seconds=2)  # the rule's renotify.every
# A scan takes a re-notification due within a moment after it (Rule.renotify_cutoff): at
# most a tenth of the rule's `every: 1s` early, never more.
EARLY = min(RENOTIFY_LEAD, timedelta(seconds=1) / 10)
RULE_YAML = f"""\
table: public.{TABLE}
key: id
deadline: due_at
open_when: "status = 'open'"
every: 1s
batch: 200
renotify: {{every: 2s, max: {CAP}}}
columns: [id, due_at]
notify: [hook]
"""
# The lease of a claimed delivery is 2 * timeout + 2 s: what a killed process's batch waits.
NOTIFIER_YAML = """\
type: webhook
url: {url}
batch: 50
timeout: 2s
retry: {{first: 1s, max: 2s, attempts: 1000}}
"""
APP = "slawatch-fault-"  # application_name prefix: how the harness sees a process connected


def now() -> datetime:
    """The wall clock, which is also slawatch's application clock."""
    return datetime.now(UTC)


def alert_id(key: int, episode: int, n: int) -> str:
    """The idempotency id slawatch gives notification ``n`` of ``episode`` of row ``key``."""
    return f"{RULE}:{key}:e{episode}:n{n}"


def resolved_id(key: int, episode: int) -> str:
    """The idempotency id of the resolved notice of ``episode`` of row ``key``."""
    return f"{RULE}:{key}:e{episode}:resolved"


class Kind(enum.Enum):
    """What the harness does to a row while the faults go on."""

    PLAIN = "left alone"
    COMPLETE_EARLY = "completed before due"
    EXTEND_EARLY = "deadline moved later before due"
    COMPLETE_RACING = "completed once #1 was received"
    MOVE_RACING = "new deadline once #1 was received"
    MOVE_AFTER_CAP = "new deadline once the last notification was received"


# Shares of the rows; the rest are PLAIN.
SHARES = {
    Kind.COMPLETE_EARLY: 0.05,
    Kind.EXTEND_EARLY: 0.05,
    Kind.COMPLETE_RACING: 0.05,
    Kind.MOVE_RACING: 0.05,
    Kind.MOVE_AFTER_CAP: 0.10,
}


@dataclass
class Episode:
    """One expected episode: notifications #1..#k with ``lo <= k <= hi``."""

    deadline: datetime
    lo: int = CAP
    hi: int = CAP


@dataclass
class Row:
    key: int
    kind: Kind
    deadline: datetime  # the current one
    episodes: list[Episode]  # what the harness's log says must happen
    acted: bool = False
    completed: bool = False  # completed after its last episode began: that episode ended

    def ended(self) -> range:
        """The episodes (1-based) that ended: each but the last, and the last once the
        row completed. Those are the resolved notices a ``resolve: true`` rule owes."""
        return range(1, len(self.episodes) + (1 if self.completed else 0))


class Receiver:
    """A webhook receiver in a thread that records every alert it accepts.

    It can answer 503 (``refusing = True``) or close its port and open it again
    on the same port (:meth:`close`, :meth:`open`).
    """

    def __init__(self, on_accept: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.on_accept = on_accept
        self.refusing = False
        self.delay = 0.0  # seconds each request is held before it is answered
        self.ids: list[str] = []  # every accepted alert id, repeats included
        self.first: dict[str, dict[str, Any]] = {}  # id -> the payload first accepted
        self.requests = self.refused = 0
        self._lock = threading.Lock()
        self.port = free_port()  # below the ephemeral range: it is opened again later
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._server: ThreadingHTTPServer | None = None

    def open(self) -> None:
        """Listen (again) on the receiver's port."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.requests += 1
                if receiver.delay:
                    time.sleep(receiver.delay)  # a slow receiver: kills land mid-send
                if receiver.refusing:
                    receiver.refused += 1
                    status = 503
                else:
                    receiver._record(json.loads(body)["alerts"])
                    status = 204
                with suppress(OSError):  # the sender was killed mid-request
                    self.send_response(status)
                    self.send_header("content-length", "0")
                    self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="receiver", daemon=True).start()
        self._server = server

    def close(self) -> None:
        """Stop listening: senders get 'connection refused'."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _record(self, alerts: list[dict[str, Any]]) -> None:
        for alert in alerts:
            # The trigger goes out before the id counts as seen: FaultRun.settle relies on it.
            if self.on_accept is not None:
                self.on_accept(alert)
            with self._lock:
                self.ids.append(alert["id"])
                self.first.setdefault(alert["id"], alert)

    def seen(self) -> set[str]:
        """The distinct alert ids accepted so far."""
        with self._lock:
            return set(self.first)

    def first_at(self) -> dict[str, int]:
        """Each accepted id's place in the order of first acceptances."""
        with self._lock:
            return {name: i for i, name in enumerate(self.first)}

    def __enter__(self) -> Receiver:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Proc:
    """One ``slawatch run`` process and when to kill it."""

    popen: subprocess.Popen[bytes]
    tag: str
    log: Path
    started: float
    kill_at: float | None = None


@dataclass
class Report:
    """The outcome of a run, in the figures bench/faults.py prints."""

    kills: int
    rows: int
    alerts: int
    expected: tuple[int, int]  # the fewest and the most alerts the harness's log allows
    duplicates: int  # a (row, episode, n) alerted more than once
    missing: int  # a due (row, episode, n) never alerted
    unexpected: int  # an alert the log does not allow (past the cap, not due, wrong episode)
    premature: int  # a re-notification sooner than renotify.every (less EARLY) after the last
    undelivered: int  # an alert the receiver never accepted
    dead: int  # deliveries given up
    redeliveries: int  # accepted ids beyond the first acceptance (at-least-once)
    exits: int  # processes that ended without being killed
    wall: float  # seconds, setup to verdict
    shapes: Counter[str] = field(default_factory=Counter)  # alerts written per outbox shape
    problems: list[str] = field(default_factory=list, repr=False)  # the first few, readable
    # With resolve=True: resolved notices written, and those the log requires (one per
    # ended episode); their duplicates, misses and extras count in the figures above.
    resolved: int = 0
    resolved_expected: int = 0
    misordered: int = 0  # a resolved notice received before a notification of its episode

    @property
    def ok(self) -> bool:
        return not (
            self.duplicates
            or self.missing
            or self.unexpected
            or self.premature
            or self.undelivered
            or self.dead
            or self.exits
            or self.misordered
        )


class FaultRun:
    """One workload on one database; call :meth:`setup`, faults, :meth:`settle`, :meth:`verify`."""

    def __init__(
        self,
        dsn: str,
        workdir: Path,
        *,
        rows: int,
        spread: float,
        seed: int,
        say: Callable[[str], None] | None = None,
        outbox: str = "alerts",
        resolve: bool = False,
    ) -> None:
        self.dsn, self.workdir = dsn, workdir
        # The rule's `resolve`: resolved notices through the faults, counted by verify().
        self.resolve = resolve
        # SLAWATCH_OUTBOX of every process: the shape its claims write
        # (docs/explanation/outbox-rows.md); the checks read both shapes.
        self.outbox = outbox
        self.n_rows, self.spread = rows, spread
        self.random = random.Random(seed)
        self.seed = seed
        self._say = say
        self.began = time.monotonic()
        self.receiver = Receiver(self._on_accept)
        self.rows: dict[int, Row] = {}
        self.kills = 0
        self.procs: list[Proc] = []
        self.exits: list[str] = []  # processes that ended without being killed
        self._spawned = 0
        self._lock = threading.Lock()  # guards rows
        self._version = 0  # bumped by every change that committed
        self._timed: list[tuple[datetime, int]] = []  # (when, key): changes before due
        self._triggers: queue.Queue[tuple[int, int, int]] = queue.Queue()  # (key, episode, n)
        self._gate = threading.Lock()  # held while the database is down on purpose
        self._stop = threading.Event()
        self._actor: threading.Thread | None = None
        self._watch: psycopg.Connection[Any] | None = None

    # -- setup --------------------------------------------------------------------------

    def say(self, text: str) -> None:
        if self._say is not None:
            self._say(f"[{time.monotonic() - self.began:7.1f}s] {text}")

    def env(self, tag: str = "") -> dict[str, str]:
        """The environment of a slawatch process: nothing of the caller's SLAWATCH_*."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLAWATCH_", "PG"))}
        return env | {
            "SLAWATCH_DSN": self.dsn,
            "SLAWATCH_RULES_DIR": str(self.workdir / "rules"),
            "SLAWATCH_NOTIFIERS_DIR": str(self.workdir / "notifiers"),
            # A short pool timeout keeps a database outage cheap to sit out.
            "SLAWATCH_DB_TIMEOUT": "2",
            "SLAWATCH_HTTP": "",  # several processes: no admin port to fight over
            "SLAWATCH_OUTBOX": self.outbox,
            "PGAPPNAME": APP + tag,
        }

    def setup(self) -> None:
        """Receiver up, config written, table created and migrated, rows inserted."""
        self.receiver.open()
        (self.workdir / "rules").mkdir(parents=True)
        (self.workdir / "notifiers").mkdir()
        (self.workdir / "logs").mkdir()
        rule = RULE_YAML + ("resolve: true\n" if self.resolve else "")
        (self.workdir / "rules" / f"{RULE}.yaml").write_text(rule)
        (self.workdir / "notifiers" / "hook.yaml").write_text(
            NOTIFIER_YAML.format(url=self.receiver.url)
        )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, status text NOT NULL,"
                " due_at timestamptz NOT NULL)"
            )
        done = subprocess.run(
            [sys.executable, "-m", "slawatch", "migrate"],
            env=self.env("migrate"),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"slawatch migrate failed: {done.stderr.strip()}")
        start = now()
        for key in range(1, self.n_rows + 1):
            # A tenth is overdue at once (a backlog), the rest falls due over the run.
            offset = (
                self.random.uniform(-5, 0) if key % 10 == 0 else self.random.uniform(1, self.spread)
            )
            deadline = start + timedelta(seconds=offset)
            kind = Kind.PLAIN
            pick = self.random.random()
            for k in SHARES:
                if pick < SHARES[k]:
                    kind = k
                    break
                pick -= SHARES[k]
            if kind in (Kind.COMPLETE_EARLY, Kind.EXTEND_EARLY) and offset < 3:
                kind = Kind.PLAIN  # too close to act on safely before it is due
            self.rows[key] = Row(key, kind, deadline, [Episode(deadline)])
            if kind in (Kind.COMPLETE_EARLY, Kind.EXTEND_EARLY):
                # Acting at a random point well before the deadline.
                lead = self.random.uniform(1.5, min(offset - 1, 10))
                self._timed.append((deadline - timedelta(seconds=lead), key))
        heapq.heapify(self._timed)
        with (
            psycopg.connect(self.dsn, autocommit=True) as conn,
            conn.cursor().copy(f"COPY {TABLE} (id, status, due_at) FROM STDIN") as copy,
        ):
            for row in self.rows.values():
                copy.write_row((row.key, "open", row.deadline))
        counts = Counter(r.kind for r in self.rows.values())
        self.say(
            f"{self.n_rows} rows due over {self.spread:.0f}s: "
            + ", ".join(f"{n} {k.value}" for k, n in counts.most_common())
        )
        self._actor = threading.Thread(target=self._act, name="actor", daemon=True)
        self._actor.start()

    # -- the harness's own changes to rows ------------------------------------------------

    def _on_accept(self, alert: dict[str, Any]) -> None:
        self._triggers.put((int(alert["key"]), int(alert["episode"]), int(alert["n"])))

    def _act(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    with self._gate:
                        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
                self._act_timed(conn)
                try:
                    trigger = self._triggers.get(timeout=0.05)
                except queue.Empty:
                    continue
                try:
                    self._act_on(conn, *trigger)
                finally:
                    self._triggers.task_done()
            except psycopg.OperationalError as exc:
                # The database went away under us (stopped on purpose): reconnect after it.
                self.say(f"actor: {str(exc).strip().splitlines()[0]}; reconnecting")
                if conn is not None:
                    conn.close()
                self._stop.wait(0.2)
        if conn is not None:
            conn.close()

    def _act_timed(self, conn: psycopg.Connection[Any]) -> None:
        while self._timed and self._timed[0][0] <= now():
            _, key = self._timed[0]
            row = self.rows[key]
            # Only while the deadline is still comfortably ahead: then no scan can have
            # claimed the row, so the outcome is known whatever the processes do.
            safe = now() + timedelta(seconds=0.5)
            with self._gate:
                if row.kind is Kind.COMPLETE_EARLY:
                    cur = conn.execute(
                        f"UPDATE {TABLE} SET status = 'done' WHERE id = %s AND due_at > %s",
                        (key, safe),
                    )
                    applied, episodes = cur.rowcount == 1, []
                else:
                    later = row.deadline + timedelta(seconds=self.random.uniform(2, 6))
                    cur = conn.execute(
                        f"UPDATE {TABLE} SET due_at = %s WHERE id = %s AND due_at > %s",
                        (later, key, safe),
                    )
                    applied, episodes = cur.rowcount == 1, [Episode(later)]
            heapq.heappop(self._timed)
            if applied:
                with self._lock:
                    row.episodes, row.acted = episodes, True
                    if episodes:
                        row.deadline = episodes[0].deadline
                    self._version += 1

    def _act_on(self, conn: psycopg.Connection[Any], key: int, episode: int, n: int) -> None:
        row = self.rows.get(key)
        if row is None or row.acted or episode != 1:
            return
        racing = row.kind in (Kind.COMPLETE_RACING, Kind.MOVE_RACING)
        if not ((racing and n == 1) or (row.kind is Kind.MOVE_AFTER_CAP and n == CAP)):
            return
        with self._gate:
            if row.kind is Kind.COMPLETE_RACING:
                conn.execute(f"UPDATE {TABLE} SET status = 'done' WHERE id = %s", (key,))
                new = None
            else:
                # Sometimes already past: the new episode is due at once, with no scan
                # in between to close the old one.
                new = now() + timedelta(seconds=self.random.uniform(-2, 4))
                conn.execute(f"UPDATE {TABLE} SET due_at = %s WHERE id = %s", (new, key))
        with self._lock:
            if racing:
                # #1 was received: the episode has #1 and, racing the change, maybe #2, #3.
                row.episodes[-1].lo = 1
            if new is not None:
                row.episodes.append(Episode(new))
                row.deadline = new
            else:
                row.completed = True
            row.acted = True
            self._version += 1

    def acted(self) -> Counter[Kind]:
        """How many rows of each kind the harness changed (changes that committed)."""
        with self._lock:
            return Counter(r.kind for r in self.rows.values() if r.acted)

    def _idle(self) -> bool:
        return not self._timed and self._triggers.unfinished_tasks == 0

    # -- processes ------------------------------------------------------------------------

    def spawn(self) -> Proc:
        """Start one ``slawatch run``; its output goes to logs/<tag>.log."""
        self._spawned += 1
        tag = f"{self._spawned}"
        log = self.workdir / "logs" / f"run-{tag}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "slawatch", "run"],
                env=self.env(tag),
                cwd=self.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(popen, tag, log, time.monotonic())
        self.procs.append(proc)
        return proc

    def kill(self, proc: Proc) -> None:
        """SIGKILL: no handler runs, nothing is flushed or released by slawatch."""
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(30)
        self.procs.remove(proc)
        self.kills += 1

    def _reap(self) -> None:
        """Note processes that ended by themselves: slawatch must not exit under faults."""
        for proc in list(self.procs):
            code = proc.popen.poll()
            if code is not None:
                self.procs.remove(proc)
                self.exits.append(f"run-{proc.tag} exited with {code}: {tail(proc.log)}")

    def connected(self) -> set[str]:
        """Tags of the processes that have a database session now."""
        conn = self._watcher()
        rows = conn.execute(
            "SELECT DISTINCT application_name FROM pg_stat_activity WHERE application_name LIKE %s",
            (APP + "%",),
        ).fetchall()
        return {str(r[0]).removeprefix(APP) for r in rows}

    def _watcher(self) -> psycopg.Connection[Any]:
        if self._watch is None or self._watch.closed or self._watch.broken:
            self._watch = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
        return self._watch

    # -- faults ---------------------------------------------------------------------------

    def kill_storm(
        self,
        *,
        kills: int,
        seconds: float,
        processes: int = 2,
        delay: tuple[float, float] = (0.1, 1.5),
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """Keep ``processes`` runs alive, SIGKILL each a random ``delay`` after it connected,
        restart at once; until ``kills`` kills and ``seconds`` seconds (or ``stop()``)."""
        started = time.monotonic()
        target = self.kills + kills
        last_note = started
        while True:
            elapsed = time.monotonic() - started
            if (self.kills >= target and elapsed >= seconds) or (stop is not None and stop()):
                break
            self._reap()
            while len(self.procs) < processes:
                self.spawn()
            live = self.connected()
            t = time.monotonic()
            for proc in list(self.procs):
                if proc.kill_at is None and proc.tag in live:
                    proc.kill_at = t + self.random.uniform(*delay)
                elif proc.kill_at is None and t - proc.started > 30:
                    proc.kill_at = t  # never connected: kill it anyway, it counts
                if proc.kill_at is not None and t >= proc.kill_at:
                    self.kill(proc)
            if t - last_note >= 10:
                last_note = t
                self.say(f"{self.kills} kills, {len(self.receiver.seen())} alerts received")
            time.sleep(0.02)
        self._reap()
        self.say(f"kill storm over: {self.kills} kills in {time.monotonic() - started:.0f}s")

    def wait_serving(self, timeout: float) -> None:
        """Until every running process is past startup: its delivery listener is up.

        A process still starting when the database goes away exits 1 with one line,
        as ``slawatch run`` should; the database faults are for processes that run.
        """
        deadline = time.monotonic() + timeout
        while True:
            self._reap()
            rows = (
                self._watcher()
                .execute(
                    "SELECT DISTINCT application_name FROM pg_stat_activity"
                    " WHERE application_name LIKE %s AND query LIKE 'LISTEN %%'",
                    (APP + "%",),
                )
                .fetchall()
            )
            if not {p.tag for p in self.procs} - {str(r[0]).removeprefix(APP) for r in rows}:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"processes not serving after {timeout:.0f}s")
            time.sleep(0.05)

    def receiver_outage(self, refuse: float, closed: float, wait: float = 60) -> None:
        """The receiver answers 503 for ``refuse`` seconds (and at least one request),
        then its port is closed for ``closed`` seconds, then it is back.

        Raises TimeoutError when no delivery attempt came within ``wait`` seconds after
        ``refuse`` (the outage met no delivery); the receiver then accepts again."""
        self.receiver.refusing = True
        refused, until = self.receiver.refused, time.monotonic() + refuse
        while time.monotonic() < until or self.receiver.refused == refused:
            if time.monotonic() > until + wait:
                self.receiver.refusing = False
                raise TimeoutError("no delivery attempt reached the receiver while it refused")
            time.sleep(0.05)
        self.receiver.close()
        self.receiver.refusing = False
        time.sleep(closed)
        self.receiver.open()
        self.say(f"receiver back after {refuse:g}s of 503 and {closed:g}s closed")

    @contextmanager
    def database_down(self) -> Iterator[None]:
        """Hold back the harness's own writes while the caller stops the database."""
        with self._gate:
            if self._watch is not None:
                self._watch.close()
            yield

    def wait_received(self, count: int, timeout: float) -> None:
        """Until the receiver holds ``count`` distinct ids (progress before a fault)."""
        deadline = time.monotonic() + timeout
        while len(self.receiver.seen()) < count:
            self._reap()
            if self.exits:
                raise RuntimeError(f"slawatch exited: {self.exits}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {len(self.receiver.seen())} of {count} alerts received "
                    f"in {timeout:.0f}s; {self.log_tails()}"
                )
            time.sleep(0.1)

    # -- the end --------------------------------------------------------------------------

    def required(self) -> set[str]:
        """The ids that must exist by now, from the harness's log (call with _lock held)."""
        ids: set[str] = set()
        for row in self.rows.values():
            for e, episode in enumerate(row.episodes, 1):
                ids.update(alert_id(row.key, e, n) for n in range(1, episode.lo + 1))
            if self.resolve:
                ids.update(resolved_id(row.key, e) for e in row.ended())
        return ids

    def deliveries(self) -> Counter[str]:
        """Deliveries by status (pending, sent, dead), with the sends of the outbox in rows
        (one per row and notifier) beside them."""
        rows = (
            self._watcher()
            .execute(
                "SELECT status, count(*) FROM (SELECT status FROM slawatch.delivery"
                " UNION ALL SELECT status FROM slawatch.outbox_send) s GROUP BY status"
            )
            .fetchall()
        )
        return Counter({str(status): int(count) for status, count in rows})

    def settle(
        self, timeout: float, *, fresh: bool = True, quiet: float = 3.5, stall: float = 15
    ) -> float:
        """Until every required alert was received and no delivery is pending.

        ``fresh``: first stop every process and start one clean run (after a kill
        storm); otherwise the processes running now must get there by themselves.
        Then ``quiet`` seconds (longer than a re-notification) to let anything the
        rule does not allow show itself. Returns the seconds it took. Stops early
        when a delivery went dead, or when nothing moved for ``stall`` seconds
        after the last deadline with nothing pending (an alert that never comes):
        :meth:`verify` then says what is wrong. Raises TimeoutError after ``timeout``.
        """
        started = time.monotonic()
        if fresh:
            self._reap()
            for proc in list(self.procs):
                self.kill(proc)
            self.spawn()
        deadline = started + timeout
        moved, last = started, (-1, -1, -1)
        while True:
            self._reap()
            try:
                version, idle = self._version, self._idle()
                seen = self.receiver.seen()
                with self._lock:
                    missing = self.required() - seen
                    due = max(e.deadline for r in self.rows.values() for e in r.episodes)
                status = self.deliveries()
                pending = status["pending"]
                if status["dead"]:
                    break  # never allowed (1000 attempts): verify() reports it now
                if (
                    not missing
                    and pending == 0
                    and idle
                    and self._idle()
                    and version == self._version
                ):
                    break
                state = (len(self.receiver.ids), sum(status.values()), version)
                if state != last:
                    moved, last = time.monotonic(), state
                elif (
                    pending == 0
                    and idle
                    and now() > due + timedelta(seconds=stall)
                    and time.monotonic() - moved > stall
                ):
                    self.say(f"settle: nothing moved for {stall:g}s, {len(missing)} missing")
                    break
            except psycopg.OperationalError as exc:
                missing, pending = {"?"}, -1
                self.say(f"settle: {str(exc).strip().splitlines()[0]}")
                if self._watch is not None:
                    self._watch.close()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"not settled after {timeout:.0f}s: {len(missing)} alerts not received "
                    f"(e.g. {sorted(missing)[:3]}), {pending} deliveries pending, "
                    f"processes running: {len(self.procs)}; {self.log_tails()}"
                )
            time.sleep(0.25)
        took = time.monotonic() - started
        self.say(f"settled in {took:.1f}s")
        time.sleep(quiet)
        return took

    def verify(self) -> Report:
        """Compare what slawatch wrote and the receiver accepted with the harness's log."""
        self._stop.set()
        if self._actor is not None:
            self._actor.join(30)
        conn = self._watcher()
        # What slawatch wrote, in either shape: today's alerts, and each element of the
        # outbox's rows (0020_outbox_rows.sql), which no unique index keeps once.
        written = conn.execute(
            "SELECT 'alerts', key, episode, n, deadline, fired_at FROM slawatch.alert"
            " WHERE rule = %(rule)s AND kind = 'firing'"
            " UNION ALL SELECT 'rows', e.key, e.episode, e.n, e.deadline, r.fired_at"
            " FROM slawatch.outbox_row r,"
            " unnest(r.keys, r.episodes, r.ns, r.deadlines) AS e(key, episode, n, deadline)"
            " WHERE r.rule = %(rule)s AND r.kind = 'firing'",
            {"rule": RULE},
        ).fetchall()
        shapes = Counter(str(w[0]) for w in written)
        alerts = [tuple(w[1:]) for w in written]
        dead = conn.execute(
            "SELECT (SELECT count(*) FROM slawatch.delivery WHERE status = 'dead')"
            " + (SELECT count(*) FROM slawatch.outbox_send WHERE status = 'dead')"
        ).fetchone()
        problems: list[str] = list(self.exits)
        counts = Counter((int(k), int(e), int(n)) for k, e, n, _, _ in alerts)
        duplicates = sum(c - 1 for c in counts.values())
        problems += [f"{alert_id(*a)} alerted {c} times" for a, c in counts.items() if c > 1]
        got: dict[tuple[int, int], dict[int, tuple[datetime, datetime]]] = {}
        got_n: dict[tuple[int, int], set[int]] = {}  # verify's own copy: `got` is consumed
        for k, e, n, dl, fired in alerts:
            got.setdefault((int(k), int(e)), {})[int(n)] = (dl, fired)
            got_n.setdefault((int(k), int(e)), set()).add(int(n))
        missing = unexpected = premature = 0
        lo_total = hi_total = 0
        for row in self.rows.values():
            for e, ep in enumerate(row.episodes, 1):
                lo_total, hi_total = lo_total + ep.lo, hi_total + ep.hi
                have = got.pop((row.key, e), {})
                top = max(have, default=0)
                # #1..#k with lo <= k <= hi, no gaps.
                need = range(1, max(ep.lo, min(top, ep.hi)) + 1)
                lost = [n for n in need if n not in have]
                extra = [n for n in have if n > ep.hi]
                missing += len(lost)
                unexpected += len(extra)
                if lost or extra:
                    k = f"{ep.lo}" if ep.lo == ep.hi else f"k, k from {ep.lo} to {ep.hi}"
                    problems.append(
                        f"row {row.key} ({row.kind.value}) episode {e}: "
                        f"expected #1..#{k}, got {sorted(have)}"
                    )
                for n, (dl, fired) in sorted(have.items()):
                    if n > ep.hi:
                        continue
                    if dl != ep.deadline or fired < ep.deadline:
                        unexpected += 1
                        problems.append(
                            f"{alert_id(row.key, e, n)} ({row.kind.value}): deadline {dl}, "
                            f"fired {fired}; the episode's deadline is {ep.deadline}"
                        )
                    before = have.get(n - 1)
                    if before is not None and fired - before[1] < RENOTIFY - EARLY:
                        premature += 1
                        problems.append(
                            f"{alert_id(row.key, e, n)}: {fired - before[1]} after #{n - 1}"
                        )
        for (k, e), have in got.items():  # episodes the log has no room for
            unexpected += len(have)
            problems.append(
                f"row {k} ({self.rows[k].kind.value if k in self.rows else '?'}): episode {e} "
                f"#{sorted(have)} not expected"
            )
        ids: set[str] = {alert_id(int(k), int(e), int(n)) for k, e, n, _, _ in alerts}
        # Resolved notices: once per ended episode, none for one still open, each received
        # after every notification of its episode (first acceptances compared).
        notices = conn.execute(
            "SELECT key, episode FROM slawatch.alert WHERE rule = %(rule)s AND kind = 'resolved'"
            " UNION ALL SELECT e.key, e.episode FROM slawatch.outbox_row r,"
            " unnest(r.keys, r.episodes) AS e(key, episode)"
            " WHERE r.rule = %(rule)s AND r.kind = 'resolved'",
            {"rule": RULE},
        ).fetchall()
        ended = Counter((int(k), int(e)) for k, e in notices)
        owed = (
            {(r.key, e) for r in self.rows.values() for e in r.ended()} if self.resolve else set()
        )
        for (k, e), c in ended.items():
            if c > 1:
                duplicates += c - 1
                problems.append(f"{resolved_id(k, e)} written {c} times")
        for k, e in sorted(owed - set(ended)):
            missing += 1
            problems.append(f"{resolved_id(k, e)} ({self.rows[k].kind.value}) never written")
        for k, e in sorted(set(ended) - owed):
            unexpected += 1
            kind = self.rows[k].kind.value if k in self.rows else "?"
            problems.append(f"{resolved_id(k, e)} ({kind}) written for an episode not ended")
        ids.update(resolved_id(k, e) for k, e in ended)
        seen = self.receiver.seen()
        first = self.receiver.first_at()
        misordered = 0
        for k, e in ended:
            at = first.get(resolved_id(k, e))
            later = [
                alert_id(k, e, n)
                for n in got_n.get((k, e), ())
                if at is not None and first.get(alert_id(k, e, n), -1) > at
            ]
            if later:
                misordered += 1
                problems.append(f"{resolved_id(k, e)} received before {later}")
        undelivered = len(ids - seen)
        if ids - seen:
            problems.append(f"never received: {sorted(ids - seen)[:5]}")
        phantom = seen - ids  # accepted by the receiver, yet no such alert row
        unexpected += len(phantom)
        if phantom:
            problems.append(f"received but never written: {sorted(phantom)[:5]}")
        return Report(
            kills=self.kills,
            rows=self.n_rows,
            alerts=len(alerts),
            expected=(lo_total, hi_total),
            duplicates=duplicates,
            missing=missing,
            unexpected=unexpected,
            premature=premature,
            undelivered=undelivered,
            dead=int(dead[0]) if dead else -1,
            redeliveries=len(self.receiver.ids) - len(seen),
            exits=len(self.exits),
            wall=time.monotonic() - self.began,
            shapes=shapes,
            problems=problems[:20],
            resolved=sum(ended.values()),
            resolved_expected=len(owed),
            misordered=misordered,
        )

    def log_tails(self) -> str:
        """The end of the newest process logs, for a failure message."""
        logs = sorted((self.workdir / "logs").glob("run-*.log"), key=lambda p: p.stat().st_mtime)
        return "; ".join(f"{p.name}: {tail(p)}" for p in logs[-2:]) or "no process logs"

    def close(self) -> None:
        """Kill what is left, stop the receiver and the actor."""
        self._stop.set()
        for proc in list(self.procs):
            self.kill(proc)
        if self._actor is not None:
            self._actor.join(30)
        if self._watch is not None:
            self._watch.close()
        self.receiver.close()


def tail(log: Path, lines: int = 6) -> str:
    """The last lines of a process log, on one line."""
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty)"
