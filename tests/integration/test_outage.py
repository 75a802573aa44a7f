"""Never quiet by accident: a database outage, a scan that raises, ``run --once`` failures.

The outage test stops a private server (tests/pgcluster.py) for longer than the
pool timeout while a Runner serves, starts it again, and sees deliveries resume:
the delivery workers, the scan job and the NOTIFY listener all outlive it, and
the log says so in one line each way.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg.conninfo import make_conninfo

from slawatch.clock import Clock
from slawatch.config.notifiers import WebhookConfig
from slawatch.config.rules import Rule
from slawatch.config.settings import Settings
from slawatch.engine.migrate import migrate
from slawatch.runtime.boot import start_admin
from slawatch.runtime.scheduler import Runner
from tests.integration.helpers import Conn, episodes
from tests.integration.test_cli import assert_one_line_error, slawatch
from tests.pgcluster import PgCluster, free_port
from tests.receivers import Reply, WebhookReceiver

TIMEOUT = 1.0  # seconds: the pool timeout of these tests (SLAWATCH_DB_TIMEOUT)

RULE = """\
table: public.orders
key: id
deadline: paid_at
after: 1h
every: 1s
open_when: "status = 'paid'"
notify: [hook]
"""


def late_rule() -> Rule:
    return Rule.model_validate(yaml.safe_load(RULE) | {"name": "late"})


def orders(conn: Conn) -> None:
    conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at timestamptz)")
    migrate(conn, [late_rule()])


def overdue(dsn: str, first: int, last: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO orders SELECT g, 'paid', now() - interval '1 day'"
            " FROM generate_series(%s::int, %s::int) g",
            (first, last),
        )


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 45) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def listening(dsn: str) -> bool:
    """Whether some session of the server is LISTENing for deliveries now."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN slawatch_delivery'"
            ).fetchone()
    except psycopg.OperationalError:
        return False
    return bool(row and row[0])


def logged(caplog: pytest.LogCaptureFixture, text: str, level: int = logging.INFO) -> int:
    return sum(1 for r in caplog.records if r.levelno >= level and text in r.getMessage())


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    with PgCluster() as c:
        yield c


def test_workers_outlive_a_database_outage_longer_than_the_pool_timeout(
    cluster: PgCluster, receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="slawatch")
    dsn = cluster.database(f"outage_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        orders(conn)
    hook = WebhookConfig.model_validate(
        {"name": "hook", "type": "webhook", "url": receiver.url, "timeout": "2s"}
    )
    # A short poll keeps the delivery worker asking for connections all through the outage.
    runner = Runner(dsn, [late_rule()], [hook], timeout=TIMEOUT, poll=0.5, backoff_cap=2.0)
    serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
    serving.start()
    try:
        wait_for(lambda: listening(dsn), "the listener's LISTEN")
        overdue(dsn, 1, 5)
        wait_for(lambda: len(set(receiver.alert_ids)) == 5, "the first 5 alerts")

        cluster.stop()
        stopped = time.monotonic()
        wait_for(lambda: logged(caplog, "database unreachable") > 0, "the outage line")
        # Down for longer than the pool timeout: requests for a connection time out
        # (the PoolTimeout that used to kill the delivery thread).
        wait_for(
            lambda: (
                time.monotonic() - stopped > 4 * TIMEOUT
                and logged(caplog, "no connection became available in time", logging.DEBUG) > 0
            ),
            "a pool timeout",
        )
        cluster.start()

        # The listener came back too (its NOTIFY wake-up is tested in test_crash.py).
        wait_for(lambda: listening(dsn), "the listener to LISTEN again")
        overdue(dsn, 6, 10)
        wait_for(lambda: len(set(receiver.alert_ids)) == 10, "the 5 alerts after the outage")
        wait_for(lambda: logged(caplog, "database reachable again") > 0, "the end-of-outage line")
    finally:
        runner.stop()
        serving.join(60)
        runner.close()
    assert not serving.is_alive()
    assert logged(caplog, "database unreachable") == 1
    assert logged(caplog, "database reachable again after") == 1
    # Nothing else complained: no worker, scan or listener trouble, no stray tracebacks.
    noise = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING
        and r.name.startswith("slawatch")
        and "database unreachable" not in r.getMessage()
    ]
    assert noise == []


