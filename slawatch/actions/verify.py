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
    out: list[Refused] = []
    for rule in rules:
        if rule.action is None or rule.action.sql is None:
            continue
        params = dict.fromkeys(rule.action.placeholders)
        explain = "EXPLAIN " + rule.action.statement
        with translate(f"checking the action of rule {rule.name}"), conn.transaction():
            reason = None
            if rule.action.role is not None:
                # As the role the action runs as (SET LOCAL: the rollback undoes it).
                _, reason = attempt(
                    conn, "SELECT set_config('role', %(role)s, true)", {"role": rule.action.role}, 1
                )
                if reason is not None:
                    reason = f"cannot run as role {rule.action.role}: {reason}"
            if reason is None:
                # Nothing runs (EXPLAIN only plans), and the transaction is rolled back.
                _, reason = attempt(conn, explain, params, max_rows=1_000_000_000)
            if reason is None:
                reason = _resolved_past(conn, rule)
            raise psycopg.Rollback()
        if reason is not None:
            out.append(Refused(rule.name, reason))
    return out


def _resolved_past(conn: Connection, rule: Rule) -> str | None:
    """Why a table the action names without a schema is not the application's, as the
    role the action runs as resolves it (its search path: a role named ``slawatch``
    finds slawatch's own schema first, under the default ``"$user", public``), or None.
    A name written with its schema was read as rules load (rules.unsafe_objects)."""
    assert rule.action is not None and rule.action.sql is not None
    bare = sorted({n.name for n in needs(rule.action.sql) if n.schema is None and not n.function})
    if not bare:
        return None
    row = conn.execute(
        "SELECT w, quote_ident(n.nspname) || '.' || quote_ident(c.relname), n.nspname"
        " FROM unnest(%s::text[]) w"
        " JOIN pg_class c ON c.oid = to_regclass(quote_ident(w))"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname IN (%s, 'information_schema') OR n.nspname LIKE 'pg\\_%%'"
        " ORDER BY 1 LIMIT 1",
        (bare, OWN_SCHEMA),
    ).fetchone()
    if row is None:
        return None
    written, table, schema = row
    what = "slawatch's own table" if schema == OWN_SCHEMA else "a system catalog"
    return (
        f"{written} is {table} through the search path, {what}: name the application's"
        " table with its schema"
    )


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
