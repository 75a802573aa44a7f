"""DDL from rules: slawatch's schema, tracking columns, partial indexes, GRANTs.

One plan serves both ``migrate`` and ``migrate --print``: it compares what the
catalog has with what the rules need and lists the statements that close the
gap, so a DBA who applies the printed script ends where ``migrate`` would.
Whether an index is the one a rule needs is decided from the catalog, not from
a label: PostgreSQL builds the wanted index on an empty copy of the table, and
its canonical definition (``pg_get_indexdef``: columns and predicate) must
equal the existing index's, which must also be valid and on the rule's table.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace

from psycopg import sql

from slawatch.catalog import (
    IndexState,
    Partition,
    TableInfo,
    check_rule,
    index_state,
    probe_indexes,
    table_ident,
)
from slawatch.db import Connection, translate
from slawatch.errors import ConfigError
from slawatch.queries import schema_sql
from slawatch.rules import Rule, condition_columns

log = logging.getLogger(__name__)

# ALTER TABLE needs a brief exclusive lock; never queue behind a long transaction
# (and block the application's queries behind us) for longer than this.
LOCK_TIMEOUT = "5s"
MIGRATE_LOCK = 0x534C4157  # advisory lock key: one migrate at a time


def _q(*names: str) -> str:
    """A quoted, printable identifier."""
    return sql.Identifier(*names).as_string(None)


@dataclass(frozen=True)
class IndexSpec:
    """One partial index a rule needs, on its table or on one partition of it."""

    name: str
    schema: str  # of the table, and so of the index
    table: str
    column: str
    predicate: str  # SQL text; open_when inside it is operator-authored and checked

    def create(self, *, only: bool = False) -> str:
        """CREATE INDEX CONCURRENTLY; with ``only``, the empty parent of a partitioned index."""
        return (
            f"CREATE INDEX {'' if only else 'CONCURRENTLY '}{_q(self.name)}"
            f" ON {'ONLY ' if only else ''}{_q(self.schema, self.table)} ({_q(self.column)})"
            f"\n    WHERE {self.predicate}"
        )

    def drop(self, *, concurrently: bool = True) -> str:
        how = "CONCURRENTLY " if concurrently else ""
        return f"DROP INDEX {how}IF EXISTS {_q(self.schema, self.name)}"

    def child(self, part: Partition) -> IndexSpec:
        """The same index on one partition; named from the partition, within 63 bytes."""
        tag = hashlib.sha256(f"{part.schema}.{part.name}".encode()).hexdigest()[:8]
        return replace(self, name=f"{self.name}_{tag}", schema=part.schema, table=part.name)

    def problem(self, state: IndexState | None, wanted: str) -> str | None:
        """Why an index in ``state`` is not this one, usable; None when it is."""
        if state is None:
            return "missing"
        if state.table != (self.schema, self.table):
            return f"on another table ({state.table[0]}.{state.table[1]})"
        if state.definition != wanted:
            return "definition changed"
        if not state.valid:
            return "was left invalid"
        return None


def predicates(rule: Rule) -> tuple[str, str, str]:
    """The SQL of the three index predicates, which the claim repeats word for word.

    - first: rows not yet notified for their current deadline value (never notified,
      or the deadline moved since: a new episode);
    - again: rows of an open episode awaiting a re-notification;
    - ended: rows whose episode ended (open_when turned false, or the deadline
      moved); the next scan closes the episode, and the row leaves this index.
    """
    d, n, seen = _q(rule.deadline), _q(rule.next_column), _q(rule.seen_column)
    open_when = f"({rule.open_when})"
    first = f"{seen} IS DISTINCT FROM {d} AND {open_when}"
    again = f"{n} IS NOT NULL AND {seen} = {d} AND {open_when}"
    ended = f"{seen} IS NOT NULL AND ({seen} IS DISTINCT FROM {d} OR {open_when} IS NOT TRUE)"
    return first, again, ended


def index_specs(rule: Rule) -> list[IndexSpec]:
    """The rule's partial indexes on the watched table. Inline: first notices by
    deadline, re-notifications by time, ended episodes; table: the deadline of open rows."""
    s, t = rule.schema_name, rule.table_name
    if rule.track == "table":
        return [IndexSpec(rule.due_index, s, t, rule.deadline, f"({rule.open_when})")]
    first, again, ended = predicates(rule)
    return [
        IndexSpec(rule.first_index, s, t, rule.deadline, first),
        IndexSpec(rule.again_index, s, t, rule.next_column, again),
        IndexSpec(rule.ended_index, s, t, rule.seen_column, ended),
    ]


def tracking_types(rule: Rule, deadline_type: str) -> dict[str, str]:
    """Each tracking column's type; ``seen`` holds deadline values, so it has their type."""
    return {
        rule.n_column: "integer NOT NULL DEFAULT 0",
        rule.next_column: "timestamptz",
        rule.seen_column: deadline_type,
        rule.episode_column: "integer NOT NULL DEFAULT 0",
    }


