"""slawatch's own schema: numbered migrations, applied once each and recorded.

``sql/migrations/NNNN_name.sql`` files run in order, each in its own transaction
together with its row in ``slawatch.schema_version``, under an advisory lock: of two
migrators at once the second waits, then finds nothing left to do. A migration is
plain SQL written for the state the one before it left; nothing guesses.

A database made before versioning (slawatch's tables, no version recorded) is
recognised once, from the catalog. Such a database may be at any of the older shapes,
so it gets the previous release's self-upgrading script (``sql/legacy_upgrade.sql``,
frozen), which was their upgrade path and ends exactly where 0001 does; 0001 is
recorded as applied in the same transaction, and later migrations follow as usual.

``migrate --print`` shows the same changes as DO blocks that take the same lock and
check the same record, so a DBA's script can be run on a database in any state.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import LiteralString

from psycopg import sql

from slawatch.db import Connection, translate
from slawatch.engine.queries import legacy_upgrade_sql, migration_files, queries
from slawatch.errors import SlawatchError

log = logging.getLogger(__name__)

MIGRATE_LOCK = 0x534C4157  # advisory lock key: one migrate at a time
LOCK_RETRY = 0.2  # seconds between tries of the migrate lock while another migrate holds it
FOLDER = "slawatch/sql/migrations"
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9]+(?:_[a-z0-9]+)*)\.sql$")
_TAG = "$migration$"  # the printed DO blocks' quote: a migration must not contain it


@dataclass(frozen=True)
class Migration:
    """One file of ``sql/migrations``."""

    version: int
    name: str
    sql: LiteralString

    @property
    def filename(self) -> str:
        return f"{self.version:04d}_{self.name}.sql"


@dataclass(frozen=True)
class Change:
    """One transaction of the schema's upgrade: a migration, or (``legacy``) the
    previous release's upgrade script standing in for 0001 on a database made by it."""

    migration: Migration  # the version recorded when the change commits
    legacy: bool = False

    @property
    def sql(self) -> LiteralString:
        return legacy_upgrade_sql() if self.legacy else self.migration.sql

    @property
    def done(self) -> str:
        """What ``migrate`` reports once the change is applied."""
        if self.legacy:
            return (
                "slawatch's schema: upgraded from before versioned migrations"
                f" (legacy_upgrade.sql), recorded as {self.migration.filename}"
            )
        return f"slawatch's schema: applied {self.migration.filename}"


def parse_migrations(files: Mapping[str, LiteralString]) -> tuple[Migration, ...]:
    """The migrations in ``files`` (``{file name: text}``), in order.

    Raises SlawatchError for a file not named ``NNNN_name.sql``, two files of one
    number, or a gap in the numbers (0001, 0002, ... with none missing).
    """
    found: dict[int, Migration] = {}
    for filename in sorted(files):
        match = _FILE_NAME.match(filename)
        if match is None:
            raise SlawatchError(
                f"{FOLDER}/{filename}: not a migration's name"
                " (NNNN_name.sql: four digits, lower-case words, e.g. 0002_add_session.sql)"
            )
        version = int(match[1])
        if version == 0:
            raise SlawatchError(f"{FOLDER}/{filename}: numbers start at 0001")
        if version in found:
            raise SlawatchError(
                f"{FOLDER}: {found[version].filename} and {filename} have the same number"
            )
        if _TAG in files[filename]:
            raise SlawatchError(f"{FOLDER}/{filename}: contains {_TAG}, which --print needs")
        found[version] = Migration(version, match[2], files[filename])
    if not found:
        raise SlawatchError(f"{FOLDER}: no migrations (the package is incomplete)")
    for expected, version in enumerate(sorted(found), start=1):
        if version != expected:
            raise SlawatchError(
                f"{FOLDER}: {found[version].filename} follows a gap: {expected:04d} is missing"
                " (migrations are numbered 0001, 0002, ... in the order they apply)"
            )
    return tuple(found[v] for v in sorted(found))


@cache
def migrations() -> tuple[Migration, ...]:
    """slawatch's migrations, in order."""
    return parse_migrations(migration_files())


@dataclass(frozen=True)
class State:
    """What the catalog says about slawatch's schema."""

    recorded: frozenset[int]  # versions in slawatch.schema_version
    legacy: bool  # slawatch's tables are there, but no version is recorded


def read_state(conn: Connection) -> State:
    """The recorded versions, and whether this database was made before versioning."""
    q = queries()
    recorded: frozenset[int] = frozenset()
    if _one(conn, q["schema_versioned"]):
        recorded = frozenset(r[0] for r in conn.execute(q["schema_versions"]).fetchall())
    return State(recorded, legacy=not recorded and bool(_one(conn, q["schema_has_tables"])))


def _one(
    conn: Connection, query: LiteralString, params: Mapping[str, object] | None = None
) -> object:
    """The first column of the query's one row."""
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def changes(state: State) -> list[Change]:
    """What a database in ``state`` still needs, in order."""
    every = migrations()
    if state.legacy:
        return [Change(every[0], legacy=True), *(Change(m) for m in every[1:])]
    return [Change(m) for m in every if m.version not in state.recorded]


