"""DDL from rules: slawatch's schema, tracking columns, partial indexes, GRANTs.

slawatch's own tables come from numbered migrations (schema.py); what rules need
(tracking columns, state tables, partial indexes) is generated here from each rule.

One plan serves both ``migrate`` and ``migrate --print``: it compares what the
catalog has with what the rules need and lists the statements that close the
gap, so a DBA who applies the printed script ends where ``migrate`` would.
Whether an index is the one a rule needs is decided from the catalog, not from
a label: PostgreSQL builds the wanted index on an empty copy of the table, and
its canonical definition (``pg_get_indexdef``: columns and predicate) must
equal the existing index's, which must also be valid and on the rule's table.
A command probes each rule once, and all the rules of a table on one copy of
it (:func:`with_probed_indexes`): a copy costs tens of milliseconds, and a
deployment may watch a table with dozens of rules.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from psycopg import sql

from slawatch.clock import Clock
from slawatch.config.needs import Need, needs, query_needs
from slawatch.config.rules import Rule, condition_columns
from slawatch.db import Connection, quoted, translate
from slawatch.engine import generation, probefn, rotate, schema, timers, trackswitch
from slawatch.engine.catalog import (
    IndexProbe,
    IndexState,
    Partition,
    Probed,
    TableInfo,
    check_rule,
    deadline_type_of,
    index_state,
    indexes_on,
    inspect_table,
    key_columns,
    probe_indexes,
    probe_table_indexes,
    same_indexes,
    table_ident,
    update_side_effects,
    without_statistics,
)
from slawatch.engine.predicates import predicates
from slawatch.engine.schema import Change
from slawatch.errors import ConfigError

log = logging.getLogger(__name__)

# ALTER TABLE needs a brief exclusive lock; never queue behind a long transaction
# (and block the application's queries behind us) for longer than this.
LOCK_TIMEOUT = schema.LOCK_TIMEOUT


@dataclass(frozen=True)
class IndexSpec:
    """One partial index a rule needs, on its table or on one partition of it."""

    name: str
    schema: str  # of the table, and so of the index
    table: str
    key: str  # SQL text: a quoted column, or a deadline expression in parentheses
    predicate: str  # SQL text; open_when inside it is operator-authored and checked; "": none

    def create(self, *, only: bool = False) -> str:
        """CREATE INDEX CONCURRENTLY; with ``only``, the empty parent of a partitioned index."""
        return (
            f"CREATE INDEX {'' if only else 'CONCURRENTLY '}{quoted(self.name)}"
            f" ON {'ONLY ' if only else ''}{quoted(self.schema, self.table)} ({self.key})"
            + (f"\n    WHERE {self.predicate}" if self.predicate else "")
        )

    def drop(self, *, concurrently: bool = True) -> str:
        how = "CONCURRENTLY " if concurrently else ""
        return f"DROP INDEX {how}IF EXISTS {quoted(self.schema, self.name)}"

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


def index_specs(rule: Rule) -> list[IndexSpec]:
    """The rule's partial indexes on the watched table. Inline: first notices by
    deadline, re-notifications by time, ended episodes; table: the deadline of open rows."""
    s, t = rule.schema_name, rule.table_name
    # A column, or the expression in parentheses: an index on it is ON t ((expr)).
    d = rule.deadline_sql()
    if rule.query is not None:
        return []  # a query is read as it is written: nothing is built on its tables
    if rule.track == "table":
        return [IndexSpec(rule.due_index, s, t, d, f"({rule.open_when})")]
    first, again, ended = predicates(rule)
    return [
        IndexSpec(rule.first_index, s, t, d, first),
        IndexSpec(rule.again_index, s, t, quoted(rule.next_column), again),
        IndexSpec(rule.ended_index, s, t, quoted(rule.seen_column), ended),
    ]


def report_index(rule: Rule) -> IndexSpec | None:
    """track: table: an index on the deadline of every row, by which the report counts the
    deadlines that fell due (its ``due`` and ``compliance``); the claim never uses it.
    Inline rules have none (their indexes hold only rows to notify or close), nor query
    rules (nothing is built on the tables a query reads)."""
    if rule.track != "table" or rule.events is not None or rule.query is not None:
        return None
    return IndexSpec(
        rule.deadline_index, rule.schema_name, rule.table_name, rule.deadline_sql(), ""
    )


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
    change: Change | None = None  # a schema migration: applied and recorded by schema.apply
    report: bool = False  # only the report needs it: a rule runs without it
    # How migrate runs it instead of ``statement`` (printed for psql): work in batches
    # of their own transactions; returns the rows it wrote, added to ``done``.
    run: Callable[[Connection], int] | None = field(default=None, compare=False)

    @property
    def todo(self) -> str:
        """The line as work still to do (``check``, a rule not ready): "will add ...",
        not the "added ..." that ``migrate`` reports once it is done."""
        return will(self.done)


# The past-tense verbs of Step.done and what migrate will do instead.
_WILL = {
    "created index": "will create index",
    "created": "will be created",
    "updated": "will be updated",
    "added": "will add",
    "built": "will build",
    "dropped index": "will drop index",
    "dropped": "will be dropped",
    "analyzed": "will analyze",
    "attached": "will attach",
    "applied": "will apply",
    "upgraded": "will upgrade",
    "carried over": "will be carried over",
    "reset": "will be reset",
    "now": "will be",
}
_PAST = re.compile(r"\b(" + "|".join(_WILL) + r")\b")


def will(done: str) -> str:
    """``done`` (a line of what migrate did) in the future: "public.orders: will add
    sw_late_n" for "public.orders: added sw_late_n". Only the first verb after the
    place (before ": ") changes: names after it stay as they are."""
    where, sep, what = done.partition(": ")
    if not sep:
        where, what = "", done
    what = _PAST.sub(lambda m: _WILL[m.group(1)], what, count=1)
    return where + sep + what.replace("it had no statistics", "it has no statistics")


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
    for name in sorted({rule.schema_name for rule in rules if rule.events is None}):
        out.append(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(name), r))
    # Retention rotates and drops the outbox's id ranges (0015_rotate.sql) through these.
    out.append(
        sql.SQL(
            "GRANT EXECUTE ON FUNCTION slawatch.history_rotate(timestamptz, interval),"
            " slawatch.history_drop(timestamptz) TO {}"
        ).format(r)
    )
    if any(rule.events is not None for rule in rules):
        # slawatch's own ways in (HTTP, brokers, the CLI); the timer tables are above.
        out.append(
            sql.SQL(
                "GRANT EXECUTE ON FUNCTION slawatch.events(jsonb, timestamptz),"
                " slawatch.event({}) TO {}"
            ).format(sql.SQL(timers.SIGNATURE), r)
        )
    schemas = {rule.schema_name for rule in rules if rule.events is None}
    for rule in rules:
        if rule.query is not None:
            # SELECT on what the query reads, as written (an unqualified name resolves
            # through the search_path, as the query's does).
            out.extend(_grants_for(query_needs(rule.query), r, schemas))
            continue
        if rule.events is not None:
            # An event rule's timer table is slawatch's (ALL TABLES IN SCHEMA slawatch).
            continue
        key = (keys or {}).get(rule.name) or rule.key
        if rule.track == "table" and key:
            read = [*key, *rule.deadline_columns, *rule.alert_columns(list(key))]
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
    # An action's own role (action.role, SLAWATCH_ACTION_ROLE) gets what its statements
    # need, and slawatch's role the right to SET ROLE to it; without one, slawatch's role.
    theirs: dict[str, set[str]] = {}
    for rule in rules:
        if rule.action is None or rule.action.sql is None:
            continue
        if rule.action.role is None:
            out.extend(action_grants(rule.action.sql, r, schemas))
            continue
        if rule.action.role not in theirs:
            theirs[rule.action.role] = set()
            out.append(sql.SQL("GRANT {} TO {}").format(sql.Identifier(rule.action.role), r))
        out.extend(
            action_grants(
                rule.action.sql,
                sql.Identifier(rule.action.role),
                theirs[rule.action.role],
                # An event rule's table is slawatch's own: not where its action writes.
                rule.schema_name if rule.events is None else "public",
            )
        )
    return out


def action_grants(
    text: str, role: sql.Identifier, schemas: set[str], unqualified: str | None = None
) -> list[sql.Composed]:
    """The GRANTs an action statement needs (config/needs.py), USAGE on a schema it
    names first unless ``schemas`` (granted already) has it; adds those to ``schemas``.
    ``unqualified``: the schema an unqualified name is taken to be in (the rule's
    table's), whose USAGE is granted as well (an action's own role has none yet)."""
    return _grants_for(needs(text), role, schemas, unqualified)


def _grants_for(
    found: list[Need], role: sql.Identifier, schemas: set[str], unqualified: str | None = None
) -> list[sql.Composed]:
    """The GRANTs of ``found`` (as :func:`action_grants` says)."""
    out = []
    for need in found:
        schema = need.schema or unqualified
        if schema is not None and schema not in schemas:
            schemas.add(schema)
            out.append(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), role)
            )
        parts = [need.schema, need.name] if need.schema is not None else [need.name]
        target = sql.Identifier(*parts)
        if need.function:
            # No argument list: PostgreSQL grants on the one function of that name
            # (and says so when there are several).
            out.append(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(target, role))
            continue
        columns: sql.Composable = sql.SQL("")
        if need.columns:
            names = sql.SQL(", ").join(sql.Identifier(c) for c in need.columns)
            columns = sql.SQL(" ({})").format(names)
        out.append(
            sql.SQL("GRANT {}{} ON {} TO {}").format(sql.SQL(need.privilege), columns, target, role)
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
    checked: dict[str, tuple[TableInfo | None, list[str]]] = {}
    sound = []
    for rule in rules:
        if rule.events is not None and inspect_table(conn, "slawatch", rule.timers) is None:
            continue  # an event rule's timer table: migrate creates it
        info, problems = checked[rule.name] = check_rule(conn, rule)
        if info is not None and not problems:
            sound.append((rule, info))
    probed = with_probed_indexes(conn, sound)
    for rule in rules:
        if rule.name not in checked:
            continue
        info, problems = checked[rule.name]
        if rule.name in probed:
            info = probed[rule.name]
            _, problem = _wanted(conn, rule, info)
            if problem:
                problems = [f"{rule.source}: open_when: {problem}"]
            refused = inline_refusal(conn, rule)
            if refused:
                problems.append(refused)
        errors.extend(problems)
        if info is not None:
            tables[rule.name] = info
    if errors:
        raise ConfigError("\n".join(errors))
    return tables


def inline_refusal(conn: Connection, rule: Rule) -> str | None:
    """Why ``rule`` may not track inline on its table, in one line; None when it may.

    Every claim (and ``migrate --baseline``, and a switch from ``track: table``) is an
    UPDATE of the watched rows. Where the table's triggers, rewrite rules or
    publications would act on that UPDATE, watching would change the shop's data or
    set off its machinery (an ``updated_at`` trigger, an audit table, logical
    replication), unless the rule says ``inline_triggers: fire``.
    """
    if rule.track != "inline" or rule.inline_triggers == "fire":
        return None
    found = update_side_effects(conn, rule.schema_name, rule.table_name, rule.tracking_columns)
    if not found:
        return None
    return (
        f"{rule.source}: track: inline: each claim UPDATEs the rows of {rule.table}, which"
        f" would set off {', '.join(found)}; use track: table (slawatch then never writes"
        f" {rule.table}), or set inline_triggers: fire to accept that"
    )


def _wanted(conn: Connection, rule: Rule, info: TableInfo) -> Probed:
    """The canonical definitions of the rule's indexes (see catalog.probe_indexes): as
    :func:`with_probed_indexes` found them, else probed now."""
    if info.probed_indexes is not None:
        return info.probed_indexes
    return probe_indexes(conn, rule, info.columns, *_probe_args(rule, info))


def _probe_args(rule: Rule, info: TableInfo) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The tracking columns the rule's copy of its table needs, and its indexes'
    (key, predicate): what catalog.probe_indexes builds."""
    specs = _all_indexes(rule)
    types = tracking_types(rule, deadline_type_of(rule, info)) if rule.track == "inline" else {}
    return types, [(s.key, s.predicate) for s in specs]


