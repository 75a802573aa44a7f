"""What the database says about a watched table: kind, column types, unique keys."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from slawatch.db import Connection, describe, translate
from slawatch.rules import Rule

TIMESTAMP_TYPES = {"timestamp without time zone", "timestamp with time zone"}


@dataclass(frozen=True)
class Partition:
    """One partition of a partitioned table."""

    schema: str
    name: str
    is_leaf: bool
    level: int
    unique_columns: frozenset[str]


@dataclass(frozen=True)
class TableInfo:
    """A table as the catalog describes it."""

    schema: str
    name: str
    relkind: str
    columns: dict[str, str]  # name -> type, as format_type() prints it
    unique_columns: frozenset[str]  # columns with a single-column unique index
    not_null: frozenset[str]
    partitions: tuple[Partition, ...] = ()  # of a partitioned table, all levels


def inspect_table(conn: Connection, schema: str, name: str) -> TableInfo | None:
    """The table ``schema.name``, or None when there is no such relation."""
    with translate(f"reading the catalog for {schema}.{name}"):
        row = conn.execute(
            "SELECT c.oid, c.relkind FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s",
            (schema, name),
        ).fetchone()
        if row is None:
            return None
        oid, relkind = row
        attributes = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute"
            " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (oid,),
        ).fetchall()
        columns = {name: type_ for name, type_, _ in attributes}
        not_null = frozenset(name for name, _, notnull in attributes if notnull)
        unique = {
            r[0]
            for r in conn.execute(
                "SELECT a.attname FROM pg_index i"
                " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
                " WHERE i.indrelid = %s AND i.indisunique AND i.indnkeyatts = 1"
                " AND i.indpred IS NULL AND i.indexprs IS NULL",
                (oid,),
            ).fetchall()
        }
        partitions: tuple[Partition, ...] = ()
        if relkind == "p":
            rows = conn.execute(
                "SELECT n.nspname, c.relname, t.isleaf, t.level, ARRAY("
                "   SELECT a.attname FROM pg_index i"
                "   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
                "   WHERE i.indrelid = t.relid AND i.indisunique AND i.indnkeyatts = 1"
                "   AND i.indpred IS NULL AND i.indexprs IS NULL)"
                " FROM pg_partition_tree(%s) t JOIN pg_class c ON c.oid = t.relid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE t.level > 0 ORDER BY c.relname",
                (oid,),
            ).fetchall()
            partitions = tuple(
                Partition(s, n, leaf, level, frozenset(u)) for s, n, leaf, level, u in rows
            )
    return TableInfo(schema, name, relkind, columns, frozenset(unique), not_null, partitions)


def index_state(conn: Connection, schema: str, name: str) -> tuple[bool, str | None] | None:
    """(valid, comment) of index ``schema.name``, or None when there is none."""
    with translate(f"reading the catalog for index {schema}.{name}"):
        row = conn.execute(
            "SELECT i.indisvalid, obj_description(c.oid, 'pg_class') FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_index i ON i.indexrelid = c.oid"
            " WHERE n.nspname = %s AND c.relname = %s",
            (schema, name),
        ).fetchone()
    return None if row is None else (bool(row[0]), row[1])


def condition(rule: Rule) -> sql.SQL:
    """``open_when`` for a statement that has parameters: operator-authored SQL, checked
    by PostgreSQL; a literal ``%`` (a LIKE pattern) must not be taken for a placeholder."""
    return sql.SQL(rule.open_when.replace("%", "%%"))


def table_ident(rule: Rule) -> sql.Identifier:
    return sql.Identifier(rule.schema_name, rule.table_name)


def check_rule(conn: Connection, rule: Rule) -> tuple[TableInfo | None, list[str]]:
    """Check a rule against the database; returns the table and error lines."""
    where = rule.source
    info = inspect_table(conn, rule.schema_name, rule.table_name)
    if info is None:
        return None, [f"{where}: table: {rule.schema_name}.{rule.table_name} does not exist"]
    if info.relkind == "p" and any(not p.is_leaf or p.level > 1 for p in info.partitions):
        return info, [
            f"{where}: table: {rule.table} has sub-partitions; slawatch watches a table "
            "partitioned one level deep (or watch each sub-partitioned part with its own rule)"
        ]
    if info.relkind not in ("r", "p"):
        return info, [f"{where}: table: {rule.table} is not a table (a view or similar)"]
    errors = []

    def missing(field: str, column: str) -> None:
        known = ", ".join(c for c in info.columns if not c.startswith("sw_"))
        errors.append(f"{where}: {field}: column {column!r} not in {rule.table} ({known})")

    if rule.key not in info.columns:
        missing("key", rule.key)
    elif not _key_is_unique(rule.key, info):
        errors.append(
            f"{where}: key: column {rule.key!r} of {rule.table} has no unique index "
            "of its own; the key must identify one row"
        )
    elif rule.key not in info.not_null:
        errors.append(
            f"{where}: key: column {rule.key!r} of {rule.table} may be NULL; "
            "the key must be NOT NULL to identify a row"
        )
    if rule.deadline not in info.columns:
        missing("deadline", rule.deadline)
    elif info.columns[rule.deadline] not in TIMESTAMP_TYPES:
        errors.append(
            f"{where}: deadline: column {rule.deadline!r} is {info.columns[rule.deadline]}; "
            "it must be timestamp or timestamptz"
        )
    for column in rule.alert_columns:
        if column not in info.columns:
            missing("columns", column)
    if not errors:
        problem = check_condition(conn, rule)
        if problem:
            errors.append(f"{where}: open_when: {problem}")
    return info, errors


def _key_is_unique(key: str, info: TableInfo) -> bool:
    """A unique index on the key alone; on a partitioned table, on the parent or in each
    partition (then the key must also be unique across partitions, e.g. from one sequence)."""
    if key in info.unique_columns:
        return True
    return bool(info.partitions) and all(key in p.unique_columns for p in info.partitions)


def check_condition(conn: Connection, rule: Rule) -> str | None:
    """Why ``open_when`` cannot be a partial-index predicate on the table, or None.

    PostgreSQL judges it: on an empty temporary copy of the table (same name, so
    qualified references resolve) we build the partial index the rule will need,
    in a transaction that is always rolled back.
    """
    tmp = sql.Identifier(rule.table_name)
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(
                sql.SQL("CREATE TEMP TABLE {} (LIKE {}) ON COMMIT DROP").format(
                    tmp, table_ident(rule)
                )
            )
            probe = sql.SQL("CREATE INDEX ON pg_temp.{} ({})\nWHERE ({}\n)").format(
                tmp,
                sql.Identifier(rule.deadline),
                sql.SQL(rule.open_when),
            )
            # Parameters force the extended protocol, which refuses several statements.
            conn.execute(
                sql.SQL("SELECT %s FROM pg_temp.{} WHERE ({}\n)").format(
                    tmp,
                    condition(rule),
                ),
                (1,),
            )
            conn.execute(probe)
    except psycopg.Error as exc:  # the database's verdict is the answer we are after
        msg = describe(exc)
        if "IMMUTABLE" in msg:
            msg += " (open_when must not call now(), random() or other volatile functions)"
        return msg
    return None
