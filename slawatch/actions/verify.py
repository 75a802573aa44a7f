"""``slawatch check`` with a database: can the role slawatch runs as run each rule's
action (docs/explanation/actions.md)?

The server decides, not a reading of the statement: each statement is planned with
``EXPLAIN`` (never run), its placeholders bound to NULL, as the connected role,
inside a transaction that is rolled back, as the role the action runs as
(``action.role``, SLAWATCH_ACTION_ROLE) when it has one. Planning checks every privilege the
statement needs (column UPDATE and SELECT, INSERT, DELETE, function EXECUTE) and
that its tables, columns and functions exist, so a refusal is found here rather
than at 3 a.m. as a ``failed`` attempt. What it cannot see: privileges used only
when rows are touched (a sequence's ``nextval`` in a column default, what a
trigger or the called function does inside).

A ``track: table`` rule promises never to write the watched table; its action may,
and :func:`writes_watched` says when it does.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from slawatch.config.needs import needs
from slawatch.config.rules import OWN_SCHEMA, Rule
from slawatch.db import Connection, attempt, translate


@dataclass(frozen=True)
class Refused:
    """A rule whose action the role cannot run, and the server's reason."""

    rule: str
    reason: str


def refused(conn: Connection, rules: list[Rule]) -> list[Refused]:
    """The rules (with an action) whose statement the connected role cannot run."""
    reasons: dict[int, str] = {}  # by the rule's place in ``rules``
    planned: list[tuple[int, Rule]] = []  # the rules whose statement plans
    for i, rule in enumerate(rules):
        if rule.action is None or rule.action.sql is None:
            continue
        params = dict.fromkeys(rule.action.placeholders)
        explain = "EXPLAIN " + rule.action.statement
        with translate(f"checking the action of rule {rule.name}"), conn.transaction():
            reason = _as_role(conn, rule.action.role)
            if reason is None:
                # Nothing runs (EXPLAIN only plans), and the transaction is rolled back.
                _, reason = attempt(conn, explain, params, max_rows=1_000_000_000)
            raise psycopg.Rollback()
        if reason is not None:
            reasons[i] = reason
        else:
            planned.append((i, rule))
    reasons |= _resolved_past(conn, planned)
    return [Refused(rules[i].name, reasons[i]) for i in sorted(reasons)]


def _as_role(conn: Connection, role: str | None) -> str | None:
    """In a transaction, become the role an action runs as, if it names one (SET LOCAL:
    the transaction's end undoes it); why not, or None."""
    if role is None:
        return None
    _, reason = attempt(conn, "SELECT set_config('role', %(role)s, true)", {"role": role}, 1)
    return None if reason is None else f"cannot run as role {role}: {reason}"


# Of the tables named without a schema (w, each of rule r), those that resolve to
# slawatch's own schema or a system catalog: each rule's first (in the database's order).
_PAST = (
    "SELECT DISTINCT ON (r) r, w, quote_ident(n.nspname) || '.' || quote_ident(c.relname),"
    " n.nspname"
    " FROM unnest(%(rules)s::int[], %(written)s::text[]) AS u(r, w)"
    " JOIN pg_class c ON c.oid = to_regclass(quote_ident(w))"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname IN (%(own)s, 'information_schema') OR n.nspname LIKE 'pg\\_%%'"
    " ORDER BY r, w"
)


def _resolved_past(conn: Connection, rules: list[tuple[int, Rule]]) -> dict[int, str]:
    """Of ``rules`` (each with its place), why a table an action names without a schema
    is not the application's, as the role the action runs as resolves it (its search
    path: a role named ``slawatch`` finds slawatch's own schema first, under the default
    ``"$user", public``; a schema the role may not use is passed over), by place. One
    statement for all the rules that run as one role, in a transaction as that role. A
    name written with its schema was read as rules load (rules.unsafe_objects)."""
    by_role: dict[str | None, list[tuple[int, str]]] = {}
    for i, rule in rules:
        assert rule.action is not None and rule.action.sql is not None
        bare = {n.name for n in needs(rule.action.sql) if n.schema is None and not n.function}
        by_role.setdefault(rule.action.role, []).extend((i, name) for name in sorted(bare))
    out: dict[int, str] = {}
    for role, named in by_role.items():
        if not named:
            continue
        params = {
            "rules": [i for i, _ in named],
            "written": [w for _, w in named],
            "own": OWN_SCHEMA,
        }
        with translate("resolving the tables of the rules' actions"), conn.transaction():
            reason = _as_role(conn, role)  # as it was a moment ago, for each rule
            rows = [] if reason is not None else conn.execute(_PAST, params).fetchall()
            raise psycopg.Rollback()
        if reason is not None:
            out |= dict.fromkeys((i for i, _ in named), reason)
        for i, written, table, schema in rows:
            what = "slawatch's own table" if schema == OWN_SCHEMA else "a system catalog"
            out[i] = (
                f"{written} is {table} through the search path, {what}: name the"
                " application's table with its schema"
            )
    return out


def writes_watched(conn: Connection, rule: Rule) -> bool:
    """Whether ``rule``'s action writes (INSERT, UPDATE, DELETE) the table it watches,
    as the server resolves both names (a called function is not looked into)."""
    if rule.action is None or rule.action.sql is None or rule.events is not None:
        return False
    written = [
        sql.Identifier(*([n.schema, n.name] if n.schema else [n.name])).as_string(conn)
        for n in needs(rule.action.sql)
        if n.privilege in ("INSERT", "UPDATE", "DELETE")
    ]
    watched = sql.Identifier(rule.schema_name, rule.table_name).as_string(conn)
    with translate(f"resolving the tables of rule {rule.name}"):
        row = conn.execute(
            "SELECT to_regclass(%s) = ANY (ARRAY(SELECT to_regclass(w) FROM unnest(%s::text[]) w))",
            (watched, written),
        ).fetchone()
    return bool(row and row[0])