@dataclass(frozen=True)
class Step:
    """One statement of a migration and the line ``migrate`` reports for it."""

    statement: str
    done: str
    locked: bool = False  # takes a strong lock: run with lock_timeout, in a transaction
    detail: bool = False  # one of many similar steps: printed, not reported by migrate


def grants(
    rules: list[Rule], role: str = "slawatch_app", keys: dict[str, list[str]] | None = None
) -> list[sql.Composed]:
    """What a least-privilege role needs. Inline: read the watched tables, update only
    the tracking columns. track: table: read only the columns the rule reads (when the
    key is known; ``keys`` by rule name), write nothing there."""
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
        key = (keys or {}).get(rule.name) or rule.key
        if rule.track == "table" and key:
            read = [*key, rule.deadline, *rule.alert_columns(list(key))]
            read += sorted(condition_columns(rule.open_when))
            out.append(
                sql.SQL("GRANT SELECT ({}) ON {} TO {}").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in dict.fromkeys(read)),
                    table_ident(rule),
                    r,
                )
            )
            continue
        out.append(sql.SQL("GRANT SELECT ON {} TO {}").format(table_ident(rule), r))
        if rule.track == "inline":
            out.append(
                sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in rule.tracking_columns),
                    table_ident(rule),
                    r,
                )
            )
    return out


def check(conn: Connection, rules: list[Rule]) -> dict[str, TableInfo]:
    """Check every rule against the database; raise one ConfigError listing all problems.

    Returns each rule's table as the catalog describes it.
    """
    errors: list[str] = []
    tables: dict[str, TableInfo] = {}
    with translate("reading the server's settings"):
        row = conn.execute("SELECT current_setting('standard_conforming_strings')").fetchone()
    if row is None or row[0] != "on":
        # open_when was parsed with '\\' as an ordinary character in '...' literals; with
        # this off the server would read the same text differently.
        raise ConfigError(
            "the database has standard_conforming_strings = off; slawatch needs it on "
            "(the default since PostgreSQL 9.1)"
        )
    for rule in rules:
        info, problems = check_rule(conn, rule)
        if info is not None and not problems:
            _, problem = _wanted(conn, rule, info)
            if problem:
                problems = [f"{rule.source}: open_when: {problem}"]
        errors.extend(problems)
        if info is not None:
            tables[rule.name] = info
    if errors:
        raise ConfigError("\n".join(errors))
    return tables


def _wanted(conn: Connection, rule: Rule, info: TableInfo) -> tuple[list[str], str | None]:
    """The canonical definitions of the rule's indexes (see catalog.probe_indexes)."""
    specs = index_specs(rule)
    types = tracking_types(rule, info.columns[rule.deadline]) if rule.track == "inline" else {}
    return probe_indexes(conn, rule, info.columns, types, [(s.column, s.predicate) for s in specs])


def require_schema(conn: Connection) -> None:
    """ConfigError unless slawatch's own tables are there in their current shape."""
    if not schema_current(conn):
        raise ConfigError(
            "slawatch's schema is missing or out of date; run 'slawatch migrate' first"
        )


def schema_current(conn: Connection) -> bool:
    """slawatch's own tables exist in their current shape."""
    with translate("reading the catalog for slawatch's schema"):
        # The newest piece of each upgrade: episodes, watermarks, acks and silences
        # (the alert's kind, the delivery's 'silenced' state), baselines, storms.
        row = conn.execute(
            "SELECT to_regclass('slawatch.delivery') IS NOT NULL"
            " AND to_regclass('slawatch.watermark') IS NOT NULL"
            " AND to_regclass('slawatch.ack') IS NOT NULL"
            " AND to_regclass('slawatch.silence') IS NOT NULL"
            " AND to_regclass('slawatch.scan') IS NOT NULL"
            " AND to_regclass('slawatch.delivery_dead') IS NOT NULL"
            " AND to_regclass('slawatch.baseline') IS NOT NULL"
            # storms: the summary index comes after the wider CHECKs in schema.sql
            " AND to_regclass('slawatch.delivery_summary') IS NOT NULL"
            # acknowledged and orphaned deliveries: their index follows the wider CHECK
            " AND to_regclass('slawatch.delivery_orphaned') IS NOT NULL"
            " AND (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass('slawatch.alert')"
            " AND attname IN ('episode', 'kind') AND NOT attisdropped) = 2"
            " AND EXISTS (SELECT 1 FROM pg_constraint"
            " WHERE conrelid = to_regclass('slawatch.delivery') AND conname = 'delivery_status')"
        ).fetchone()
    return bool(row and row[0])