def with_probed_indexes(
    conn: Connection, checked: list[tuple[Rule, TableInfo]]
) -> dict[str, TableInfo]:
    """Each rule's table (by rule name) with its wanted indexes probed, for every rule
    of a table on one copy of it (catalog.probe_table_indexes): each command that
    needs them (check, migrate, a start or reload of run) probes each rule once, and
    a table's rules together (a copy costs tens of milliseconds)."""
    tables: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[Rule, TableInfo]]] = {}
    for rule, info in checked:
        # The copy is a temporary table of the rule's table's name, with its columns.
        tables.setdefault((rule.table_name, tuple(info.columns.items())), []).append((rule, info))
    out = {}
    for group in tables.values():
        probes = [IndexProbe(rule, *_probe_args(rule, info)) for rule, info in group]
        answers = probe_table_indexes(conn, group[0][1].columns, probes)
        for (rule, info), answer in zip(group, answers, strict=True):
            out[rule.name] = replace(info, probed_indexes=answer)
    return out


def _all_indexes(rule: Rule) -> list[IndexSpec]:
    """The claim's indexes, then the report's (if the rule has one)."""
    extra = report_index(rule)
    return index_specs(rule) + ([] if extra is None else [extra])


def require_schema(conn: Connection) -> None:
    """ConfigError unless slawatch's latest migration is recorded."""
    if not schema_current(conn):
        raise ConfigError(
            "slawatch's schema is missing or out of date; run 'slawatch migrate' first"
        )


