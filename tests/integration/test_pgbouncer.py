"""Behind PgBouncer in transaction mode: no duplicate sends, polling instead of LISTEN.

Each test runs Debian's ``pgbouncer`` itself (pool_mode=transaction, trust
auth) in front of a private server (tests/pgcluster.py). PgBouncer hands each
transaction to one of its server sessions in turn (``server_round_robin``), so
a statement psycopg prepared in one session is soon bound in another: the
``prepared statement "_pg3_0" does not exist`` that used to make a sent batch
fail to record and go out again.

Without pgbouncer these tests skip, unless SLAWATCH_REQUIRE_SERVICES=1 (CI).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest

from slawatch.config.notifiers import WebhookConfig
from slawatch.db import Database, Pooler
from slawatch.runtime.scheduler import Runner
from tests.integration.test_outage import late_rule, logged, orders, overdue, wait_for
from tests.pgcluster import PgCluster, free_port
from tests.receivers import WebhookReceiver, receiver

__all__ = ["receiver"]

SERVERS = 3  # server sessions per database: the round robin moves between them


def pgbouncer_binary() -> str:
    """The pgbouncer program; skip (or fail in CI) without it."""
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if found:
        return found
    message = "pgbouncer is not installed (apt-get install pgbouncer)"
    if os.environ.get("SLAWATCH_REQUIRE_SERVICES") == "1":
        pytest.fail(message + " and SLAWATCH_REQUIRE_SERVICES=1")
    pytest.skip(message)


class PgBouncer:
    """pgbouncer in transaction mode in front of ``cluster``, on a free port.

    pgbouncer refuses to run as root: then it runs as ``nobody``, with its
    config in a directory of its own that everyone may read.
    """

    def __init__(self, binary: str, cluster: PgCluster) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="slawatch-pgbouncer-"))
        self.dir.chmod(0o755)
        (self.dir / "userlist.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            f"""\
[databases]
* = host=127.0.0.1 port={cluster.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
pool_mode = transaction
default_pool_size = {SERVERS}
server_round_robin = 1
ignore_startup_parameters = extra_float_digits
"""
        )
        for f in self.dir.iterdir():
            f.chmod(0o644)
        self.log = self.dir / "pgbouncer.log"
        drop: dict[str, object] = {}
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            drop = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [binary, str(self.dir / "pgbouncer.ini")],
                stdout=out,
                stderr=subprocess.STDOUT,
                **drop,  # type: ignore[arg-type]
            )
        wait_for(self._ready, f"pgbouncer on port {self.port} ({self.log})", timeout=30)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"pgbouncer exited ({self.proc.returncode}):\n{self.log.read_text()}")
        try:
            psycopg.connect(self.dsn("postgres"), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def dsn(self, database: str) -> str:
        """``database`` of the cluster, through pgbouncer."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def warm(self, database: str) -> None:
        """Open all of ``database``'s server sessions now (otherwise they come on demand)."""
        with ExitStack() as stack:
            for _ in range(SERVERS):
                conn = stack.enter_context(psycopg.connect(self.dsn(database)))
                conn.execute("SELECT 1")  # a transaction holds its server session

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    with PgCluster() as c:
        yield c


@pytest.fixture(scope="module")
def bouncer(cluster: PgCluster) -> Iterator[PgBouncer]:
    b = PgBouncer(pgbouncer_binary(), cluster)
    try:
        yield b
    finally:
        b.stop()


def fresh_database(cluster: PgCluster, bouncer: PgBouncer) -> tuple[str, str]:
    """A new database: (direct DSN, DSN through pgbouncer), its server sessions open."""
    name = f"bounce_{uuid.uuid4().hex[:8]}"
    direct = cluster.database(name)
    bouncer.warm(name)
    return direct, bouncer.dsn(name)


def test_a_lost_prepared_statement_turns_them_off_and_the_work_runs_again(
    cluster: PgCluster, bouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    _, via = fresh_database(cluster, bouncer)
    with Database(via, size=1, timeout=5, pooler="none") as db:  # told: no pooler (wrong)
        # psycopg prepares a statement after 5 runs; the next run goes to another session.
        for i in range(15):
            assert db.run("counting", lambda c, i=i: c.execute("SELECT %s::int", (i,)).fetchone())
        assert not db.prepared_statements
    assert logged(caplog, "prepared statements turned off", logging.WARNING) == 1


def test_auto_finds_pgbouncer_in_between_and_prepares_nothing(
    cluster: PgCluster, bouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    """``auto`` prepares on a connection straight to the server, and through pgbouncer
    never (a statement prepared there would soon be bound in another server session)."""
    straight, via = fresh_database(cluster, bouncer)
    for dsn, prepares in ((straight, True), (via, False)):
        with Database(dsn, size=1, timeout=5, pooler="auto") as db:
            for i in range(15):
                row = db.run(
                    "counting", lambda c, i=i: c.execute("SELECT %s::int", (i,)).fetchone()
                )
                assert row == (i,)
            assert db.prepared_statements is prepares
    assert logged(caplog, "prepared statements turned off", logging.WARNING) == 0


@pytest.mark.parametrize("pooler", ["auto", "transaction"])
def test_claims_and_deliveries_through_pgbouncer_send_each_alert_once(
    cluster: PgCluster,
    bouncer: PgBouncer,
    receiver: WebhookReceiver,
    caplog: pytest.LogCaptureFixture,
    pooler: Pooler,
) -> None:
    """``auto`` (the default): no prepared statements (PgBouncer is found in between), and
    the LISTEN probe finds out;
    ``transaction``: SLAWATCH_POOLER says so."""
    caplog.set_level(logging.INFO)
    direct, via = fresh_database(cluster, bouncer)
    with psycopg.connect(direct, autocommit=True) as conn:
        orders(conn)  # DDL straight to the server; slawatch's work goes through pgbouncer
    overdue(direct, 1, 60)
    # 20 requests of 3 alerts; a batch sent twice would come again after the 4s lease.
    hook = WebhookConfig.model_validate(
        {"name": "hook", "type": "webhook", "url": receiver.url, "batch": 3, "timeout": "1s"}
    )
    runner = Runner(via, [late_rule()], [hook], timeout=5, pooler=pooler, poll=0.5)
    serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
    serving.start()
    try:

        def all_sent() -> bool:
            with psycopg.connect(direct) as conn:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'sent') FROM slawatch.delivery"
                ).fetchone()
            return bool(row and row[0] == 60)

        wait_for(all_sent, "all 60 deliveries to be sent", timeout=90)
        if pooler == "auto":
            wait_for(lambda: logged(caplog, "LISTEN does not reach") > 0, "the LISTEN line")
    finally:
        runner.stop()
        serving.join(60)
        runner.close()
    counts = Counter(receiver.alert_ids)
    assert logged(caplog, "prepared statements turned off", logging.WARNING) == 0
    assert len(counts) == 60
    assert {i: n for i, n in counts.items() if n > 1} == {}
    # No prepared statement ever reached another session: none were made.
    assert logged(caplog, "prepared statements turned off", logging.WARNING) == 0
    if pooler == "auto":
        assert (
            logged(
                caplog,
                "LISTEN does not reach this connection (transaction pooler?); polling every 0.5s",
                logging.WARNING,
            )
            == 1
        )
    else:
        assert logged(caplog, "SLAWATCH_POOLER=transaction: no LISTEN; polling every 0.5s") == 1
