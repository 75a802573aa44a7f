"""What the database says about a watched table: kind, column types, unique keys."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from psycopg import sql

from slawatch.config.rules import OTHER_TABLE, OWN_SCHEMA, QUERY_TABLE, Rule, condition_columns
from slawatch.db import (
    LOCK_TIMEOUT,
    SET_LOCK_TIMEOUT,
    Connection,
    DatabaseUnavailable,
    describe,
    lock_not_had,
    translate,
)
from slawatch.engine.queries import queries
from slawatch.errors import ConfigError, DatabaseError

TIMESTAMP_TYPES = {"timestamp without time zone", "timestamp with time zone"}

# Each rule's answer from :func:`probe_table_indexes`: PostgreSQL's canonical definitions
# of its indexes, or why it refused them.
Probed = tuple[list[str], str | None]


@dataclass(frozen=True)
class Partition:
    """One partition of a partitioned table."""

    schema: str
    name: str
    is_leaf: bool
    level: int
    unique_keys: frozenset[frozenset[str]]


@dataclass(frozen=True)
class TableInfo:
    """A table as the catalog describes it."""

    schema: str
    name: str
    relkind: str
    columns: dict[str, str]  # name -> type, as format_type() prints it
    # Column sets of the plain unique indexes (no predicate, no expression).
    unique_keys: frozenset[frozenset[str]]
    not_null: frozenset[str]
    primary_key: tuple[str, ...] = ()
    partitions: tuple[Partition, ...] = ()  # of a partitioned table, all levels
    # The type of each rule's deadline expression (text as written) over this table.
    deadline_types: dict[str, str] = field(default_factory=dict)
    # The indexes of the rule this was read for, as PostgreSQL defines them: probed once
    # per command for all the rules of a table (migrate.with_probed_indexes); None: not yet.
    probed_indexes: Probed | None = field(default=None, compare=False)
    # Of :func:`rule_table` with ``wait=False``: a table was locked, so the type of the
    # rule's deadline expression (a query rule's columns) was not read: unknown, not wrong.
    locked: bool = False


def locked_problem(rule: Rule) -> str:
    """Why a rule's deadline expression has no type yet, or a query rule's query no
    columns: its table was locked (see :func:`with_deadline_type`, :func:`rule_table`);
    a state of the moment, not a fault of the rule's."""
    if rule.query is not None:
        return (
            f"a table rule {rule.name}'s query reads is locked; the query's columns were not"
            f" read within {LOCK_TIMEOUT} (an ALTER TABLE, LOCK TABLE, VACUUM FULL or the"
            " like holds the table): read again at the next look"
        )
    return (
        f"table {rule.table} is locked; the type of its deadline was not read within"
        f" {LOCK_TIMEOUT} (an ALTER TABLE, LOCK TABLE, VACUUM FULL or the like holds the"
        " table): read again at the next look"
    )


def deadline_type_of(rule: Rule, info: TableInfo) -> str:
    """The type of the rule's deadline values in ``info`` (of :func:`rule_table` or
    :func:`check_rule`). ConfigError when its column or expression is not there;
    DatabaseError when its table was locked (``info.locked``), so it is not known."""
    column = rule.deadline_column
    found = info.columns.get(column) if column else info.deadline_types.get(rule.deadline)
    if found is None and info.locked:
        raise DatabaseError(f"{rule.source}: deadline: {locked_problem(rule)}")
    if found is None:
        what = f"column {column!r}" if column else f"{rule.deadline_sql()}"
        raise ConfigError(f"{rule.source}: deadline: {what} is not a value of {rule.table}")
    return found


# The column sets of a relation's plain unique indexes.
_UNIQUE_KEYS = (
    "SELECT ARRAY(SELECT a.attname FROM unnest(i.indkey[0:i.indnkeyatts - 1]) AS k(attnum)"
    "             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum)"
    " FROM pg_index i WHERE i.indrelid = %s AND i.indisunique"
    " AND i.indpred IS NULL AND i.indexprs IS NULL"
)


def inspect_table(conn: Connection, schema: str, name: str) -> TableInfo | None:
    """The table ``schema.name``, or None when there is no such relation."""
    return inspect_tables(conn, [(schema, name)]).get((schema, name))


def _partitions(conn: Connection, oid: int) -> tuple[Partition, ...]:
    """The partitions of the partitioned table ``oid``, all levels, by name."""
    rows = conn.execute(
        "SELECT t.relid::oid, n.nspname, c.relname, t.isleaf, t.level"
        " FROM pg_partition_tree(%s) t JOIN pg_class c ON c.oid = t.relid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE t.level > 0 ORDER BY c.relname",
        (oid,),
    ).fetchall()
    return tuple(
        Partition(
            s,
            n,
            leaf,
            level,
            frozenset(frozenset(r[0]) for r in conn.execute(_UNIQUE_KEYS, (relid,))),
        )
        for relid, s, n, leaf, level in rows
    )


