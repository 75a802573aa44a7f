"""DDL from rules: slawatch's schema, tracking columns, partial indexes, GRANTs.

Idempotent: re-running changes nothing. When a rule's table, deadline or
``open_when`` changes, its partial indexes are rebuilt: each index carries a
fingerprint of its definition in its comment, and a mismatch (or an index left
INVALID by an interrupted ``CREATE INDEX CONCURRENTLY``) means rebuild.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from psycopg import sql

from slawatch.catalog import check_rule, index_state, table_ident
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
    """One partial index a rule needs."""

    name: str
    column: str
    predicate: str
    rule: Rule

    @property
    def fingerprint(self) -> str:
        text = f"{self.rule.table}|{self.column}|{self.predicate}"
        return "slawatch:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def create(self, if_not_exists: bool = False) -> sql.Composed:
        return sql.SQL("CREATE INDEX CONCURRENTLY {}{} ON {} ({})\n    WHERE {}").format(
            sql.SQL("IF NOT EXISTS " if if_not_exists else ""),
            sql.Identifier(self.name),
            table_ident(self.rule),
            sql.Identifier(self.column),
            sql.SQL(self.predicate),  # operator-authored, checked
        )

    def is_current(self, state: tuple[bool, str | None] | None) -> bool:
        """Whether an index in this ``state`` (see catalog.index_state) is this one, usable."""
        return state is not None and state[0] and state[1] == self.fingerprint

    def comment(self) -> sql.Composed:
        return sql.SQL("COMMENT ON INDEX {} IS {}").format(
            sql.Identifier(self.rule.schema_name, self.name), sql.Literal(self.fingerprint)
        )


def index_specs(rule: Rule) -> list[IndexSpec]:
    """The two partial indexes: never-notified rows by deadline; re-notify rows by time."""
    n, nxt = sql.Identifier(rule.n_column), sql.Identifier(rule.next_column)
    open_when = f"({rule.open_when})"
    first = f"{n.as_string(None)} = 0 AND {open_when}"
    again = f"{nxt.as_string(None)} IS NOT NULL AND {open_when}"
    return [
        IndexSpec(rule.first_index, rule.deadline, first, rule),
        IndexSpec(rule.again_index, rule.next_column, again, rule),
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
    out.append("-- Least privilege: what the role slawatch runs as needs (name yours).")
    out.append("-- migrate itself runs as the owner of the watched tables.")
    out.extend(g.as_string(None) + ";" for g in grants(rules))
    return "\n".join(out) + "\n"


def check(conn: Connection, rules: list[Rule]) -> None:
    """Check every rule against the database; raise one ConfigError listing all problems."""
    errors: list[str] = []
    for rule in rules:
        errors.extend(check_rule(conn, rule)[1])
    if errors:
        raise ConfigError("\n".join(errors))


def migrate(conn: Connection, rules: list[Rule]) -> list[str]:
    """Check, then bring the database in line with ``rules``; returns what was done.

    ``conn`` must be in autocommit mode (CREATE INDEX CONCURRENTLY needs it).
    Nothing is changed when any rule fails its check.
    """
    with translate("migrate"):
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK,))
    try:
        check(conn, rules)
        done: list[str] = []
        with translate("creating slawatch's schema"):
            conn.execute(schema_sql())  # no parameters: a script
        for rule in rules:
            done.extend(_migrate_rule(conn, rule))
        return done
    finally:
        with translate("migrate"):
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK,))


def _migrate_rule(conn: Connection, rule: Rule) -> list[str]:
    done = []
    with translate(f"{rule.source}: adding tracking columns to {rule.table}"):
        have = conn.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass"
            " AND attname IN (%s, %s) AND NOT attisdropped",
            (table_ident(rule).as_string(None), rule.n_column, rule.next_column),
        ).fetchone()
        if have is None or have[0] < 2:
            with conn.transaction():
                conn.execute(
                    sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT))
                )
                conn.execute(add_columns(rule))
            done.append(f"{rule.table}: added {rule.n_column}, {rule.next_column}")
    for spec in index_specs(rule):
        with translate(f"{rule.source}: building index {spec.name} on {rule.table}"):
            done.extend(_ensure_index(conn, spec))
    return done


def _ensure_index(conn: Connection, spec: IndexSpec) -> list[str]:
    state = index_state(conn, spec.rule.schema_name, spec.name)
    done = []
    if state is not None:
        if spec.is_current(state):
            return []
        why = "definition changed" if state[0] else "was left invalid"
        conn.execute(
            sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(
                sql.Identifier(spec.rule.schema_name, spec.name)
            )
        )
        done.append(f"{spec.rule.table}: dropped index {spec.name} ({why})")
    conn.execute(spec.create())
    conn.execute(spec.comment())
    done.append(f"{spec.rule.table}: built index {spec.name}")
    return done
