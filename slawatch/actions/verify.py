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

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from slawatch.config.needs import needs
from slawatch.config.rules import OWN_SCHEMA, Rule
from slawatch.db import Connection, describe, translate, unreachable


@dataclass(frozen=True)
class Refused:
    """A rule whose action the role cannot run, and the server's reason."""

    rule: str
    reason: str


# Rules planned in one transaction: planning locks each table and index it reads until
# the transaction ends, and thousands of rules' tables and indexes in one could ask for
# more locks than the server's shared lock table holds by default
# (max_locks_per_transaction 64 x max_connections), and would hold them all meanwhile.
PER_TRANSACTION = 100
_SET_ROLE = "SELECT set_config('role', %(role)s, true)"
_OK = (psycopg.pq.ExecStatus.TUPLES_OK, psycopg.pq.ExecStatus.COMMAND_OK)


def refused(conn: Connection, rules: list[Rule]) -> list[Refused]:
    """The rules (with an action) whose statement the connected role cannot run.

    ``conn``: an autocommit connection (:func:`slawatch.db.connect`'s): the statements are
    sent in one request (pipelined), a transaction per role and per :data:`PER_TRANSACTION`
    rules (``BEGIN``, ``SET LOCAL`` of the role, the ``EXPLAIN`` of each, ``ROLLBACK``),
    not five statements and round trips a rule. An ``EXPLAIN`` the server refuses fails
    the rest of the request (it skips what follows, to the request's end): the rules
    before it planned, it is refused with the server's reason, and the rules after it go
    in a request of their own. So each rule's verdict is its own, as if it were checked
    alone, and a refusal costs a round trip.
    """
    if not conn.autocommit:
        raise ValueError("refused(): an autocommit connection (it sends BEGIN and ROLLBACK)")
    reasons: dict[int, str] = {}  # by the rule's place in ``rules``
    planned: list[tuple[int, Rule]] = []  # the rules whose statement plans
    todo = [(i, r) for i, r in enumerate(rules) if r.action is not None and r.action.sql]
    roles = list(dict.fromkeys(_role(r) for _, r in todo))
    todo.sort(key=lambda pair: roles.index(_role(pair[1])))  # a role's rules together
    try:
        while todo:
            went, reason = _explain_until_refused(conn, todo)
            planned += todo[:went]
            if reason is None:
                break
            (i, rule), todo = todo[went], todo[went + 1 :]
            reasons[i] = reason
            if reason.startswith(_AS_ROLE):  # so is every rule of that role (one by one, too)
                reasons |= {j: reason for j, r in todo if _role(r) == _role(rule)}
                todo = [(j, r) for j, r in todo if _role(r) != _role(rule)]
    finally:
        _end_failed(conn)
    reasons |= _resolved_past(conn, sorted(planned, key=lambda pair: pair[0]))
    return [Refused(rules[i].name, reasons[i]) for i in sorted(reasons)]


_AS_ROLE = "cannot run as role "


def _role(rule: Rule) -> str | None:
    return rule.action.role if rule.action is not None else None


def _explain_until_refused(
    conn: Connection, todo: list[tuple[int, Rule]]
) -> tuple[int, str | None]:
    """:func:`refused`'s one request: ``EXPLAIN`` of each of ``todo`` (a role's rules
    together), placeholders bound to NULL (nothing runs: EXPLAIN only plans, and each
    transaction is rolled back). How many planned, from the first; and why the next did
    not (None when all did): the server's reason, or that it cannot run as its role."""
    sent: list[psycopg.Cursor[Any]] = []
    whose: list[tuple[int | None, bool]] = []  # each one's rule (its place), whether its role
    left_failed = _failed(conn)  # the transaction a refusal before left

    def queue(statement: str, params: dict[str, Any] | None = None, n: int | None = None) -> None:
        whose.append((n, statement == _SET_ROLE))
        _send(conn, statement, params, sent)

    def send() -> None:
        if left_failed:
            queue("ROLLBACK")
        for n, (_, rule) in enumerate(todo):
            assert rule.action is not None and rule.action.sql is not None
            role = rule.action.role
            if n % PER_TRANSACTION == 0 or role != _role(todo[n - 1][1]):
                if n:
                    queue("ROLLBACK")
                queue("BEGIN")
                if role is not None:
                    queue(_SET_ROLE, {"role": role}, n)
            queue("EXPLAIN " + rule.action.statement, dict.fromkeys(rule.action.placeholders), n)
        queue("ROLLBACK")

    error = _request(conn, send)
    if error is None:
        return len(todo), None
    failed = next((k for k, cur in enumerate(sent) if not _answered(cur)), None)
    at, as_role = (None, False) if failed is None else whose[failed]
    if at is None or unreachable(error) or conn.broken:
        with translate(f"checking the action of rule {todo[0][1].name}"):
            raise error  # the connection's, not a rule's
    reason = describe(error)
    return at, f"{_AS_ROLE}{_role(todo[at][1])}: {reason}" if as_role else reason