# Relations by (schema, name), with what TableInfo holds of each (:func:`inspect_tables`).
_TABLES = (
    "SELECT n.nspname, c.relname, c.relkind, c.oid,"
    " (SELECT json_agg(json_build_array(a.attname, format_type(a.atttypid, a.atttypmod),"
    "   a.attnotnull) ORDER BY a.attnum) FROM pg_attribute a"
    "   WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),"
    " (SELECT json_agg(ARRAY(SELECT a.attname FROM unnest(i.indkey[0:i.indnkeyatts - 1])"
    "   AS k(attnum) JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum))"
    "   FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique"
    "   AND i.indpred IS NULL AND i.indexprs IS NULL),"
    " (SELECT ARRAY(SELECT a.attname FROM unnest(i.indkey[0:i.indnkeyatts - 1])"
    "   WITH ORDINALITY AS k(attnum, ord)"
    "   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
    "   ORDER BY k.ord)"
    "   FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)"
    " FROM unnest(%s::text[], %s::text[]) w(s, t)"
    " JOIN pg_namespace n ON n.nspname = w.s"
    " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.t"
)


def inspect_tables(
    conn: Connection, names: list[tuple[str, str]]
) -> dict[tuple[str, str], TableInfo]:
    """Each ``(schema, name)`` that is a relation, as a TableInfo, in one statement (a
    partitioned table's partitions: a look-up of its own)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    found: dict[tuple[str, str], TableInfo] = {}
    with translate(
        f"reading the catalog for {wanted[0][0]}.{wanted[0][1]}"
        if len(wanted) == 1
        else "reading the catalog for the rules' tables"
    ):
        rows = conn.execute(_TABLES, ([s for s, _ in wanted], [t for _, t in wanted])).fetchall()
        for schema, name, relkind, oid, attributes, unique, pk in rows:
            attributes = attributes or []
            found[schema, name] = TableInfo(
                schema,
                name,
                relkind,
                {a: t for a, t, _ in attributes},
                frozenset(frozenset(k) for k in unique or []),
                frozenset(a for a, _, notnull in attributes if notnull),
                tuple(pk) if pk else (),
                _partitions(conn, oid) if relkind == "p" else (),
            )
    return found


def existing_indexes(conn: Connection, names: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of the indexes ``(schema, name)`` exist (one statement; see :func:`index_state`)."""
    wanted = sorted(set(names))
    if not wanted:
        return set()
    with translate("reading the catalog for the rules' indexes"):
        rows = conn.execute(
            "SELECT n.nspname, c.relname FROM unnest(%s::text[], %s::text[]) w(s, t)"
            " JOIN pg_namespace n ON n.nspname = w.s"
            " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.t"
            " JOIN pg_index i ON i.indexrelid = c.oid",
            ([s for s, _ in wanted], [t for _, t in wanted]),
        ).fetchall()
    return {(str(s), str(t)) for s, t in rows}


def inspect_query(conn: Connection, rule: Rule) -> TableInfo:
    """A query rule's output as a table: its columns and their types, from the
    description of ``SELECT * FROM (query) w LIMIT 0`` (planned, nothing read). It has
    no unique index: the rule's ``key`` says what identifies a row."""
    assert rule.query is not None
    with translate(f"reading the columns of rule {rule.name}'s query"):
        cur = conn.execute(sql.SQL("SELECT * FROM ({}) w LIMIT 0").format(sql.SQL(rule.query)))
        described = [(d.name, d.type_code) for d in cur.description or ()]
        rows = conn.execute(
            "SELECT format_type(t, NULL) FROM unnest(%s::oid[]) WITH ORDINALITY u(t, i) ORDER BY i",
            ([oid for _, oid in described],),
        ).fetchall()
    columns = {name: str(r[0]) for (name, _), r in zip(described, rows, strict=True)}
    return TableInfo("", QUERY_TABLE, "q", columns, frozenset(), frozenset())


def rule_table(conn: Connection, rule: Rule, *, wait: bool = True) -> TableInfo | None:
    """The rule's table, with the type of its deadline when that is an expression the
    database accepts (else unknown: :func:`deadline_type_of` says so). ``wait``: as in
    :func:`with_deadline_type`; a query rule's query is planned for its columns, which
    takes its tables' weakest lock too: with ``wait=False`` a lock not had within
    :data:`slawatch.db.LOCK_TIMEOUT` is a ``locked`` answer without columns."""
    if rule.query is not None:
        if wait:
            return inspect_query(conn, rule)
        try:
            with conn.transaction(force_rollback=True):
                conn.execute(SET_LOCK_TIMEOUT)
                return inspect_query(conn, rule)
        except DatabaseUnavailable:
            raise
        except DatabaseError as exc:
            if not lock_not_had(exc):
                raise
            return TableInfo("", QUERY_TABLE, "q", {}, frozenset(), frozenset(), locked=True)
    info = inspect_table(conn, rule.schema_name, rule.table_name)
    return with_deadline_type(conn, rule, info, wait=wait)