def schema_current(conn: Connection) -> bool:
    """slawatch's own tables are current: the latest migration is recorded."""
    return schema.current(conn)


def plan(
    conn: Connection,
    rules: list[Rule],
    *,
    drop_event_types: bool = False,
    tables: dict[str, TableInfo] | None = None,
) -> list[Step]:
    """What the database needs for ``rules``; nothing when it is up to date.
    ``drop_event_types``: see :func:`_event_function`. ``tables``: what :func:`check`
    returned for ``rules``, when the caller checked them already.

    Raises ConfigError, listing every problem, when any rule fails its check.
    """
    if tables is None:
        tables = check(conn, rules)
    steps = []
    for change in schema.pending(conn):
        steps.append(Step(change.sql, change.done, change=change))
    if _converts_outbox() and rotate.pending(conn):
        steps.append(
            Step(
                CONVERT_ALL,
                "slawatch.alert, slawatch.delivery: converted into id ranges",
                run=lambda c: rotate.convert(c),
            )
        )
    for rule in rules:
        if rule.name not in tables:  # an event rule's timer table, not there yet
            steps.extend(_timer_table(rule))
            continue
        steps.extend(plan_rule(conn, rule, tables[rule.name]))
    steps.extend(_event_function(conn, rules, drop_event_types))
    steps.extend(_probe_functions(conn, rules, tables))
    steps.extend(_generations(conn, rules))
    return steps