def plan(conn: Connection, rules: list[Rule]) -> list[Step]:
    """What the database needs for ``rules``; nothing when it is up to date.

    Raises ConfigError, listing every problem, when any rule fails its check.
    """
    tables = check(conn, rules)
    steps = []
    if not schema_current(conn):
        steps.append(
            Step(schema_sql().strip().rstrip(";"), "created or upgraded slawatch's schema")
        )
    for rule in rules:
        steps.extend(plan_rule(conn, rule, tables[rule.name]))
    return steps


def plan_rule(conn: Connection, rule: Rule, info: TableInfo) -> list[Step]:
    """What one rule needs: tracking columns or its state table, then its partial indexes."""
    steps = _leftovers(conn, rule)
    if rule.track == "table":
        steps.extend(_state_table(conn, rule, info))
    else:
        steps.extend(_tracking_columns(rule, info))
    wanted, problem = _wanted(conn, rule, info)
    if problem:  # check() ran the same probe; only a concurrent change gets here
        raise ConfigError(f"{rule.source}: open_when: {problem}")
    for spec, definition in zip(index_specs(rule), wanted, strict=True):
        if info.relkind == "p":
            steps.extend(_partitioned_index(conn, spec, definition, info.partitions))
        else:
            steps.extend(_index(conn, spec, definition))
    return steps


def _leftovers(conn: Connection, rule: Rule) -> list[Step]:
    """Indexes of the other way to track, left by a rule that changed its ``track``: they
    would only cost the application's writes. (Inline's columns stay: dropping them
    takes a strong lock, and they cost nothing unindexed.)"""
    other = rule.model_copy(update={"track": "inline" if rule.track == "table" else "table"})
    steps = []
    for spec in index_specs(other):
        if index_state(conn, spec.schema, spec.name) is not None:
            where = f"{spec.schema}.{spec.table}"
            steps.append(Step(spec.drop(), f"{where}: dropped index {spec.name} (track changed)"))
    return steps


def state_columns(rule: Rule, info: TableInfo) -> dict[str, str]:
    """The state table's columns and types: the watched table's key, then slawatch's."""
    from slawatch.catalog import key_columns

    columns = {c: info.columns[c] for c in key_columns(rule, info)}
    columns |= {
        "sw_seen": info.columns[rule.deadline],
        "sw_ep": "integer",
        "sw_n": "integer",
        "sw_next": "timestamp with time zone",
    }
    return columns


def _state_table(conn: Connection, rule: Rule, info: TableInfo) -> list[Step]:
    """slawatch's own table for a ``track: table`` rule, with its re-notify index."""
    from slawatch.catalog import inspect_table, key_columns

    name = f"{rule.name}_state"
    table = _q("slawatch", name)
    columns = state_columns(rule, info)
    have = inspect_table(conn, "slawatch", name)
    steps = []
    if have is not None and have.columns == columns:
        return []
    if have is not None:
        # The key or the deadline's type changed: the old state cannot be carried over.
        steps.append(
            Step(f"DROP TABLE {table}", f"slawatch.{name}: dropped (the rule's key changed)")
        )
    defaults = {"sw_ep": " NOT NULL DEFAULT 0", "sw_n": " NOT NULL DEFAULT 0"}
    lines = [
        f"    {_q(c)} {t}{' NOT NULL' if c in info.columns else defaults.get(c, '')}"
        for c, t in columns.items()
    ]
    keys = ", ".join(_q(c) for c in key_columns(rule, info))
    steps.append(
        Step(
            f"CREATE TABLE {table} (\n" + ",\n".join(lines) + f",\n    PRIMARY KEY ({keys})\n)",
            f"slawatch.{name}: created",
        )
    )
    steps.append(
        Step(
            f"CREATE INDEX {_q(name + '_again')} ON {table} (sw_next) WHERE sw_next IS NOT NULL",
            f"slawatch.{name}: built index {name}_again",
            detail=True,
        )
    )
    return steps