def with_deadline_type(
    conn: Connection, rule: Rule, info: TableInfo | None, *, wait: bool = True
) -> TableInfo | None:
    """:func:`rule_table` of a table rule whose table ``info`` was read already.

    An expression's type is had by planning a statement over the table, which takes
    its weakest lock: an ALTER TABLE, a LOCK TABLE or a VACUUM FULL holding the table
    makes it wait. ``wait=False`` (the on-call page, /v1/rules, ``slawatch status``,
    which must answer promptly): it waits at most :data:`slawatch.db.LOCK_TIMEOUT`,
    and a lock not had within it is ``locked`` in the answer, said as such
    (:func:`locked_problem`), never as a deadline that is not a value of the table.
    ``wait=True`` (``run``'s plans, ``run --once --dry-run``, ``report``, the
    give-up of old episodes): waits for the lock, as they need the type to go on.
    Any other refusal leaves the type unknown (``check`` says why)."""
    if info is None or rule.deadline_column is not None:
        return info
    if any(c not in info.columns for c in rule.deadline_columns):
        return info
    try:
        with conn.transaction(force_rollback=True):
            if not wait:
                conn.execute(SET_LOCK_TIMEOUT)
            type_ = deadline_type(conn, rule, info)
    except DatabaseUnavailable:
        raise
    except DatabaseError as exc:
        return replace(info, locked=True) if lock_not_had(exc) else info
    return info if type_ is None else replace(info, deadline_types={rule.deadline: type_})


@dataclass(frozen=True)
class IndexState:
    """An index as the catalog has it."""

    valid: bool
    table: tuple[str, str]  # (schema, name) of the table it is on
    definition: str  # pg_get_indexdef from "USING" on: method, columns, predicate


def index_state(conn: Connection, schema: str, name: str) -> IndexState | None:
    """Index ``schema.name`` as it is, or None when there is none."""
    with translate(f"reading the catalog for index {schema}.{name}"):
        row = conn.execute(
            "SELECT i.indisvalid, tn.nspname, t.relname, pg_get_indexdef(c.oid)"
            " FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_index i ON i.indexrelid = c.oid"
            " JOIN pg_class t ON t.oid = i.indrelid"
            " JOIN pg_namespace tn ON tn.oid = t.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s",
            (schema, name),
        ).fetchone()
    if row is None:
        return None
    return IndexState(bool(row[0]), (row[1], row[2]), definition_tail(row[3]))


def definition_tail(indexdef: str) -> str:
    """What defines an index, without its name and table: ``USING btree (...) WHERE ...``."""
    at = indexdef.find(" USING ")
    return indexdef[at + 1 :] if at >= 0 else indexdef


def condition(rule: Rule) -> sql.SQL:
    """``open_when`` for a statement that has parameters: operator-authored SQL, checked
    by PostgreSQL; a literal ``%`` (a LIKE pattern) must not be taken for a placeholder."""
    return sql.SQL(rule.open_when.replace("%", "%%"))


def table_ident(rule: Rule) -> sql.Composable:
    """What the rule reads rows from: its table, or its query in parentheses (a
    subquery, aliased where it is used; ``%`` doubled for statements with parameters)."""
    if rule.query is not None:
        return sql.SQL("({})").format(sql.SQL(rule.query.replace("%", "%%")))
    return sql.Identifier(rule.schema_name, rule.table_name)


def _check_query(conn: Connection, rule: Rule) -> tuple[TableInfo | None, list[str]]:
    """:func:`check_rule` of a query rule: the query runs (planned, nothing read) for
    the role that checks, and names the rule's key, deadline and columns."""
    where = rule.source
    try:
        with conn.transaction(force_rollback=True):
            info = inspect_query(conn, rule)
            with translate(f"rule {rule.name}: the functions its query calls"):
                errors = [f"{where}: query: {e}" for e in _refused_reads(conn, rule)]
    except DatabaseUnavailable:
        raise
    except DatabaseError as exc:
        return None, [f"{where}: query: {describe(exc.__cause__ or exc)}"]
    known = ", ".join(info.columns)

    def missing(field: str, column: str) -> None:
        errors.append(f"{where}: {field}: column {column!r} not in the query's output ({known})")

    key = key_columns(rule, info)
    for column in key:
        if column not in info.columns:
            missing("key", column)
    if rule.deadline not in info.columns:
        missing("deadline", rule.deadline)
    elif info.columns[rule.deadline] not in TIMESTAMP_TYPES:
        errors.append(
            f"{where}: deadline: column {rule.deadline!r} is {info.columns[rule.deadline]}; "
            "it must be timestamp or timestamptz"
        )
    for column in rule.alert_columns(key):
        if column not in info.columns and column != rule.deadline:
            missing("columns", column)
    for column in sorted(condition_columns(rule.open_when)):
        if column not in info.columns:
            missing("open_when", column)
    return info, errors