# psql's conversion of the outbox: the whole of it in one transaction (slawatch
# migrate's resumable batches are for a large outbox: docs/how-to/upgrades.md).
CONVERT_ALL = "SELECT slawatch.history_convert_all(now())"


def _converts_outbox() -> bool:
    """Whether the schema migrate brings a database to has the outbox in id ranges (a
    test may stand in an older release's migrations)."""
    return any(m.name == "rotate" for m in schema.migrations())


def probe_definition(rule: Rule, info: TableInfo | None) -> probefn.Definition | None:
    """The probe function ``rule`` calls (engine/probefn.py), composed as the runtime
    composes it; None when the table does not say enough yet (e.g. no key)."""
    from slawatch.engine.claim import plan_claim, probe_definition

    try:
        if info is None:  # an event rule's timer table, created by this migrate
            plan = plan_claim(rule, "timestamp with time zone")
        else:
            plan = plan_claim(
                rule,
                deadline_type_of(rule, info),
                partitioned=info.relkind == "p",
                key=key_columns(rule, info),
            )
    except ConfigError:
        return None
    return probe_definition(plan)


def _probe_functions(
    conn: Connection, rules: list[Rule], tables: dict[str, TableInfo]
) -> list[Step]:
    """Each rule's probe function, created or replaced where its probe changed, and
    dropped with its rule: before the definitions are recorded."""
    wanted = {rule.name: probe_definition(rule, tables.get(rule.name)) for rule in rules}
    return [Step(c.statement, c.done) for c in probefn.changes(wanted, probefn.installed(conn))]


def _records_generations() -> bool:
    """Whether the schema migrate brings a database to has the record (a test may stand
    in an older release's migrations)."""
    return any(m.name == "generation" for m in schema.migrations())


def _generations(conn: Connection, rules: list[Rule]) -> list[Step]:
    """Each rule's definition, recorded where another (or none) is: last, once what
    the rule needs is built, since instances running it claim from then on and those
    running another definition stop (docs/how-to/rolling-deploys.md)."""
    if not _records_generations():
        return []
    have = generation.recorded(conn)
    steps = []
    for rule in rules:
        record = have.get(rule.name)
        if record is not None and record.generation == generation.generation(rule):
            continue
        done = f"rule {rule.name}: definition recorded"
        if record is not None:
            changed = ", ".join(generation.differing(rule, record))
            done += (
                f" ({changed} changed): instances running the previous one stop claiming"
                " it until they are reloaded"
            )
        steps.append(Step(generation.record_statement(rule), done, locked=True))
    return steps


def _timer_table(rule: Rule) -> list[Step]:
    """An event rule's timer table, created with its tracking columns and indexes."""
    where = f"slawatch.{rule.timers}"
    statements = timers.create_table(rule)
    steps = [Step(statements[0], f"{where}: created (rule {rule.name}'s timers)")]
    steps += [Step(s, f"{where}: index", detail=True) for s in statements[1:]]
    for spec in index_specs(rule):
        steps.append(Step(spec.create(), f"{where}: built index {spec.name}", detail=True))
    return steps


def _event_function(conn: Connection, rules: list[Rule], drop: bool = False) -> list[Step]:
    """slawatch.event() and slawatch.events(), regenerated when the event rules change.

    A rule the installed function serves and ``rules`` lack (another deployment's, a
    partial checkout) keeps its part unless ``drop`` (``--drop-event-types``): migrate
    never unregisters event types the database may be using. Then the events held for
    types known now are applied (``slawatch.event_held``)."""
    installed = timers.installed_tags(conn)
    ours = {r.name for r in timers.event_rules(rules)}
    others = [n for n in timers.installed_rules(installed) if n not in ours]
    kept = {} if drop else timers.installed_blocks(conn, installed, others)
    if not ours and not kept and installed is None:
        return []
    steps = []
    types = sorted(set(timers.known_types(rules)).union(*map(timers.block_types, kept.values())))
    if installed is None or installed.get("all") != timers.wanted_tags(rules, kept)["all"]:
        count = len(types)
        dropped = f" (removed rule{'s' if len(others) > 1 else ''} {', '.join(others)})"
        steps.append(
            Step(
                timers.function_sql(rules, kept),
                f"slawatch.event(): {'created' if installed is None else 'updated'} for"
                f" {count} event type{'' if count == 1 else 's'}"
                + (dropped if drop and others else ""),
            )
        )
    held = timers.held_types(conn, types)
    if held:
        known = sorted(held)
        steps.append(
            Step(
                timers.apply_held_sql(known),
                f"slawatch.event_held: applied the held events of {', '.join(map(repr, known))}",
                run=lambda c: timers.apply_held(c, known),
            )
        )
    return steps


