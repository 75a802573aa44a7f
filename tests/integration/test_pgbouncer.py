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
import sys
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
from slawatch.config.rules import load_rules
from slawatch.config.settings import Outbox
from slawatch.db import PREPARING, Database, Pooler, connect
from slawatch.engine.migrate import migrate
from slawatch.runtime.scheduler import Runner
from tests.conftest import ROOT
from tests.integration.test_cli import clean_env
from tests.integration.test_deliver import shown_statuses
from tests.integration.test_outage import RULE, late_rule, logged, orders, overdue, wait_for
from tests.pgcluster import PgCluster, free_port
from tests.receivers import WebhookReceiver

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

    def __init__(self, binary: str, cluster: PgCluster, servers: int = SERVERS) -> None:
        self.port, self.servers = free_port(), servers
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
default_pool_size = {servers}
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
            for _ in range(self.servers):
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


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
@pytest.mark.parametrize("pooler", ["auto", "transaction"])
def test_claims_and_deliveries_through_pgbouncer_send_each_alert_once(
    cluster: PgCluster,
    bouncer: PgBouncer,
    receiver: WebhookReceiver,
    caplog: pytest.LogCaptureFixture,
    pooler: Pooler,
    outbox: Outbox,
) -> None:
    """``auto`` (the default): no prepared statements (PgBouncer is found in between), and
    the LISTEN probe finds out;
    ``transaction``: SLAWATCH_POOLER says so. With either shape of the outbox."""
    caplog.set_level(logging.INFO)
    direct, via = fresh_database(cluster, bouncer)
    with psycopg.connect(direct, autocommit=True) as conn:
        orders(conn)  # DDL straight to the server; slawatch's work goes through pgbouncer
    overdue(direct, 1, 60)
    # 20 requests of 3 alerts; a batch sent twice would come again after the 4s lease.
    hook = WebhookConfig.model_validate(
        {"name": "hook", "type": "webhook", "url": receiver.url, "batch": 3, "timeout": "1s"}
    )
    runner = Runner(via, [late_rule()], [hook], timeout=5, pooler=pooler, poll=0.5, outbox=outbox)
    serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
    serving.start()
    try:

        def all_sent() -> bool:
            with psycopg.connect(direct, autocommit=True) as conn:
                return shown_statuses(conn).get("sent") == 60

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


# Rules of one table: `slawatch status` reads each with the same statements, so psycopg's
# default would prepare them from the 6th run (and bind the name in another session).
RULES = 8
STATUS_AT_ONCE = 3