# PostgreSQL's own VOLATILE functions a query rule may call: they write nothing.
_PLAIN_VOLATILE = ["random", "clock_timestamp", "timeofday", "gen_random_uuid"]


def _refused_reads(conn: Connection, rule: Rule) -> list[str]:
    """Why a query rule's query may not run at every sweep, as the server resolves its
    names (the search path included): each VOLATILE function it calls, the only kind
    PostgreSQL lets write, the database's or PostgreSQL's own (but _PLAIN_VOLATILE);
    each function of slawatch's own schema; each table or view it reads in a schema of
    the system catalogs or slawatch's own. PostgreSQL analyses the query in a temporary
    view (the caller rolls it back), whose stored query names every function and
    operator it calls; so do the stored queries of the views it reads, and of the views
    those read (a view's SELECT runs its calls as the query's would). What it reads is
    the probe view's own dependencies (a view it reads reads with its owner's rights)."""
    assert rule.query is not None
    conn.execute(sql.SQL("CREATE TEMP VIEW slawatch_query_probe AS {}").format(sql.SQL(rule.query)))
    actions = conn.execute(_VIEWS_READ).fetchall()
    calls = [c for (action,) in actions for c in _CALLS.findall(str(action))]
    oids = [int(f) for f, _, _ in calls if f] + [int(fn) for _, _, fn in calls if fn]
    found = conn.execute(
        "SELECT p.oid::regprocedure::text, n.nspname FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE p.oid = ANY(%s) AND (n.nspname = %s OR p.provolatile = 'v'"
        " AND NOT (n.nspname = 'pg_catalog' AND p.proname = ANY(%s)))"
        " ORDER BY 1",
        (oids, OWN_SCHEMA, _PLAIN_VOLATILE),
    ).fetchall()
    errors = []
    for name, schema in found:
        if schema == OWN_SCHEMA:
            # Qualified: found through the search path, regprocedure leaves it bare.
            name = name if name.startswith(f"{OWN_SCHEMA}.") else f"{OWN_SCHEMA}.{name}"
            errors.append(
                f"calls {name}, slawatch's own function: a query rule reads the application's"
                " tables"
            )
        else:
            whose = "PostgreSQL's" if schema == "pg_catalog" else "the database's"
            errors.append(
                f"calls {name}, a VOLATILE function of {whose}: a query rule only reads, at"
                " every sweep (a function that only reads can be declared STABLE)"
            )
    read = conn.execute(_SYSTEM_READ, (OWN_SCHEMA,)).fetchall()
    for name, schema in read:
        what = "slawatch's own table" if schema == OWN_SCHEMA else "a system catalog"
        errors.append(f"reads {name}, {what}: a query rule reads the application's tables")
    return errors


def check_rule(conn: Connection, rule: Rule) -> tuple[TableInfo | None, list[str]]:
    """Check a rule against the database; returns the table and error lines."""
    if rule.query is not None:
        return _check_query(conn, rule)
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
        hint = ""
        if info.relkind in ("v", "m"):
            # A view has no index to claim through: a query rule reads it as written.
            hint = f"; watch it with track: table and query: SELECT * FROM {rule.table}"
        return info, [f"{where}: table: {rule.table} is not a table (a view or similar){hint}"]
    errors = []
    columns = info.columns

    def missing(field: str, column: str) -> None:
        known = ", ".join(c for c in columns if not c.startswith("sw_"))
        errors.append(f"{where}: {field}: column {column!r} not in {rule.table} ({known})")

    key = key_columns(rule, info)
    absent = [c for c in key if c not in info.columns]
    for column in absent:
        missing("key", column)
    named = ", ".join(key)
    if not key:
        errors.append(
            f"{where}: key: {rule.table} has no primary key; "
            "name the column(s) that identify a row (key: id, or key: [id, created])"
        )
    elif not absent and not _key_is_unique(key, info):
        hint = ""
        if info.partitions:
            hint = " (on a partitioned table, a unique index of the parent: add the partition key)"
        errors.append(
            f"{where}: key: ({named}) of {rule.table} has no unique index on those "
            f"columns; the key must identify one row{hint}"
        )
    elif not absent and any(c not in info.not_null for c in key):
        nullable = next(c for c in key if c not in info.not_null)
        errors.append(
            f"{where}: key: column {nullable!r} of {rule.table} may be NULL; "
            "the key must be NOT NULL to identify a row"
        )
    if rule.deadline_column is None:
        type_, problems = _check_deadline_expression(conn, rule, info)
        errors += problems
        if type_ is not None:
            info = replace(info, deadline_types={rule.deadline: type_})
    elif rule.deadline not in info.columns:
        missing("deadline", rule.deadline)
    elif info.columns[rule.deadline] not in TIMESTAMP_TYPES:
        errors.append(
            f"{where}: deadline: column {rule.deadline!r} is {info.columns[rule.deadline]}; "
            "it must be timestamp or timestamptz"
        )
    # The default columns include the deadline's: those were reported above.
    reported = set(rule.deadline_columns) if rule.columns is None else set()
    for column in rule.alert_columns(key):
        if column not in info.columns and column not in reported:
            missing("columns", column)
    return info, errors