def kept_event_types(conn: Connection, rules: list[Rule]) -> list[str]:
    """One line per rule whose event types the installed slawatch.event() keeps though
    ``rules`` lack it (what :func:`migrate` kept)."""
    ours = {r.name for r in timers.event_rules(rules)}
    installed = timers.installed_tags(conn)
    others = [n for n in timers.installed_rules(installed) if n not in ours]
    out = []
    for name, block in timers.installed_blocks(conn, installed, others).items():
        types = timers.block_types(block)
        many = len(types) > 1
        out.append(
            f"kept event type{'s' if many else ''} {', '.join(map(repr, types))} of rule {name}"
            f" (no rule in this folder); pass --drop-event-types to remove"
            f" {'them' if many else 'it'}"
        )
    return out


def event_function_pending(conn: Connection, rules: list[Rule]) -> list[str]:
    """The event rules among ``rules`` that slawatch.event() does not know as they are
    (added or changed since the last migrate): each needs a migrate before it runs.
    Rules not among ``rules`` may be known too: a process may run some of them."""
    if not timers.event_rules(rules):
        return []
    return timers.unknown_rules(timers.installed_tags(conn), rules)


def plan_rule(conn: Connection, rule: Rule, info: TableInfo) -> list[Step]:
    """What one rule needs: tracking columns or its state table, the state of the other
    way to track carried over (a switch of ``track``), then its partial indexes."""
    if rule.track == "table":
        steps = _state_table(conn, rule, info)
    else:
        steps = _tracking_columns(rule, info)
    if rule.events is not None:
        steps.extend(_timer_columns(rule, info))
    steps.extend(_switch(conn, rule, info))
    steps.extend(_leftovers(conn, rule, info))
    wanted, problem = _wanted(conn, rule, info)
    if problem:  # check() ran the same probe; only a concurrent change gets here
        raise ConfigError(f"{rule.source}: open_when: {problem}")
    built = []
    for spec, definition in zip(_all_indexes(rule), wanted, strict=True):
        if spec.name == rule.deadline_index and _made_already(conn, spec, definition):
            continue
        if info.relkind == "p":
            made = _partitioned_index(conn, spec, definition, info.partitions)
        else:
            made = _index(conn, spec, definition)
        if spec.name == rule.deadline_index:  # not one the claim needs
            made = [replace(step, report=True) for step in made]
        built.extend(made)
    steps.extend(built)
    if any(step.statement.startswith("CREATE INDEX") and not step.report for step in built):
        steps.extend(_analyze(conn, rule))
    return steps


def _timer_columns(rule: Rule, info: TableInfo) -> list[Step]:
    """The columns an event rule's timer table gained since it was created."""
    missing = {c: t for c, t in timers.ADDED_COLUMNS.items() if c not in info.columns}
    if not missing:
        return []
    adds = ",".join(f"\n    ADD COLUMN IF NOT EXISTS {quoted(c)} {t}" for c, t in missing.items())
    return [
        Step(
            f"ALTER TABLE {quoted('slawatch', rule.timers)}{adds}",
            f"slawatch.{rule.timers}: added {', '.join(missing)}",
            locked=True,
        )
    ]


def _made_already(conn: Connection, spec: IndexSpec, definition: str) -> bool:
    """The report's index is not built where the operator has the same one already."""
    if index_state(conn, spec.schema, spec.name) is not None:
        return False
    return bool(same_indexes(conn, spec.schema, spec.table, definition))


def _analyze(conn: Connection, rule: Rule) -> list[Step]:
    """ANALYZE of a table that holds rows but has no statistics (just loaded from a dump):
    without them the planner prices the new partial indexes blind, and ``explain`` (or
    the first scans) would read the table whole until autovacuum came by."""
    why = "it had no statistics, which the claim's plan needs"
    tables = without_statistics(conn, rule.schema_name, rule.table_name)
    if not tables and rule.track != "table":
        # Tracking columns just added to a table analyzed before: without their
        # statistics the planner prices the claim's partial indexes blind (a probe
        # or claim that reads the whole table each time, until autovacuum's ANALYZE).
        tables = without_statistics(conn, rule.schema_name, rule.table_name, rule.tracking_columns)
        why = "no statistics of its tracking columns yet, which the claim's plan needs"
    if not tables:
        return []
    where = f"{rule.schema_name}.{rule.table_name}"
    what = (
        ""
        if tables == [(rule.schema_name, rule.table_name)]
        else f" ({len(tables)} partition{'s' if len(tables) > 1 else ''})"
    )
    return [
        Step(
            f"ANALYZE {', '.join(quoted(*t) for t in tables)}",
            f"{where}: analyzed{what}: {why}",
        )
    ]


def _other(rule: Rule) -> Rule:
    """The rule as it was under the other way to track."""
    return rule.model_copy(update={"track": "inline" if rule.track == "table" else "table"})