@pytest.mark.parametrize("pooler", ["auto", "transaction"])
def test_status_commands_at_once_beside_a_runner_prepare_nothing(
    cluster: PgCluster,
    bouncer: PgBouncer,
    receiver: WebhookReceiver,
    tmp_path: Path,
    pooler: Pooler,
) -> None:
    """One-shot commands' connections follow SLAWATCH_POOLER as the pools do: three
    ``slawatch status`` at once through pgbouncer, beside a ``run`` at work, all exit 0
    (their connections used to prepare from the 6th run whatever the setting:
    ``prepared statement "_pg3_0" already exists / does not exist``, exit 1)."""
    direct, via = fresh_database(cluster, bouncer)
    (tmp_path / "rules").mkdir()
    (tmp_path / "notifiers").mkdir()
    for i in range(RULES):
        (tmp_path / "rules" / f"late{i}.yaml").write_text(RULE)
    (tmp_path / "notifiers" / "hook.yaml").write_text(
        f"type: webhook\nurl: {receiver.url}\nbatch: 3\ntimeout: 1s\n"
    )
    rules = load_rules(tmp_path / "rules")
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at timestamptz)"
        )
        migrate(conn, rules)
    overdue(direct, 1, 10)
    hook = WebhookConfig.model_validate(
        {"name": "hook", "type": "webhook", "url": receiver.url, "batch": 3, "timeout": "1s"}
    )
    runner = Runner(via, rules, [hook], timeout=5, pooler=pooler, poll=0.5)
    serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
    serving.start()
    env = clean_env() | {
        "SLAWATCH_DSN": via,
        "SLAWATCH_POOLER": pooler,
        "SLAWATCH_RULES_DIR": str(tmp_path / "rules"),
        "SLAWATCH_NOTIFIERS_DIR": str(tmp_path / "notifiers"),
    }
    try:
        wait_for(lambda: len(receiver.alert_ids) > 0, "the runner to send through pgbouncer")
        statuses = [
            subprocess.Popen(
                [sys.executable, "-m", "slawatch", "status"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(STATUS_AT_ONCE)
        ]
        results = [(p.communicate(timeout=120), p.returncode) for p in statuses]
    finally:
        runner.stop()
        serving.join(60)
        runner.close()
    for (out, err), code in results:
        assert code == 0, err
        assert "prepared statement" not in err
        assert all(f"late{i}" in out for i in range(RULES)), out


def test_after_the_first_sign_of_a_pooler_no_connection_binds_another_clients_statement(
    cluster: PgCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """``SLAWATCH_POOLER=none`` in front of a transaction pooler (wrong). psycopg names
    every client's statements alike (``_pg3_0``, ...): through one server session, our
    first pool prepares ``_pg3_0``; another client empties the session and prepares its
    own ``_pg3_0`` (a text) there; our second pool meets it (``already exists``: the first
    sign). From then on nothing in the process binds a name: not the first pool's
    connection, held all along (it would run the other client's statement with its value:
    ``invalid byte sequence``, or another type back), nor a later checkout or a one-shot
    connection. One warning."""
    single = PgBouncer(pgbouncer_binary(), cluster, servers=1)
    try:
        _, via = fresh_database(cluster, single)
        with (
            Database(via, size=1, timeout=5, pooler="none", name="first") as first,
            Database(via, size=1, timeout=5, pooler="none", name="second") as second,
            psycopg.connect(via, autocommit=True) as other,
        ):
            mine = "SELECT %s::int"
            with first.connection("held") as held:
                assert held.execute(mine, (1,), prepare=True).fetchone() == (1,)
                other.execute("DEALLOCATE ALL")
                theirs = other.execute("SELECT %s::text", ("theirs",), prepare=True).fetchone()
                assert theirs == ("theirs",)
                other_pool = "SELECT %s::bigint"
                row = second.run(
                    "second", lambda c: c.execute(other_pool, (2,), prepare=True).fetchone()
                )
                assert row == (2,)
                assert held.execute(mine, (3,), prepare=True).fetchone() == (3,)
            assert first.run("again", lambda c: c.execute(mine, (4,)).fetchone()) == (4,)
            assert not first.prepared_statements and not second.prepared_statements
            with connect(via, pooler="none") as one_shot:
                assert one_shot.prepare_threshold is None
                assert one_shot.execute(mine, (5,), prepare=True).fetchone() == (5,)
            # The other client's statement is still there, never ours.
            assert other.execute("SELECT %s::text", ("still",)).fetchone() == ("still",)
    finally:
        single.stop()
    assert PREPARING.off
    assert logged(caplog, "prepared statements turned off", logging.WARNING) == 1


def test_an_idle_scan_through_pgbouncer_calls_the_rules_probe_function(
    cluster: PgCluster, bouncer: PgBouncer
) -> None:
    """Nothing is prepared through pgbouncer: each scan calls the rule's probe function
    (a short statement to plan), whose plan its server session keeps (engine/probefn.py),
    rather than sending the probe's text to be planned each time."""
    direct, via = fresh_database(cluster, bouncer)
    with psycopg.connect(direct, autocommit=True) as conn:
        orders(conn)  # migrate creates slawatch.late_probe
        # Counted per function in every session, those pgbouncer holds open too.
        conn.execute("ALTER SYSTEM SET track_functions = 'pl'")
        conn.execute("SELECT pg_reload_conf()")

    def calls() -> int:
        with psycopg.connect(direct, autocommit=True) as conn:
            row = conn.execute(
                "SELECT COALESCE(sum(calls), 0) FROM pg_stat_user_functions"
                " WHERE schemaname = 'slawatch' AND funcname = 'late_probe'"
            ).fetchone()
        return int(row[0]) if row else 0

    runner = Runner(via, [late_rule()], [], timeout=5, pooler="auto", poll=0.5)
    serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
    serving.start()
    try:
        wait_for(lambda: calls() >= 3, "three idle scans to call slawatch.late_probe")
    finally:
        runner.stop()
        serving.join(60)
        runner.close()
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET track_functions")
            conn.execute("SELECT pg_reload_conf()")