def deadline_type(conn: Connection, rule: Rule, info: TableInfo) -> str | None:
    """The type of the rule's deadline values (``format_type``), None when its column is
    not in the table. An expression's type is the database's answer: the description
    of ``SELECT <deadline> FROM <table> LIMIT 0`` (nothing is read)."""
    column = rule.deadline_column
    if column is not None:
        return info.columns.get(column)
    with translate(f"reading the type of rule {rule.name}'s deadline"):
        cur = conn.execute(
            sql.SQL("SELECT {} FROM {} LIMIT 0").format(
                sql.SQL(rule.deadline_sql()), table_ident(rule)
            )
        )
        assert cur.description is not None
        row = conn.execute(
            "SELECT format_type(%s, NULL)", (cur.description[0].type_code,)
        ).fetchone()
    return str(row[0]) if row else None


# In a view's stored query (pg_node_tree text): each function an expression calls,
# and each operator with the function behind it.
_CALLS = re.compile(r":funcid (\d+)|:opno (\d+) :opfuncid (\d+)")
# The stored queries of the probe view and of every view it reads, at any depth: each
# view's rewrite rule depends (pg_depend) on the relations its query reads.
_VIEWS_READ = """\
WITH RECURSIVE views(oid) AS (
    SELECT 'pg_temp.slawatch_query_probe'::regclass::oid
    UNION
    SELECT d.refobjid FROM views v
      JOIN pg_rewrite r ON r.ev_class = v.oid
      JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
                      AND d.refclassid = 'pg_class'::regclass
      JOIN pg_class c ON c.oid = d.refobjid AND c.relkind = 'v'
)
SELECT r.ev_action::text FROM pg_rewrite r JOIN views v ON r.ev_class = v.oid"""
# The tables and views the probe view reads (its rewrite rule's dependencies) in a schema
# of the system catalogs or slawatch's own (%s): with their schema, as the server
# resolved each name.
_SYSTEM_READ = """\
SELECT DISTINCT quote_ident(n.nspname) || '.' || quote_ident(c.relname), n.nspname
  FROM pg_rewrite r
  JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
                  AND d.refclassid = 'pg_class'::regclass
  JOIN pg_class c ON c.oid = d.refobjid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE r.ev_class = 'pg_temp.slawatch_query_probe'::regclass AND c.oid <> r.ev_class
   AND (n.nspname IN (%s, 'information_schema') OR n.nspname LIKE 'pg\\_%%'
        AND n.nspname NOT LIKE 'pg\\_temp\\_%%')
 ORDER BY 1"""
_NOT_ONE_ROW = ("hasAggs", "hasWindowFuncs", "hasTargetSRFs")
_VOLATILITY = {"s": "STABLE", "v": "VOLATILE"}