def _leftovers(conn: Connection, rule: Rule, info: TableInfo) -> list[Step]:
    """Indexes of the other way to track, left by a rule that changed its ``track``: they
    would only cost the application's writes. Dropped after the state was carried over
    (:func:`_switch`): as long as they exist, a switch is unfinished. (Inline's columns
    stay: dropping them takes a strong lock; :func:`leftovers` says how.)"""
    steps = []
    # DROP INDEX CONCURRENTLY cannot drop a partitioned index; this drops its children too.
    partitioned = info.relkind == "p"
    for spec in index_specs(_other(rule)):
        if index_state(conn, spec.schema, spec.name) is not None:
            where = f"{spec.schema}.{spec.table}"
            steps.append(
                Step(
                    spec.drop(concurrently=not partitioned),
                    f"{where}: dropped index {spec.name} (track changed)",
                    locked=partitioned,
                )
            )
    return steps


def _switch(conn: Connection, rule: Rule, info: TableInfo) -> list[Step]:
    """A switch of ``track`` not finished yet (the old track's indexes are still there):
    copy the rule's state over, so that nothing is paged again (slawatch/engine/trackswitch.py).

    inline → table: the watched rows' tracking columns into the state table, and the
    watermark of an earlier ``track: table`` goes, so that the first scan sweeps: it finds
    the rows due that inline had not reached, whatever their deadline.
    table → inline: the state table into the tracking columns, then the state table goes.
    """
    where = f"{rule.schema_name}.{rule.table_name}"
    state = f"slawatch.{rule.name}_state"
    if rule.track == "table":
        if not all(c in info.columns for c in rule.tracking_columns) or not any(
            index_state(conn, s.schema, s.name) for s in index_specs(_other(rule))
        ):
            return []
        return [
            _copy(
                rule, info, "table", f"{where}: rule {rule.name}'s state carried over to {state}"
            ),
            Step(trackswitch.forget_watermark(rule), f"{rule.name}: watermark reset", detail=True),
        ]
    have = inspect_table(conn, "slawatch", f"{rule.name}_state")
    due = index_specs(_other(rule))[0]
    if have is None or index_state(conn, due.schema, due.name) is None:
        return []
    if have.columns != state_columns(rule, info):
        keyed = ", ".join(c for c in have.columns if not c.startswith("sw_"))
        raise ConfigError(
            f"{rule.source}: track: the state in {state} (keyed by {keyed}) cannot be carried"
            f" over to this rule's key ({', '.join(key_columns(rule, info))}) or deadline"
            " type; switch the track back, migrate, then change one at a time"
        )
    return [
        _copy(rule, info, "inline", f"{where}: rule {rule.name}'s state carried over from {state}"),
        Step(
            f"DROP TABLE {quoted('slawatch', rule.name + '_state')}",
            f"{state}: dropped (track: inline)",
        ),
    ]


def _copy(rule: Rule, info: TableInfo, to: trackswitch.Track, done: str) -> Step:
    return Step(
        trackswitch.render(rule, info, to),
        done,
        run=lambda conn: trackswitch.copy(conn, rule, info, to),
    )


def state_columns(rule: Rule, info: TableInfo) -> dict[str, str]:
    """The state table's columns and types: the watched table's key, then slawatch's."""
    columns = {c: info.columns[c] for c in key_columns(rule, info)}
    columns |= {
        "sw_seen": deadline_type_of(rule, info),
        "sw_ep": "integer",
        "sw_n": "integer",
        "sw_next": "timestamp with time zone",
    }
    return columns


def _state_table(conn: Connection, rule: Rule, info: TableInfo) -> list[Step]:
    """slawatch's own table for a ``track: table`` rule, with its re-notify index."""
    name = f"{rule.name}_state"
    table = quoted("slawatch", name)
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
        f"    {quoted(c)} {t}{' NOT NULL' if c in info.columns else defaults.get(c, '')}"
        for c, t in columns.items()
    ]
    keys = ", ".join(quoted(c) for c in key_columns(rule, info))
    steps.append(
        Step(
            f"CREATE TABLE {table} (\n" + ",\n".join(lines) + f",\n    PRIMARY KEY ({keys})\n)",
            f"slawatch.{name}: created",
        )
    )
    steps.append(
        Step(
            f"CREATE INDEX {quoted(name + '_again')} ON {table} (sw_next)"
            " WHERE sw_next IS NOT NULL",
            f"slawatch.{name}: built index {name}_again",
            detail=True,
        )
    )
    return steps


def _tracking_columns(rule: Rule, info: TableInfo) -> list[Step]:
    """Inline tracking: the four columns on the watched table."""
    steps = []
    table = quoted(rule.schema_name, rule.table_name)
    where = f"{rule.schema_name}.{rule.table_name}"
    types = tracking_types(rule, deadline_type_of(rule, info))
    missing = [c for c in types if c not in info.columns]
    if missing:
        adds = ",".join(f"\n    ADD COLUMN IF NOT EXISTS {quoted(c)} {types[c]}" for c in missing)
        steps.append(
            Step(f"ALTER TABLE {table}{adds}", f"{where}: added {', '.join(missing)}", locked=True)
        )
        if rule.n_column in info.columns and rule.seen_column in missing:
            # Rows notified before episodes existed: their notifications so far are
            # episode 1, so they are not paged again from #1.
            steps.append(
                Step(
                    f"UPDATE {table} SET {quoted(rule.seen_column)} = {rule.deadline_sql()},"
                    f" {quoted(rule.episode_column)} = 1\n WHERE {quoted(rule.n_column)} > 0"
                    f" AND {quoted(rule.seen_column)} IS NULL",
                    f"{where}: notified rows became episode 1",
                )
            )
    seen_type = info.columns.get(rule.seen_column)
    if seen_type is not None and seen_type != types[rule.seen_column]:
        steps.append(
            Step(
                f"ALTER TABLE {table} ALTER COLUMN {quoted(rule.seen_column)}"
                f" TYPE {types[rule.seen_column]}",
                f"{where}: {rule.seen_column} now {types[rule.seen_column]} like the deadline",
                locked=True,
            )
        )
    return steps


