"""The outbox in rows end to end (docs/explanation/outbox-rows.md): the same scenario run
through `slawatch run`'s Runner with SLAWATCH_OUTBOX=alerts and with rows, each against
real webhook receivers, brings the receivers the same alerts, field for field, times
included, in the same order within each episode and notifier; and a switch of the
setting with episodes open across it pages every alert once, firing before resolved.

The scenario: an inline rule and a ``track: table`` rule, resolve: true, re-notified
every hour three times at most, from #2 critical and to the pager instead of the hook;
rows complete, get new deadlines (a new episode) and stay overdue to the cap. The clock
is the test's: each step is one ``Runner.once()`` (claims, sweeps, one delivery pass).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from slawatch.clock import Clock
from slawatch.config.notifiers import load_notifiers
from slawatch.config.rules import Rule
from slawatch.config.settings import Outbox
from slawatch.engine.migrate import migrate
from slawatch.runtime.scheduler import Runner
from tests.conftest import Dropper, new_database
from tests.integration.helpers import Conn

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
M = timedelta(minutes=1)
H = timedelta(hours=1)
JOBS = 6
TABLES = {"late_inline": ("jobs_a", "inline"), "late_table": ("jobs_b", "table")}

Alert = dict[str, Any]


class Receiver:
    """A webhook receiver in a thread that keeps every alert it accepts, in order.
    ``refuse``: a request whose alerts it answers with 503 (none when None)."""

    def __init__(self) -> None:
        self.got: list[Alert] = []
        self.refused = 0
        self.refuse: Callable[[list[Alert]], bool] | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                alerts = json.loads(body)["alerts"]
                status = 204
                if receiver.refuse is not None and receiver.refuse(alerts):
                    receiver.refused += 1
                    status = 503
                else:
                    receiver.got.extend(alerts)
                with suppress(OSError):
                    self.send_response(status)
                    self.send_header("content-length", "0")
                    self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class MovedClock(Clock):
    """The test's clock: it stays where the test puts it."""

    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at


def rule(name: str) -> Rule:
    table, track = TABLES[name]
    return Rule.model_validate(
        {
            "name": name,
            "description": f"{track} jobs finish in 10 minutes",
            "table": f"public.{table}",
            "track": track,
            "key": "id",
            "deadline": "due_at",
            "after": "10m",
            "open_when": "status = 'open'",
            "renotify": {"every": "1h", "max": 3},
            "columns": ["id", "due_at", "note"],
            "notify": ["hook"],
            "escalate": [{"from": 2, "severity": "critical", "notify": ["pager"]}],
            "resolve": True,
        }
    )


RULES = [rule(name) for name in TABLES]


@pytest.fixture
def other_dsn(server_dsn: str, dropper: Dropper) -> Iterator[str]:
    """A second empty database, for the other shape's run (dropped afterwards)."""
    with new_database(server_dsn, dropper) as d:
        yield d


@pytest.fixture
def receivers() -> Iterator[Callable[[], dict[str, Receiver]]]:
    """Makes a hook and a pager receiver per call; all closed afterwards."""
    made: list[Receiver] = []

    def make() -> dict[str, Receiver]:
        pair = {"hook": Receiver(), "pager": Receiver()}
        made.extend(pair.values())
        return pair

    yield make
    for r in made:
        r.close()


def setup(dsn: str, folder: Path, receivers: dict[str, Receiver]) -> Conn:
    """The tables (JOBS jobs each, due from T0 + 1 min on), migrated; the notifiers'
    files in ``folder``. An autocommit connection to the database."""
    conn = psycopg.connect(dsn, autocommit=True)
    for table, _ in TABLES.values():
        conn.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, status text NOT NULL,"
            " due_at timestamptz NOT NULL, note text)"
        )
        conn.execute(
            f"INSERT INTO {table} SELECT g, 'open', %s + g * interval '1 minute', 'job ' || g"
            " FROM generate_series(1, %s::int) g",
            (T0, JOBS),
        )
    migrate(conn, RULES)
    folder.mkdir()
    for name, receiver in receivers.items():
        (folder / f"{name}.yaml").write_text(
            f"type: webhook\nurl: {receiver.url}\ntimeout: 5s\nbatch: 4\n"
            "retry: {first: 5m, max: 10m, attempts: 20}\n"
        )
    return conn


@contextmanager
def running(dsn: str, folder: Path, clock: Clock, outbox: Outbox) -> Iterator[Runner]:
    runner = Runner(dsn, RULES, load_notifiers(folder), clock=clock, outbox=outbox)
    try:
        yield runner
    finally:
        runner.close()