def _check_deadline_expression(
    conn: Connection, rule: Rule, info: TableInfo
) -> tuple[str | None, list[str]]:
    """The type of a deadline expression, and error lines: columns not in the table, a type that is
    not a timestamp, and functions or operators that are not IMMUTABLE (an index
    expression must be). PostgreSQL analyses the expression in a temporary view
    (rolled back); the view's stored query names every function it calls."""
    where = f"{rule.source}: deadline"
    absent = [c for c in rule.deadline_columns if c not in info.columns]
    if absent:
        known = ", ".join(c for c in info.columns if not c.startswith("sw_"))
        return None, [
            f"{where}: column {c!r} not in {rule.table} ({known}); {OTHER_TABLE}" for c in absent
        ]
    try:
        with translate("probing the deadline"), conn.transaction(force_rollback=True):
            view = "CREATE TEMP VIEW slawatch_deadline_probe AS SELECT {} AS d FROM {}"
            conn.execute(sql.SQL(view).format(sql.SQL(rule.deadline_sql()), table_ident(rule)))
            row = conn.execute(
                "SELECT format_type(a.atttypid, a.atttypmod), r.ev_action::text"
                " FROM pg_attribute a JOIN pg_rewrite r ON r.ev_class = a.attrelid"
                " WHERE a.attrelid = 'pg_temp.slawatch_deadline_probe'::regclass"
                " AND a.attname = 'd'"
            ).fetchone()
            assert row is not None
            type_, tree = row
            # One row's value: the view's query has no aggregate, window or set-returning call.
            if any(f":{flag} true" in tree for flag in _NOT_ONE_ROW):
                return None, [
                    f"{where}: must be one row's value: no aggregate, window or"
                    " set-returning function"
                ]
            calls = _CALLS.findall(tree)
            funcs = [int(f) for f, _, _ in calls if f]
            ops = {int(fn): int(op) for _, op, fn in calls if op}
            unsafe = conn.execute(
                "SELECT p.oid, p.oid::regprocedure::text, p.provolatile FROM pg_proc p"
                " WHERE p.oid = ANY(%s) AND p.provolatile <> 'i' ORDER BY p.oid",
                ([*funcs, *ops],),
            ).fetchall()
            names = {
                fn: str(conn.execute("SELECT %s::regoperator::text", (op,)).fetchone()[0])  # type: ignore[index]
                for fn, op in ops.items()
            }
            if not unsafe and type_ in TIMESTAMP_TYPES:
                # What the stored query does not name (a cast through text calls the
                # type's input function): PostgreSQL's own verdict, on an empty copy.
                conn.execute(
                    sql.SQL("CREATE TEMP TABLE slawatch_deadline_copy ({})").format(
                        sql.SQL(", ").join(
                            sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))
                            for c, t in info.columns.items()
                        )
                    )
                )
                conn.execute(
                    sql.SQL("CREATE INDEX ON slawatch_deadline_copy ({})").format(
                        sql.SQL(rule.deadline_sql())
                    )
                )
    except DatabaseUnavailable:
        raise
    except DatabaseError as exc:
        return None, [f"{where}: {describe(exc.__cause__ or exc)}"]
    errors = []
    if type_ not in TIMESTAMP_TYPES:
        errors.append(
            f"{where}: {rule.deadline_sql()} is {type_}; it must be timestamp or timestamptz"
        )
    for oid, name, volatility in unsafe:
        what = f"operator {names[oid]}" if oid in names else f"function {name}"
        fix = "keep the deadline in a column a trigger keeps"
        if volatility == "s" and "with time zone" in (names.get(oid) or name):
            # timestamptz + interval: the day's length depends on the session's TimeZone.
            fix = (
                "compute it in a fixed zone, e.g. (created_at AT TIME ZONE 'UTC') + interval"
                " '2 days' (a timestamp, in the rule's timezone), or keep it in a column"
                " a trigger keeps"
            )
        errors.append(
            f"{where}: {what} is {_VOLATILITY.get(volatility, volatility)}, and an index"
            f" expression must be IMMUTABLE: {fix}"
        )
    return type_, errors


def key_columns(rule: Rule, info: TableInfo) -> list[str]:
    """The columns that identify a row: the rule's ``key``, else the primary key."""
    return list(rule.key) if rule.key is not None else list(info.primary_key)


def _key_is_unique(key: list[str], info: TableInfo) -> bool:
    """A unique index on the key's columns (or some of them) on the table itself. On a
    partitioned table that is an index of the parent, so it includes the partition key:
    a key unique only within each partition (per-tenant ids) could name two rows."""
    columns = frozenset(key)
    return any(u <= columns for u in info.unique_keys)


@dataclass(frozen=True)
class IndexProbe:
    """One rule's part of :func:`probe_table_indexes` (the arguments of :func:`probe_indexes`)."""

    rule: Rule
    tracking: dict[str, str]
    indexes: list[tuple[str, str]]


def probe_indexes(
    conn: Connection,
    rule: Rule,
    columns: dict[str, str],
    tracking: dict[str, str],
    indexes: list[tuple[str, str]],
) -> Probed:
    """Build the rule's partial indexes on an empty copy of its table; PostgreSQL's
    canonical definitions of them, or why it refused.

    ``columns`` are the table's columns with their types (from the catalog, so a role
    that may read only some columns can probe too); ``tracking`` is the tracking
    columns with their types, added to the copy where the table lacks them;
    ``indexes`` is (key, predicate) of each index, as SQL text (a quoted column, or
    an expression in parentheses; an empty predicate: every row). The copy is a temporary table
    of the same name (so qualified references resolve) in a transaction that is
    always rolled back; comparing these definitions with those in the catalog tells
    whether an index is the one the rule needs.
    """
    return probe_table_indexes(conn, columns, [IndexProbe(rule, tracking, indexes)])[0]