@dataclass(frozen=True)
class Leftover:
    """What a switch of ``track`` left that slawatch no longer uses, and the statement
    that drops it. migrate never drops a watched table's columns itself: that takes an
    exclusive lock on the table, and the columns cost nothing unindexed."""

    what: str
    statement: str


def leftovers(conn: Connection, rules: list[Rule]) -> list[Leftover]:
    """What each rule's earlier way to track left behind, once migrate is done: inline's
    tracking columns (and any index on them) under ``track: table``; a state table that
    was not carried over (an older slawatch's switch) under ``track: inline``."""
    out = []
    for rule in rules:
        if rule.query is not None:
            continue
        info = inspect_table(conn, rule.schema_name, rule.table_name)
        if info is None:
            continue
        where = f"{rule.schema_name}.{rule.table_name}"
        if rule.track == "table":
            columns = [c for c in rule.tracking_columns if c in info.columns]
            if not columns:
                continue
            ours = {spec.name for spec in index_specs(_other(rule))}  # migrate drops these
            indexes = [
                i
                for i in indexes_on(conn, rule.schema_name, rule.table_name, columns)
                if i not in ours
            ]
            on = f"; index {', '.join(indexes)} on them goes with them" if indexes else ""
            drops = ", ".join(f"DROP COLUMN {quoted(c)}" for c in columns)
            out.append(
                Leftover(
                    f"{where}: left by rule {rule.name}'s track: inline, unused by track:"
                    f" table: columns {', '.join(columns)}{on}. slawatch does not drop"
                    " them; to drop them (a brief exclusive lock, no rewrite):",
                    f"ALTER TABLE {quoted(rule.schema_name, rule.table_name)} {drops};",
                )
            )
            continue
        due = index_specs(_other(rule))[0]
        state = f"{rule.name}_state"
        if (
            inspect_table(conn, "slawatch", state) is not None
            and index_state(conn, due.schema, due.name) is None
        ):
            out.append(
                Leftover(
                    f"slawatch.{state}: left by rule {rule.name}'s track: table, unused by"
                    " track: inline (its state was not carried over); to drop it:",
                    f"DROP TABLE {quoted('slawatch', state)};",
                )
            )
    return out


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
    parent = quoted(spec.schema, spec.name)
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
                f"ALTER INDEX {parent} ATTACH PARTITION {quoted(child.schema, child.name)}",
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
    """What ``migrate`` would still do for ``rule``: empty when it is ready to run (the
    report's index is not needed to run: an upgrade builds it at the next migrate)."""
    return [step.todo for step in plan_rule(conn, rule, info) if not (step.detail or step.report)]


def migrate(conn: Connection, rules: list[Rule], *, drop_event_types: bool = False) -> list[str]:
    """Check, then bring the database in line with ``rules``; returns what was done.
    ``drop_event_types``: remove the event types of rules not among ``rules`` from
    slawatch.event() (else kept: :func:`kept_event_types` names them).

    ``conn`` must be in autocommit mode (CREATE INDEX CONCURRENTLY needs it).
    Nothing is changed when any rule fails its check. Concurrent migrates take turns
    (an advisory lock): the second finds done what the first did.
    """
    return migrate_checked(conn, rules, drop_event_types=drop_event_types)[0]


def migrate_checked(
    conn: Connection, rules: list[Rule], *, drop_event_types: bool = False
) -> tuple[list[str], dict[str, TableInfo]]:
    """:func:`migrate`, and each rule's table as its check found it, its indexes probed
    (as :func:`check` returns them: none for an event rule whose timer table this
    migrate created), for what the same command does next (``migrate --baseline``)
    without probing again: the key, kind and deadline type a migrate leaves as they were.
    """
    with schema.migrate_lock(conn):
        done = []
        tables = check(conn, rules)
        for step in plan(conn, rules, drop_event_types=drop_event_types, tables=tables):
            if step.change is not None:
                if schema.apply(conn, step.change, Clock().now()):
                    done.append(step.done)
                continue
            line = step.done
            with translate(f"migrate: {step.done}"):
                if step.run is not None:
                    line += f" ({step.run(conn):,} rows)"
                elif step.locked:
                    _locked(conn, step.statement)
                else:
                    conn.execute(step.statement.encode())  # SQL text: no parameters
            if not step.detail:
                done.append(line)
        return done, tables


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


_ANALYZE_NOTE = (
    "-- (statistics for the claim's plan; against a database, migrate analyzes only a"
    " table\n-- that holds rows but has none)"
)