def pending(conn: Connection) -> list[Change]:
    """What ``migrate`` would apply to this database's schema; empty when it is current."""
    with translate("reading slawatch's schema version"):
        return changes(read_state(conn))


def current(conn: Connection) -> bool:
    """The latest migration is recorded (two cheap queries)."""
    q = queries()
    latest = {"version": migrations()[-1].version}
    with translate("reading slawatch's schema version"):
        return bool(
            _one(conn, q["schema_versioned"]) and _one(conn, q["schema_version_recorded"], latest)
        )


@contextmanager
def migrate_lock(conn: Connection) -> Iterator[None]:
    """One migrator at a time: the session's advisory lock MIGRATE_LOCK, held inside
    (re-entrant: ``migrate`` holds it throughout, and each change takes it again).

    Taken outside a transaction, and waited for between tries, not in
    pg_advisory_lock: a statement waiting there holds a snapshot, and the running
    migrate's CREATE INDEX CONCURRENTLY waits for every older snapshot to go, so each
    would wait for the other (PostgreSQL ends one: 'deadlock detected'). And a
    transaction begun once the lock is granted sees the catalog as the last holder
    left it, whereas one that waited for an advisory lock inside itself may still
    take a schema made meanwhile for absent (seen on PostgreSQL 15 in a session with
    temporary tables, which check() leaves: CREATE SCHEMA IF NOT EXISTS then fails).
    """
    q = queries()
    waiting = False
    while True:
        with translate("migrate: taking the migrate lock"):
            row = conn.execute(q["migrate_lock_try"], {"key": MIGRATE_LOCK}).fetchone()
        if row and row[0]:
            break
        if not waiting:
            log.info("another slawatch migrate is running; waiting for it to finish")
            waiting = True
        time.sleep(LOCK_RETRY)
    try:
        yield
    finally:
        with translate("migrate: releasing the migrate lock"):
            conn.execute(q["migrate_unlock"], {"key": MIGRATE_LOCK})


# How long a change waits for a table lock (slawatch's own tables are in use by
# running instances): failing beats queueing every instance's statements behind it.
LOCK_TIMEOUT = "5s"


def apply(conn: Connection, change: Change, now: datetime) -> bool:
    """Apply one change and record it, in one transaction under the migrate lock.

    Returns False, changing nothing, when another migrator applied it meanwhile.
    """
    q = queries()
    m = change.migration
    with migrate_lock(conn), translate(f"migrate: {change.done}"), conn.transaction():
        conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
        conn.execute(q["schema_version_create"])
        # Read again under the lock: what was planned may have been done since.
        if change not in changes(read_state(conn)):
            return False
        conn.execute(change.sql.encode())  # SQL text, no parameters: % is literal
        conn.execute(q["schema_version_record"], {"version": m.version, "name": m.name, "at": now})
    return True


def every_change() -> list[Change]:
    """What a script made without a database must offer: the legacy upgrade (it runs
    only on a database from before versioning), then every migration."""
    every = migrations()
    return [Change(every[0], legacy=True), *(Change(m) for m in every)]


def printed_bootstrap() -> str:
    """The record's table, as a printed script makes it before its first change."""
    return queries()["schema_version_create"]


def printed(change: Change) -> str:
    """``change`` as a DO block psql can run: it takes the migrate lock and does
    nothing when the change is no longer due, so the script is safe on a database
    in any state, run twice, or beside a running ``slawatch migrate``."""
    m = change.migration
    if change.legacy:
        # The same facts as read_state: slawatch's tables and no version recorded.
        has_tables = queries()["schema_has_tables"]
        guard = f"({has_tables})\n   AND NOT EXISTS (SELECT 1 FROM slawatch.schema_version)"
        title = (
            "-- legacy_upgrade.sql: only on a database made before versioned migrations;"
            f"\n-- it ends where {m.filename} does, and is recorded as it."
        )
    else:
        guard = f"NOT EXISTS (SELECT 1 FROM slawatch.schema_version WHERE version = {m.version})"
        title = f"-- {m.filename}, unless it is recorded"
    # applied_at is when the DBA ran it: the database's clock is the only one there,
    # and nothing compares this time with the application's.
    record = sql.SQL(
        "INSERT INTO slawatch.schema_version (version, name, applied_at) VALUES ({}, {}, now());"
    ).format(sql.Literal(m.version), sql.Literal(m.name))
    body = change.sql.rstrip()
    if not body.endswith(";"):
        body += ";"
    return (
        f"{title}\nDO {_TAG}\nBEGIN\nPERFORM pg_advisory_xact_lock({MIGRATE_LOCK});\n"
        f"IF {guard} THEN\n{body}\n{record.as_string(None)}\nEND IF;\nEND\n{_TAG};"
    )