def probe_table_indexes(
    conn: Connection, columns: dict[str, str], probes: list[IndexProbe]
) -> list[Probed]:
    """:func:`probe_indexes` of several rules of one table (one ``table_name``, these
    ``columns``), each rule's answer in turn: one empty copy of the table for all of
    them, in one transaction, and their definitions read in one query: a copy costs
    tens of milliseconds, and a table may have many rules.

    Each rule's statements run in a savepoint, so that a rule PostgreSQL refuses gets
    its own answer and the others theirs. Its condition is tried first on the copy as
    its rule alone would have it: the other rules' tracking columns must not make a
    name in open_when resolve. A condition that reads the table's columns reads them
    with its own rule's tracking columns too, so those are added (and rolled back) only
    to try again one the table alone refuses. Then the tracking columns of every rule
    whose condition passed, in one ALTER TABLE (each costs as much as a copy; tracking
    columns are named after their rule: no two rules share one), and each rule's
    indexes; where that ALTER fails, each rule adds its own, for its own error.
    """
    tmp = sql.Identifier("pg_temp", probes[0].rule.table_name)
    refused: dict[int, str] = {}
    names = [
        [f"slawatch_probe_{n}_{i}" for i in range(len(p.indexes))] for n, p in enumerate(probes)
    ]
    together = True  # every rule's tracking columns are on the copy

    def add(tracking: dict[str, str]) -> None:
        if tracking:
            # The copy is empty: (re)adding a column gives it the wanted type.
            conn.execute(
                sql.SQL("ALTER TABLE {} {}").format(
                    tmp,
                    sql.SQL(", ").join(
                        sql.SQL("DROP COLUMN IF EXISTS {}, ADD COLUMN {} {}").format(
                            sql.Identifier(column), sql.Identifier(column), sql.SQL(type_)
                        )
                        for column, type_ in tracking.items()
                    ),
                )
            )

    def condition_alone(n: int) -> None:
        # Parameters force the extended protocol, which refuses several statements,
        # and prove that a literal % in the condition survives parameter substitution.
        conn.execute(
            sql.SQL("SELECT %s FROM {} WHERE ({}\n)").format(tmp, condition(probes[n].rule)),
            (1,),
        )

    def condition_tracked(n: int) -> None:
        add(probes[n].tracking)
        condition_alone(n)

    def build(n: int) -> None:
        if not together:
            add(probes[n].tracking)
        for name, (column, predicate) in zip(names[n], probes[n].indexes, strict=True):
            where = sql.SQL("\nWHERE {}").format(sql.SQL(predicate)) if predicate else sql.SQL("")
            conn.execute(
                sql.SQL("CREATE INDEX {} ON {} ({}){}").format(
                    sql.Identifier(name), tmp, sql.SQL(column), where
                )
            )

    def each(work: Callable[[int], None], n: int, *, keep: bool) -> None:
        """``work`` for probe ``n`` in a savepoint; an error is its rule's answer."""
        try:
            with translate("probing open_when"), conn.transaction(force_rollback=not keep):
                work(n)
        except DatabaseUnavailable:
            raise
        except DatabaseError as exc:  # the database's verdict is the answer we are after
            refused[n] = _refusal(exc)

    try:
        with translate("probing open_when"), conn.transaction(force_rollback=True):
            conn.execute(
                sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DROP").format(
                    sql.Identifier(probes[0].rule.table_name),
                    sql.SQL(", ").join(
                        sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))
                        for c, t in columns.items()
                    ),
                )
            )
            for n in range(len(probes)):
                each(condition_alone, n, keep=False)
                if n in refused and probes[n].tracking:
                    del refused[n]
                    each(condition_tracked, n, keep=False)
            passed = [n for n in range(len(probes)) if n not in refused]
            try:
                with translate("probing open_when"), conn.transaction():
                    add({c: t for n in passed for c, t in probes[n].tracking.items()})
            except DatabaseUnavailable:
                raise
            except DatabaseError:
                together = False  # each rule adds its own, for its own error
            for n in passed:
                each(build, n, keep=True)
            found = dict(
                conn.execute(
                    "SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_class c"
                    " WHERE c.relname = ANY(%s) AND c.relnamespace = pg_my_temp_schema()",
                    ([name for ns in names for name in ns],),
                ).fetchall()
            )
    except DatabaseUnavailable:
        raise
    except DatabaseError as exc:  # the copy itself: every rule's answer
        msg = _refusal(exc)
        return [([], msg) for _ in probes]
    return [
        ([], refused[n])
        if n in refused
        else ([definition_tail(found[k]) if k in found else "" for k in ns], None)
        for n, ns in enumerate(names)
    ]


def _refusal(exc: DatabaseError) -> str:
    """Why PostgreSQL refused a rule's probe, in one line."""
    msg = describe(exc.__cause__ or exc)
    if "IMMUTABLE" in msg and "index predicate" in msg:
        msg += " (open_when must not call now(), random() or other volatile functions)"
    return msg


def _timing(tgtype: int) -> str:
    """A trigger's timing and level from ``pg_trigger.tgtype`` (see pg_trigger.h)."""
    when = "BEFORE" if tgtype & 2 else "INSTEAD OF" if tgtype & 64 else "AFTER"
    return f"{when} UPDATE, each {'row' if tgtype & 1 else 'statement'}"


