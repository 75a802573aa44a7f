"""DDL from rules: slawatch's schema, tracking columns, partial indexes, GRANTs.

Idempotent: re-running changes nothing. When a rule's table, deadline or
``open_when`` changes, its partial indexes are rebuilt: each index carries a
fingerprint of its definition in its comment, and a mismatch (or an index left
INVALID by an interrupted ``CREATE INDEX CONCURRENTLY``) means rebuild.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace

from psycopg import sql

from slawatch.catalog import Partition, TableInfo, check_rule, index_state, table_ident
from slawatch.db import Connection, translate
from slawatch.errors import ConfigError
from slawatch.queries import schema_sql
from slawatch.rules import Rule

log = logging.getLogger(__name__)

# ALTER TABLE needs a brief exclusive lock; never queue behind a long transaction
# (and block the application's queries behind us) for longer than this.
LOCK_TIMEOUT = "5s"
MIGRATE_LOCK = 0x534C4157  # advisory lock key: one migrate at a time


@dataclass(frozen=True)
class IndexSpec:
    """One partial index a rule needs, on its table or on one partition of it."""

    name: str
    schema: str  # of the table, and so of the index
    table: str
    column: str
    predicate: str
    fingerprint: str  # of the definition; kept in the index's comment

    def create(self, *, if_not_exists: bool = False, only: bool = False) -> sql.Composed:
        """CREATE INDEX CONCURRENTLY; with ``only``, the empty parent of a partitioned index."""
        return sql.SQL("CREATE INDEX {}{}{} ON {}{} ({})\n    WHERE {}").format(
            sql.SQL("" if only else "CONCURRENTLY "),
            sql.SQL("IF NOT EXISTS " if if_not_exists else ""),
            sql.Identifier(self.name),
            sql.SQL("ONLY " if only else ""),
            sql.Identifier(self.schema, self.table),
            sql.Identifier(self.column),
            sql.SQL(self.predicate),  # operator-authored, checked
        )

    def is_current(self, state: tuple[bool, str | None] | None) -> bool:
        """Whether an index in this ``state`` (see catalog.index_state) is this one, usable."""
        return state is not None and state[0] and state[1] == self.fingerprint

    def comment(self) -> sql.Composed:
        return sql.SQL("COMMENT ON INDEX {} IS {}").format(
            sql.Identifier(self.schema, self.name), sql.Literal(self.fingerprint)
        )

    def child(self, part: Partition) -> IndexSpec:
        """The same index on one partition; named from the partition, within 63 bytes."""
        tag = hashlib.sha256(f"{part.schema}.{part.name}".encode()).hexdigest()[:8]
        return replace(self, name=f"{self.name}_{tag}", schema=part.schema, table=part.name)


def index_specs(rule: Rule) -> list[IndexSpec]:
    """The two partial indexes: never-notified rows by deadline; re-notify rows by time."""
    n, nxt = sql.Identifier(rule.n_column), sql.Identifier(rule.next_column)
    open_when = f"({rule.open_when})"
    first = f"{n.as_string(None)} = 0 AND {open_when}"
    again = f"{nxt.as_string(None)} IS NOT NULL AND {open_when}"

    def spec(name: str, column: str, predicate: str) -> IndexSpec:
        text = f"{rule.table}|{column}|{predicate}"
        fingerprint = "slawatch:" + hashlib.sha256(text.encode()).hexdigest()[:16]
        return IndexSpec(name, rule.schema_name, rule.table_name, column, predicate, fingerprint)

    return [
        spec(rule.first_index, rule.deadline, first),
        spec(rule.again_index, rule.next_column, again),
    ]


def add_columns(rule: Rule) -> sql.Composed:
    return sql.SQL(
        "ALTER TABLE {}\n    ADD COLUMN IF NOT EXISTS {} integer NOT NULL DEFAULT 0,"
        "\n    ADD COLUMN IF NOT EXISTS {} timestamptz"
    ).format(table_ident(rule), sql.Identifier(rule.n_column), sql.Identifier(rule.next_column))


def grants(rules: list[Rule], role: str = "slawatch_app") -> list[sql.Composed]:
    """What a least-privilege role needs: read the watched tables, update only its columns."""
    r = sql.Identifier(role)
    out = [
        sql.SQL("GRANT USAGE ON SCHEMA slawatch TO {}").format(r),
        sql.SQL(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA slawatch TO {}"
        ).format(r),
    ]
    for schema in sorted({rule.schema_name for rule in rules}):
        out.append(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), r))
    for rule in rules:
        out.append(sql.SQL("GRANT SELECT ON {} TO {}").format(table_ident(rule), r))
        out.append(
            sql.SQL("GRANT UPDATE ({}, {}) ON {} TO {}").format(
                sql.Identifier(rule.n_column),
                sql.Identifier(rule.next_column),
                table_ident(rule),
                r,
            )
        )
    return out


def render(rules: list[Rule]) -> str:
    """The whole migration as a script a DBA can read and run (``migrate --print``)."""
    out = ["-- slawatch's own schema", schema_sql().strip(), ""]
    for rule in rules:
        out.append(f"-- rule {rule.name} ({rule.source}) on {rule.table}")
        out.append(add_columns(rule).as_string(None) + ";")
        for spec in index_specs(rule):
            out.append(spec.create(if_not_exists=True).as_string(None) + ";")
            out.append(spec.comment().as_string(None) + ";")
        out.append("")
    out.append(
        "-- On a partitioned table migrate builds each index ON ONLY the parent, then\n"
        "-- CONCURRENTLY in each partition, and attaches them (see slawatch/migrate.py)."
    )
    out.append("")
    out.append("-- Least privilege: what the role slawatch runs as needs (name yours).")
    out.append("-- migrate itself runs as the owner of the watched tables.")
    out.extend(g.as_string(None) + ";" for g in grants(rules))
    return "\n".join(out) + "\n"


def check(conn: Connection, rules: list[Rule]) -> dict[str, TableInfo]:
    """Check every rule against the database; raise one ConfigError listing all problems.

    Returns each rule's table as the catalog describes it.
    """
    errors: list[str] = []
    tables: dict[str, TableInfo] = {}
    for rule in rules:
        info, problems = check_rule(conn, rule)
        errors.extend(problems)
        if info is not None:
            tables[rule.name] = info
    if errors:
        raise ConfigError("\n".join(errors))
    return tables


def migrate(conn: Connection, rules: list[Rule]) -> list[str]:
    """Check, then bring the database in line with ``rules``; returns what was done.

    ``conn`` must be in autocommit mode (CREATE INDEX CONCURRENTLY needs it).
    Nothing is changed when any rule fails its check.
    """
    with translate("migrate"):
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK,))
    try:
        tables = check(conn, rules)
        done: list[str] = []
        with translate("creating slawatch's schema"):
            conn.execute(schema_sql())  # no parameters: a script
        for rule in rules:
            done.extend(_migrate_rule(conn, rule, tables[rule.name]))
        return done
    finally:
        with translate("migrate"):
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK,))


def _migrate_rule(conn: Connection, rule: Rule, info: TableInfo) -> list[str]:
    done = []
    if rule.n_column not in info.columns or rule.next_column not in info.columns:
        with translate(f"{rule.source}: adding tracking columns to {rule.table}"):
            _locked(conn, add_columns(rule))
        done.append(f"{rule.table}: added {rule.n_column}, {rule.next_column}")
    for spec in index_specs(rule):
        with translate(f"{rule.source}: building index {spec.name} on {rule.table}"):
            if info.relkind == "p":
                done.extend(_ensure_partitioned_index(conn, spec, info.partitions))
            else:
                done.extend(_ensure_index(conn, spec))
    return done


def _ensure_index(conn: Connection, spec: IndexSpec) -> list[str]:
    state = index_state(conn, spec.schema, spec.name)
    done = []
    if state is not None:
        if spec.is_current(state):
            return []
        why = "definition changed" if state[0] else "was left invalid"
        conn.execute(
            sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(
                sql.Identifier(spec.schema, spec.name)
            )
        )
        done.append(f"{spec.schema}.{spec.table}: dropped index {spec.name} ({why})")
    conn.execute(spec.create())
    conn.execute(spec.comment())
    done.append(f"{spec.schema}.{spec.table}: built index {spec.name}")
    return done


def _locked(conn: Connection, statement: sql.Composed) -> None:
    """Run a statement that takes a brief strong lock, without queueing behind long ones."""
    with conn.transaction():
        conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
        conn.execute(statement)


def _ensure_partitioned_index(
    conn: Connection, spec: IndexSpec, partitions: tuple[Partition, ...]
) -> list[str]:
    """A partitioned index without blocking writes: created ON ONLY the parent (empty and
    invalid), built CONCURRENTLY in each partition, attached; valid once all are attached.
    Partitions created later get their index from the parent. An interrupted run resumes.
    """
    done = []
    parent = sql.Identifier(spec.schema, spec.name)
    state = index_state(conn, spec.schema, spec.name)
    if spec.is_current(state):
        return []
    if state is not None and state[1] != spec.fingerprint:
        _locked(conn, sql.SQL("DROP INDEX IF EXISTS {}").format(parent))  # and its children
        done.append(f"{spec.schema}.{spec.table}: dropped index {spec.name} (definition changed)")
        state = None
    if state is None:
        _locked(conn, spec.create(only=True))
        conn.execute(spec.comment())
    for part in partitions:
        child = spec.child(part)
        cstate = index_state(conn, child.schema, child.name)
        if cstate is not None and not child.is_current(cstate):
            drop = sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}")
            conn.execute(drop.format(sql.Identifier(child.schema, child.name)))
            cstate = None
        if cstate is None:
            conn.execute(child.create())
            conn.execute(child.comment())
        attach = sql.SQL("ALTER INDEX {} ATTACH PARTITION {}")
        _locked(conn, attach.format(parent, sql.Identifier(child.schema, child.name)))
    done.append(
        f"{spec.schema}.{spec.table}: built index {spec.name} ({len(partitions)} partitions)"
    )
    return done