def _tracking_columns(rule: Rule, info: TableInfo) -> list[Step]:
    """Inline tracking: the four columns on the watched table."""
    steps = []
    table = _q(rule.schema_name, rule.table_name)
    where = f"{rule.schema_name}.{rule.table_name}"
    types = tracking_types(rule, info.columns[rule.deadline])
    missing = [c for c in types if c not in info.columns]
    if missing:
        adds = ",".join(f"\n    ADD COLUMN IF NOT EXISTS {_q(c)} {types[c]}" for c in missing)
        steps.append(
            Step(f"ALTER TABLE {table}{adds}", f"{where}: added {', '.join(missing)}", locked=True)
        )
        if rule.n_column in info.columns and rule.seen_column in missing:
            # Rows notified before episodes existed: their notifications so far are
            # episode 1, so they are not paged again from #1.
            steps.append(
                Step(
                    f"UPDATE {table} SET {_q(rule.seen_column)} = {_q(rule.deadline)},"
                    f" {_q(rule.episode_column)} = 1\n WHERE {_q(rule.n_column)} > 0"
                    f" AND {_q(rule.seen_column)} IS NULL",
                    f"{where}: notified rows became episode 1",
                )
            )
    seen_type = info.columns.get(rule.seen_column)
    if seen_type is not None and seen_type != types[rule.seen_column]:
        steps.append(
            Step(
                f"ALTER TABLE {table} ALTER COLUMN {_q(rule.seen_column)}"
                f" TYPE {types[rule.seen_column]}",
                f"{where}: {rule.seen_column} now {types[rule.seen_column]} like the deadline",
                locked=True,
            )
        )
    return steps


def _inspect(
    conn: Connection, spec: IndexSpec, wanted: str
) -> tuple[IndexState | None, str | None]:
    """The index as it is, and why it is not the one wanted (None: it is)."""
    state = index_state(conn, spec.schema, spec.name)
    return state, spec.problem(state, wanted)


def _index(conn: Connection, spec: IndexSpec, wanted: str) -> list[Step]:
    where = f"{spec.schema}.{spec.table}"
    state, why = _inspect(conn, spec, wanted)
    if why is None:
        return []
    steps = []
    if state is not None:
        steps.append(Step(spec.drop(), f"{where}: dropped index {spec.name} ({why})"))
    steps.append(Step(spec.create(), f"{where}: built index {spec.name}"))
    return steps


def _partitioned_index(
    conn: Connection, spec: IndexSpec, wanted: str, partitions: tuple[Partition, ...]
) -> list[Step]:
    """A partitioned index without blocking writes: created ON ONLY the parent (empty and
    invalid), built CONCURRENTLY in each partition, attached; valid once all are attached.
    Partitions created later get their index from the parent. An interrupted run resumes.
    """
    where = f"{spec.schema}.{spec.table}"
    state, why = _inspect(conn, spec, wanted)
    if why is None:
        return []
    steps = []
    if state is not None and why != "was left invalid":
        # DROP INDEX CONCURRENTLY cannot drop a partitioned index; this drops its children too.
        steps.append(
            Step(
                spec.drop(concurrently=False),
                f"{where}: dropped index {spec.name} ({why})",
                locked=True,
            )
        )
        state = None
    if state is None:
        steps.append(
            Step(
                spec.create(only=True),
                f"{where}: created index {spec.name}",
                locked=True,
                detail=True,
            )
        )
    parent = _q(spec.schema, spec.name)
    for part in partitions:
        child = spec.child(part)
        cstate = None if state is None else index_state(conn, child.schema, child.name)
        if cstate is not None and child.problem(cstate, wanted) is not None:
            steps.append(Step(child.drop(), f"{where}: dropped index {child.name}", detail=True))
            cstate = None
        if cstate is None:
            steps.append(Step(child.create(), f"{where}: built index {child.name}", detail=True))
        steps.append(
            Step(
                f"ALTER INDEX {parent} ATTACH PARTITION {_q(child.schema, child.name)}",
                f"{where}: attached index {child.name}",
                locked=True,
                detail=True,
            )
        )
    # migrate reports the whole index in one line.
    summary = f"{where}: built index {spec.name} ({len(partitions)} partitions)"
    steps[-1] = replace(steps[-1], done=summary, detail=False)
    return steps