def update_side_effects(conn: Connection, schema: str, name: str, tracking: list[str]) -> list[str]:
    """What an UPDATE of ``schema.name`` that sets only ``tracking`` columns would set
    off, one phrase each (``trigger last_update (BEFORE UPDATE, each row)``): enabled
    triggers on the table or its partitions, rewrite rules, and publications of its
    updates. Empty when such an UPDATE touches nothing but the rows."""
    found: list[str] = []
    with translate(f"reading the triggers, rules and publications of {schema}.{name}"):
        row = conn.execute(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s",
            (schema, name),
        ).fetchone()
        if row is None:
            return []
        params = {"oid": row[0], "tracking": tracking}
        for tgname, tschema, tname, on_table, tgtype, constraint in conn.execute(
            queries()["update_triggers"], params
        ):
            kind = "constraint trigger" if constraint else "trigger"
            where = "" if on_table else f" on {tschema}.{tname}"
            found.append(f"{kind} {tgname}{where} ({_timing(tgtype)})")
        for rulename, instead in conn.execute(queries()["update_rules"], params):
            found.append(f"rule {rulename} (ON UPDATE DO {'INSTEAD' if instead else 'ALSO'})")
        for (pubname,) in conn.execute(queries()["update_publications"], params):
            found.append(f"publication {pubname} (logical replication ships each claimed row)")
    return found


def without_statistics(
    conn: Connection, schema: str, name: str, columns: list[str] | None = None
) -> list[tuple[str, str]]:
    """The table ``schema.name`` (or each partition of it) that holds rows the planner
    has no statistics for: a table just loaded from a dump, not yet analyzed; or, with
    ``columns``, none for one of them (columns added since, or about to be)."""
    with translate(f"reading the statistics of {schema}.{name}"):
        rels = conn.execute(
            queries()["no_statistics"],
            {"schema": schema, "name": name, "columns": list(columns or [])},
        ).fetchall()
        out = []
        for rel_schema, rel_name in rels:
            # An empty table has nothing to count: ANALYZE would find nothing either.
            row = conn.execute(
                sql.SQL("SELECT EXISTS (SELECT 1 FROM ONLY {})").format(
                    sql.Identifier(rel_schema, rel_name)
                )
            ).fetchone()
            if row and row[0]:
                out.append((rel_schema, rel_name))
    return out


def indexes_on(conn: Connection, schema: str, name: str, columns: list[str]) -> list[str]:
    """The names of the indexes of ``schema.name`` that read any of ``columns``."""
    with translate(f"reading the indexes of {schema}.{name}"):
        rows = conn.execute(
            queries()["indexes_on_columns"], {"schema": schema, "name": name, "columns": columns}
        ).fetchall()
    return [r[0] for r in rows]


def same_indexes(conn: Connection, schema: str, name: str, definition: str) -> list[str]:
    """The names of the valid indexes of ``schema.name`` defined as ``definition`` (from
    "USING" on, as :func:`definition_tail` gives it): one the operator made already."""
    with translate(f"reading the indexes of {schema}.{name}"):
        rows = conn.execute(
            "SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_class t ON t.oid = i.indrelid"
            " JOIN pg_namespace n ON n.oid = t.relnamespace"
            " WHERE n.nspname = %s AND t.relname = %s AND i.indisvalid ORDER BY 1",
            (schema, name),
        ).fetchall()
    return [r[0] for r in rows if definition_tail(r[1]) == definition]


# PostgreSQL's roles that let their members read or run past the tables a rule watches
# (files, every table, settings, other sessions' SQL, programs): with one, slawatch's
# checks of a rule's SQL are all that bounds it (docs/explanation/safety.md).
BROAD_ROLES = (
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_execute_server_program",
    "pg_read_all_data",
    "pg_write_all_data",
    "pg_read_all_settings",
    "pg_read_all_stats",
)


def broad_role(conn: Connection) -> tuple[str, str | None]:
    """The role slawatch connects as, and what lets it reach past the application's
    tables: ``"a superuser"``, ``"a member of pg_read_all_data, ..."`` (of
    :data:`BROAD_ROLES`, those the server has), or None."""
    with translate("reading slawatch's role"):
        row = conn.execute(
            "SELECT current_user, r.rolsuper,"
            " ARRAY(SELECT b.rolname::text FROM pg_roles b"
            "        WHERE b.rolname = ANY(%s::text[])"
            "          AND pg_has_role(current_user, b.oid, 'MEMBER') ORDER BY 1)"
            " FROM pg_roles r WHERE r.rolname = current_user",
            (list(BROAD_ROLES),),
        ).fetchone()
    assert row is not None  # current_user is a role of pg_roles
    role, superuser, members = row
    if superuser:
        return role, "a superuser"
    if members:
        return role, f"a member of {', '.join(members)}"
    return role, None