def jobs(conn: Conn, change: str, *ids: int) -> None:
    """Apply ``change`` (a SET list) to jobs ``ids`` in both tables."""
    for table, _ in TABLES.values():
        conn.execute(f"UPDATE {table} SET {change} WHERE id = ANY(%s)", (list(ids),))


# The scenario: (minutes after T0, the change made before that step's once()).
# Jobs fall due at T0 + id min + 10 min. Job 2 gets a new deadline (episode 2);
# job 1 completes before its #2, job 3 after its #2; the rest run to the cap.
Step = tuple[int, str | None, tuple[int, ...]]
STEPS: list[Step] = [
    (20, None, ()),  # #1 of every job, to the hook
    (50, "status = 'done'", (1,)),  # job 1 resolved (hook)
    (51, "due_at = '2026-03-01 12:30:00+00'", (2,)),  # job 2: e1 resolved, e2 #1
    (85, None, ()),  # #2 of jobs 3..6 to the pager, critical
    (130, "status = 'done'", (3,)),  # job 3 resolved (hook, pager); #3 of 4..6; job 2 e2 #2
    (200, None, ()),  # job 2 e2 #3
    (240, "status = 'done'", (2, 4, 5, 6)),  # the rest resolved
    (300, None, ()),  # nothing
]


def run_steps(
    conn: Conn,
    runner: Runner,
    clock: MovedClock,
    steps: list[Step],
) -> None:
    for minutes, change, ids in steps:
        if change is not None:
            jobs(conn, change, *ids)
        clock.at = T0 + minutes * M
        result = runner.once()
        assert not result.errors, result.errors


def shapes(conn: Conn) -> Counter[str]:
    """Alerts of the rules written per shape of the outbox."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM slawatch.alert),"
        " (SELECT coalesce(sum(cardinality(keys)), 0) FROM slawatch.outbox_row)"
    ).fetchone()
    assert row is not None
    return Counter({"alerts": int(row[0]), "rows": int(row[1])})


def unsettled(conn: Conn) -> int:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM slawatch.delivery WHERE status <> 'sent')"
        " + (SELECT count(*) FROM slawatch.outbox_send WHERE status <> 'sent')"
    ).fetchone()
    return int(row[0]) if row else -1


def episodes(got: list[Alert]) -> dict[tuple[str, str, int], list[str]]:
    """The ids each episode (rule, key, episode) brought this receiver, in order."""
    out: dict[tuple[str, str, int], list[str]] = {}
    for alert in got:
        out.setdefault((alert["rule"], alert["key"], alert["episode"]), []).append(alert["id"])
    return out


def in_order(ids: list[str]) -> bool:
    """#1, #2, ... then the resolved notice, each once."""
    firing = [i for i in ids if not i.endswith(":resolved")]
    numbers = [int(i.rsplit(":n", 1)[1]) for i in firing]
    resolved = [i for i in ids if i.endswith(":resolved")]
    return numbers == sorted(set(numbers)) and len(resolved) <= 1 and ids == firing + resolved


def held_back(alerts: list[Alert]) -> bool:
    """The hook refuses a request with a firing notification of job 1 or 2 (503)."""
    return any(a["status"] == "firing" and a["key"] in ("1", "2") for a in alerts)


def scenario(
    dsn: str, folder: Path, pair: dict[str, Receiver], outbox: Outbox
) -> dict[str, list[Alert]]:
    """The scenario with SLAWATCH_OUTBOX=``outbox``: what each receiver got, in order.
    The hook refuses the first pages of jobs 1 and 2 until their episodes have ended."""
    conn = setup(dsn, folder, pair)
    try:
        clock = MovedClock(T0)
        # The first pages of jobs 1 and 2 wait to retry while their episodes end.
        pair["hook"].refuse = held_back
        with running(dsn, folder, clock, outbox) as runner:
            run_steps(conn, runner, clock, STEPS[:3])
            pair["hook"].refuse = None
            run_steps(conn, runner, clock, STEPS[3:])
        assert pair["hook"].refused >= 2
        assert unsettled(conn) == 0
        written = shapes(conn)
        assert written[outbox] > 0 and sum(written.values()) == written[outbox], written
    finally:
        conn.close()
    return {name: r.got for name, r in pair.items()}


# What the scenario pages per rule, to each notifier (ids without the rule).
EXPECTED = {
    "hook": {f"{k}:e1:n1" for k in range(1, 7)}
    | {"1:e1:resolved", "2:e1:resolved", "2:e2:n1", "2:e2:resolved"}
    | {f"{k}:e1:resolved" for k in (3, 4, 5, 6)},
    "pager": {f"{k}:e1:n{n}" for k in (3, 4, 5, 6) for n in (2, 3)} - {"3:e1:n3"}
    | {"2:e2:n2", "2:e2:n3", "2:e2:resolved"}
    | {f"{k}:e1:resolved" for k in (3, 4, 5, 6)},
}