def pending(conn: Connection, rule: Rule, info: TableInfo) -> list[str]:
    """What ``migrate`` would still do for ``rule``: empty when it is ready to run."""
    return [step.done for step in plan_rule(conn, rule, info) if not step.detail]


def migrate(conn: Connection, rules: list[Rule]) -> list[str]:
    """Check, then bring the database in line with ``rules``; returns what was done.

    ``conn`` must be in autocommit mode (CREATE INDEX CONCURRENTLY needs it).
    Nothing is changed when any rule fails its check.
    """
    with translate("migrate"):
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK,))
    try:
        done = []
        for step in plan(conn, rules):
            with translate(f"migrate: {step.done}"):
                if step.locked:
                    _locked(conn, step.statement)
                else:
                    conn.execute(step.statement.encode())  # SQL text: no parameters
            if not step.detail:
                done.append(step.done)
        return done
    finally:
        with translate("migrate"):
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK,))


def _locked(conn: Connection, statement: str) -> None:
    """Run a statement that takes a brief strong lock, without queueing behind long ones."""
    with conn.transaction():
        conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
        conn.execute(statement.encode())


_PRINT_HEAD = """\
-- slawatch migration. Run it with psql as the owner of the watched tables, one
-- statement at a time (CREATE INDEX CONCURRENTLY cannot run in a transaction).
-- A statement that takes a strong lock runs with a lock_timeout: the application's
-- queries would queue behind it; CONCURRENTLY ones wait as long as they need.
"""


def _printed(step: Step) -> str:
    """A step as psql runs it; a locking one bounded by lock_timeout, as migrate runs it."""
    if not step.locked:
        return step.statement + ";"
    return f"SET lock_timeout = '{LOCK_TIMEOUT}';\n{step.statement};\nRESET lock_timeout;"


def render(rules: list[Rule], steps: list[Step] | None = None) -> str:
    """The migration as a script a DBA can read and run (``migrate --print``).

    ``steps`` is a plan made against the database (only what it needs); without
    one, the script builds everything from scratch: it drops and rebuilds each
    index, so whatever state the database is in, it ends where ``migrate`` would.
    """
    out = [_PRINT_HEAD]
    if steps is None:
        out.append("-- Made without a database: every index is rebuilt. With SLAWATCH_DSN")
        out.append("-- (or --dsn) set, --print shows only what that database needs.")
        out.append("")
        out.append(schema_sql().strip().rstrip(";") + ";")
        out.append("")
        for rule in rules:
            out.append(f"-- rule {rule.name} ({rule.source}) on {rule.table}")
            if rule.track == "table":
                out.append(
                    f"-- track: table: slawatch.{rule.name}_state takes the types of the"
                    " table's key: print against the database for it."
                )
                for spec in index_specs(rule):
                    out.append(spec.drop() + ";")
                    out.append(spec.create() + ";")
                out.append("")
                continue
            out.append(
                f"-- (tracking columns; {rule.seen_column} has the type of {rule.deadline}:"
                " timestamptz here, timestamp if the deadline is timestamp)"
            )
            types = tracking_types(rule, "timestamptz")
            adds = ",".join(f"\n    ADD COLUMN IF NOT EXISTS {_q(c)} {t}" for c, t in types.items())
            alter = f"ALTER TABLE {_q(rule.schema_name, rule.table_name)}{adds}"
            out.append(_printed(Step(alter, "", locked=True)))
            for spec in index_specs(rule):
                out.append(spec.drop() + ";")
                out.append(spec.create() + ";")
            out.append("")
        out.append(
            "-- A partitioned table needs each index ON ONLY the parent, built CONCURRENTLY\n"
            "-- in each partition and attached: print against the database for that."
        )
    elif not steps:
        out.append("-- The database is up to date: nothing to change.")
    else:
        for step in steps:
            out.append(f"-- {step.done}")
            out.append(_printed(step))
    out.append("")
    out.append("-- Least privilege: what the role slawatch runs as needs (name yours; create")
    out.append("-- it first, e.g. CREATE ROLE slawatch_app LOGIN). slawatch also needs TEMP on")
    out.append("-- the database (PUBLIC has it by default): its start-up check builds the")
    out.append("-- rules' indexes on empty temporary copies of the tables.")
    out.extend(g.as_string(None) + ";" for g in grants(rules))
    return "\n".join(out) + "\n"