@pytest.mark.parametrize("admin", [False, True], ids=["no-admin-api", "admin-api"])
def test_outages_shorter_than_the_pool_timeout_are_logged_once_each_way(
    cluster: PgCluster, caplog: pytest.LogCaptureFixture, admin: bool
) -> None:
    """Two outages, each shorter than the pool timeout (30 s: scans only wait for a
    connection, nothing fails) and longer than the threshold: one line each way for
    each, once the database has failed for UNREACHABLE_AFTER (5 s). Without the admin
    API (and no LISTEN connection either, behind a transaction pooler) from the
    runner's own look at the database; with it, its pools and readiness probe share
    the runner's record: still one line, not one per pool."""
    caplog.set_level(logging.INFO, logger="slawatch")
    dsn = cluster.database(f"short_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        orders(conn)
    runner = Runner(dsn, [late_rule()], [], timeout=30, pooler="transaction")
    server = None
    if admin:
        settings = Settings(http=f"127.0.0.1:{free_port()}", pooler="transaction")
        server = start_admin(settings, dsn, runner)
    serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
    serving.start()
    try:
        for outage in (1, 2):
            wait_for(
                lambda n=outage: logged(caplog, "database reachable again") == n - 1,
                "the database to be up",
            )
            cluster.stop()
            wait_for(
                lambda n=outage: logged(caplog, "database unreachable for") == n,
                f"the line of outage {outage}",
            )
            cluster.start()
            wait_for(
                lambda n=outage: logged(caplog, "database reachable again after") == n,
                f"the end of outage {outage}",
            )
    finally:
        if server is not None:
            server.stop()
        runner.stop()
        serving.join(60)
        runner.close()
    assert logged(caplog, "database unreachable", logging.ERROR) == 2
    assert logged(caplog, "database reachable again after") == 2


class FaultyClock(Clock):
    """A clock that raises (a stand-in for any bug in a scan) its first ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def now(self) -> datetime:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("clock broke")
        return super().now()


def test_a_scan_that_raises_is_logged_once_and_the_rule_is_scanned_again(
    conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under the real scheduler: our handling, not APScheduler's, and one line each way."""
    caplog.set_level(logging.INFO)
    orders(conn)
    overdue(dsn, 1, 3)
    # No notifiers: only the scan job uses the clock.
    runner = Runner(dsn, [late_rule()], [], clock=FaultyClock(2), backoff_cap=0.5)
    serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
    serving.start()
    try:

        def claimed() -> bool:
            return len(episodes(conn, "late")) == 3  # in either shape of the outbox

        wait_for(claimed, "the scan after two failed ones to claim the 3 rows")
        wait_for(lambda: logged(caplog, "rule late: scans working again") > 0, "recovery line")
    finally:
        runner.stop()
        serving.join(60)
        runner.close()
    (failing,) = [r for r in caplog.records if "rule late: scans failing" in r.getMessage()]
    assert failing.levelno == logging.ERROR
    assert "unexpected RuntimeError: clock broke" in failing.getMessage()
    assert failing.exc_info is not None  # the traceback of a bug is kept
    # APScheduler would log a traceback per failed run itself: it never saw one.
    assert [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("apscheduler") and r.levelno >= logging.WARNING
    ] == []


def config_dirs(tmp_path: Path, url: str) -> list[str]:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "late.yaml").write_text(RULE)
    (tmp_path / "notifiers").mkdir()
    (tmp_path / "notifiers" / "hook.yaml").write_text(f"type: webhook\nurl: {url}\ntimeout: 2s\n")
    return ["--rules", str(tmp_path / "rules"), "--notifiers", str(tmp_path / "notifiers")]


def test_run_once_exits_1_when_a_delivery_went_dead(
    conn: Conn, dsn: str, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    orders(conn)
    overdue(dsn, 1, 2)
    receiver.default = Reply(410)  # permanent: dead at once
    config = config_dirs(tmp_path, receiver.url)
    result = slawatch(*config, "run", "--once", dsn=dsn)
    assert_one_line_error(result, 1, "2 deliveries went dead")
    assert "HTTP 410" in result.stderr  # the log line of the dead deliveries says why
    # Nothing dead, nothing failed: exit 0.
    receiver.default = Reply(200)
    overdue(dsn, 3, 3)
    result = slawatch(*config, "run", "--once", dsn=dsn)
    assert result.returncode == 0, result.stderr


def test_run_once_exits_1_on_a_database_error(
    conn: Conn, dsn: str, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    orders(conn)
    overdue(dsn, 1, 2)
    impatient = make_conninfo(dsn, options="-c lock_timeout=300")
    with psycopg.connect(dsn) as blocker:  # holds the outbox (either shape) while slawatch runs
        blocker.execute("LOCK TABLE slawatch.alert, slawatch.outbox_row IN ACCESS EXCLUSIVE MODE")
        result = slawatch(*config_dirs(tmp_path, receiver.url), "run", "--once", dsn=impatient)
    assert_one_line_error(result, 1, "lock timeout")
    assert receiver.requests == []