def _request(conn: Connection, send: Callable[[], None]) -> psycopg.Error | None:
    """Run the statements ``send`` sends (:func:`_send`) as one request (pipelined): the
    first error, which fails the rest of the request (the server skips what follows it,
    to the request's end), or None."""
    first: psycopg.Error | None = None
    try:
        with _pipeline(conn):
            try:
                send()
            except psycopg.Error as exc:  # seen as the request went: send no more
                first = exc
    except psycopg.Error as exc:  # at the end of the request
        first = first or exc
    return first


def _pipeline(conn: Connection) -> contextlib.AbstractContextManager[Any]:
    """One request for the statements sent inside (without pipeline mode, a libpq older
    than 14: each its own)."""
    return conn.pipeline() if psycopg.Pipeline.is_supported() else contextlib.nullcontext()


def _send(
    conn: Connection,
    statement: str,
    params: dict[str, Any] | None = None,
    sent: list[psycopg.Cursor[Any]] | None = None,
) -> None:
    """Send ``statement`` (in a pipeline: queue it), its cursor added to ``sent`` first:
    its error may come back as it is sent. Never prepared: an action's statement is
    planned once, and BEGIN has nothing to plan."""
    cur = conn.cursor()
    if sent is not None:
        sent.append(cur)
    cur.execute(statement, params, prepare=False)


def _answered(cur: psycopg.Cursor[Any]) -> bool:
    return cur.pgresult is not None and cur.pgresult.status in _OK


def _failed(conn: Connection) -> bool:
    """Whether a transaction is open: one a refused statement left (failed)."""
    return not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


def _end_failed(conn: Connection) -> None:
    """Roll back the transaction a refused statement left (failed), if one is open."""
    if _failed(conn):
        _send(conn, "ROLLBACK")


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
        reason, rows = _past_as(conn, role, params)
        if reason is not None:
            out |= dict.fromkeys((i for i, _ in named), reason)
        for i, written, table, schema in rows:
            what = "slawatch's own table" if schema == OWN_SCHEMA else "a system catalog"
            out[i] = (
                f"{written} is {table} through the search path, {what}: name the"
                " application's table with its schema"
            )
    return out


def _past_as(
    conn: Connection, role: str | None, params: dict[str, Any]
) -> tuple[str | None, list[tuple[Any, ...]]]:
    """:data:`_PAST` as ``role`` (BEGIN, the role, the statement, ROLLBACK: one request):
    its rows, or why it cannot run as the role (as a moment ago, for each rule)."""
    sent: list[psycopg.Cursor[Any]] = []

    def send() -> None:
        _send(conn, "BEGIN", None, sent)
        if role is not None:
            _send(conn, _SET_ROLE, {"role": role}, sent)
        _send(conn, _PAST, params, sent)
        _send(conn, "ROLLBACK", None, sent)

    error = _request(conn, send)
    _end_failed(conn)
    if error is None:
        return None, sent[-2].fetchall()
    failed = next((cur for cur in sent if not _answered(cur)), None)
    if role is None or failed is not sent[1] or unreachable(error) or conn.broken:
        with translate("resolving the tables of the rules' actions"):
            raise error
    return f"{_AS_ROLE}{role}: {describe(error)}", []


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