def test_both_shapes_page_the_same_alerts_in_the_same_order(
    dsn: str, other_dsn: str, tmp_path: Path, receivers: Callable[[], dict[str, Receiver]]
) -> None:
    today = scenario(dsn, tmp_path / "alerts", receivers(), "alerts")
    rowed = scenario(other_dsn, tmp_path / "rows", receivers(), "rows")
    for notifier in ("hook", "pager"):
        ids = [a["id"] for a in today[notifier]]
        # The scenario's alerts, each once (nothing failed: no repeat either).
        assert Counter(ids) == Counter(f"{r}:{i}" for r in TABLES for i in EXPECTED[notifier])
        assert sorted(ids) == sorted(a["id"] for a in rowed[notifier])
        # Field for field, times included.
        assert {a["id"]: a for a in today[notifier]} == {a["id"]: a for a in rowed[notifier]}
        mine, theirs = episodes(today[notifier]), episodes(rowed[notifier])
        assert mine == theirs, notifier
        assert all(map(in_order, mine.values())), mine


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("alerts", "rows"),
        ("rows", "alerts"),
    ],
)
def test_the_setting_switched_with_episodes_open_pages_each_alert_once_in_order(
    dsn: str,
    tmp_path: Path,
    receivers: Callable[[], dict[str, Receiver]],
    first: Outbox,
    then: Outbox,
) -> None:
    """A Runner with SLAWATCH_OUTBOX=``first``, then (a restart) one with ``then``,
    episodes open across the switch. The hook refuses the first pages of jobs 1 and 2
    (503) from before the switch until after the resolved notices of their episodes
    were written in the other shape: each waits for its notification, then goes out
    after it; every alert once."""
    pair = receivers()
    folder = tmp_path / "notifiers"
    conn = setup(dsn, folder, pair)
    clock = MovedClock(T0)
    try:
        pair["hook"].refuse = held_back
        with running(dsn, folder, clock, first) as runner:
            run_steps(conn, runner, clock, STEPS[:1])
        with running(dsn, folder, clock, then) as runner:
            run_steps(conn, runner, clock, STEPS[1:3])  # job 1 done, job 2 moved
            refused = pair["hook"].refused
            pair["hook"].refuse = None
            run_steps(conn, runner, clock, STEPS[3:])
        assert refused >= 2  # before and after the switch
        assert unsettled(conn) == 0
        written = shapes(conn)
        assert written[first] > 0 and written[then] > 0, written
    finally:
        conn.close()
    for notifier, receiver in pair.items():
        ids = [a["id"] for a in receiver.got]
        assert Counter(ids) == Counter(f"{r}:{i}" for r in TABLES for i in EXPECTED[notifier])
        assert all(map(in_order, episodes(receiver.got).values())), episodes(receiver.got)


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_tracking_state_restored_from_a_backup_pages_no_first_notification_again(
    dsn: str, tmp_path: Path, receivers: Callable[[], dict[str, Receiver]], outbox: Outbox
) -> None:
    """Both rules' tracking state (the inline table's columns, the table rule's state
    table) restored from before their first pages: the next claims find the jobs due at
    #1 again. Today a unique index turns the copies away; with rows, the episode's row in
    the history does (docs/explanation/outbox-rows.md, "Alerted once")."""
    pair = receivers()
    folder = tmp_path / "notifiers"
    conn = setup(dsn, folder, pair)
    clock = MovedClock(T0)
    backups = {"jobs_a": "public.jobs_a", "state_b": "slawatch.late_table_state"}
    try:
        for name, table in backups.items():
            conn.execute(f"CREATE TABLE backup_{name} AS SELECT * FROM {table}")
        with running(dsn, folder, clock, outbox) as runner:
            run_steps(conn, runner, clock, STEPS[:1])
            assert len(pair["hook"].got) == 2 * JOBS
            for name, table in backups.items():
                conn.execute(f"DELETE FROM {table}")
                conn.execute(f"INSERT INTO {table} SELECT * FROM backup_{name}")
            run_steps(conn, runner, clock, [(21, None, ()), (22, None, ())])
        assert sum(shapes(conn).values()) == 2 * JOBS
        assert unsettled(conn) == 0
    finally:
        conn.close()
    ids = Counter(a["id"] for a in pair["hook"].got)
    assert ids == Counter(f"{r}:{k}:e1:n1" for r in TABLES for k in range(1, JOBS + 1))