def _printed(step: Step) -> str:
    """A step as psql runs it; a locking one bounded by lock_timeout, as migrate runs it."""
    if step.change is not None:
        return schema.printed(step.change)
    if not step.locked:
        return step.statement + ";"
    return f"SET lock_timeout = '{LOCK_TIMEOUT}';\n{step.statement};\nRESET lock_timeout;"


def render(
    rules: list[Rule], steps: list[Step] | None = None, left: list[Leftover] | None = None
) -> str:
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
        out.extend(_printed_schema(schema.every_change()))
        if _converts_outbox():
            out.append("-- The outbox into id ranges, in one transaction (nothing once done)")
            out.append(CONVERT_ALL + ";")
            out.append("")
        for rule in rules:
            if rule.events is not None:
                out.append(f"-- rule {rule.name} ({rule.source}): its timers")
                out.extend(s + ";" for s in timers.create_table(rule))
                out.extend(spec.create() + ";" for spec in index_specs(rule))
                out.append("")
                continue
            out.append(f"-- rule {rule.name} ({rule.source}) on {rule.table}")
            if rule.track == "table":
                out.append(
                    f"-- track: table: slawatch.{rule.name}_state takes the types of the"
                    " table's key: print against the database for it."
                )
                out.extend(_printed_indexes(rule))
                continue
            out.append(
                f"-- (tracking columns; {rule.seen_column} has the type of {rule.deadline}:"
                " timestamptz here, timestamp if the deadline is timestamp)"
            )
            types = tracking_types(rule, "timestamptz")
            adds = ",".join(
                f"\n    ADD COLUMN IF NOT EXISTS {quoted(c)} {t}" for c, t in types.items()
            )
            alter = f"ALTER TABLE {quoted(rule.schema_name, rule.table_name)}{adds}"
            out.append(_printed(Step(alter, "", locked=True)))
            out.extend(_printed_indexes(rule))
        if timers.event_rules(rules):
            out.append("-- The event functions (regenerated whenever the event rules change)")
            out.append(timers.function_sql(rules) + ";")
            out.append("")
        made = [d for d in (probe_definition(rule, None) for rule in rules) if d is not None]
        if made:
            out.append("-- Each rule's probe, as a function (planned once per server connection)")
            out.extend(f"{d.drop_other()};\n{d.create()};" for d in made)
            out.append("")
        if _records_generations():
            out.append("-- Each rule's definition, recorded last (instances running another")
            out.append("-- definition stop claiming the rule until reloaded)")
            out.extend(
                _printed(Step(generation.record_statement(rule), "", locked=True)) for rule in rules
            )
            out.append("")
        out.append(
            "-- A partitioned table needs each index ON ONLY the parent, built CONCURRENTLY\n"
            "-- in each partition and attached: print against the database for that."
        )
    elif not steps:
        out.append("-- The database is up to date: nothing to change.")
    else:
        changes = [step.change for step in steps if step.change is not None]
        if changes:
            out.extend(_printed_schema(changes))
        for step in steps:
            if step.change is None:
                out.append(f"-- {step.done}")
                out.append(_printed(step))
    if left:
        out.append("")
        out.append("-- Left by a switch of track, unused now (not dropped by this script):")
        for item in left:
            out.append(f"-- {item.what}")
            out.append(f"--   {item.statement}")
    out.append("")
    out.append("-- Least privilege: what the role slawatch runs as needs (name yours; create")
    out.append("-- it first, e.g. CREATE ROLE slawatch_app LOGIN). slawatch also needs TEMP on")
    out.append("-- the database (PUBLIC has it by default): its start-up check builds the")
    out.append("-- rules' indexes on empty temporary copies of the tables.")
    out.extend(g.as_string(None) + ";" for g in grants(rules))
    if timers.event_rules(rules):
        out.append("-- The application's role, to send events from its own transactions")
        out.append("-- (slawatch.event runs with its owner's rights: nothing else is needed):")
        out.append(
            f"GRANT USAGE ON SCHEMA slawatch TO your_app_role;\n"
            f"GRANT EXECUTE ON FUNCTION slawatch.event({timers.SIGNATURE}) TO your_app_role;"
        )
    return "\n".join(out) + "\n"


def _printed_indexes(rule: Rule) -> list[str]:
    """A rule's indexes rebuilt, then its table analyzed (a script made without a
    database cannot know whether the table has statistics)."""
    out = []
    for spec in _all_indexes(rule):
        out.append(spec.drop() + ";")
        out.append(spec.create() + ";")
    table = quoted(rule.schema_name, rule.table_name)
    return [*out, _ANALYZE_NOTE, f"ANALYZE {table};", ""]


def _printed_schema(changes: list[Change]) -> list[str]:
    """slawatch's schema changes as script lines: the record's table, then each change."""
    out = [
        "-- slawatch's schema: numbered migrations, each recorded in slawatch.schema_version.",
        schema.printed_bootstrap(),
        "",
    ]
    for change in changes:
        out += [schema.printed(change), ""]
    return out
