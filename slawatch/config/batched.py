"""An action's statement in set form (docs/explanation/actions.md): one statement that runs the
action for a whole batch of alerts, each placeholder read from a list of the
batch's values, and says how many rows it touched for each alert.

For ``update t set ... where id = :id`` the set form is::

    WITH slawatch_p AS (SELECT u.ord, CAST(u.a1 AS bigint) AS a1 FROM unnest(...) u ...),
         slawatch_m AS (SELECT slawatch_p.ord FROM t, slawatch_p WHERE t.id = slawatch_p.a1),
         slawatch_d AS (UPDATE t SET ... FROM slawatch_p WHERE t.id = slawatch_p.a1
                        RETURNING slawatch_p.ord),
         slawatch_c (ord, count) AS (SELECT ord, count(*) FROM slawatch_d GROUP BY ord
                                   UNION ALL SELECT NULL, count(*) FROM slawatch_m)
    SELECT ord, count FROM slawatch_c

Each row with an ``ord`` is one alert's count; the row without is a second count
of the same total, taken another way. They differ when the counts cannot be
told apart per alert: an UPDATE or DELETE whose target row matched two alerts
(it runs once where one by one it would run twice), an INSERT ... ON CONFLICT
that skipped a row. Then the caller rolls the statement back and runs the batch
one by one (slawatch/actions/run.py).

- UPDATE / DELETE: the batch joins as one more ``FROM`` / ``USING`` item; the
  second count is the join's size before the statement (same snapshot).
- INSERT: its ``VALUES`` or ``SELECT`` runs once per alert (``LATERAL``) into a
  materialized list; each alert's count is its rows there, the second count the
  rows the INSERT returned.
- ``SELECT fn(...)``: called once per alert (materialized); both counts are its rows.

:func:`set_form` is pure (PostgreSQL's parser, pglast); the placeholders' types
are the server's to say when it runs (``PREPARE`` of the one-row statement), so a
value is read exactly as the one-row statement's parameter would be.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# The batch's relation, and the names the set form adds (none a user would write).
P = "slawatch_p"
# The statement's final SELECT: one row per alert that touched rows, and the total.
COUNTS = f" SELECT ord, count FROM {P}_c"


@dataclass(frozen=True)
class SetForm:
    """The set form of one action statement: ``body`` is CTEs that follow ``WITH
    slawatch_p AS (...),`` (see :func:`batch_relation`), the last ``slawatch_p_c (ord,
    count)``: the counts (see the module's doc) that :data:`COUNTS` reads, or a CTE
    the caller adds (the records of slawatch/actions/run.py); ``%`` already doubled
    for psycopg."""

    body: str
    # How many placeholders (the batch relation's columns a1..an, in order).
    arity: int


def set_form(statement: str, names: list[str]) -> SetForm | None:
    """The set form of ``statement`` (``%(name)s`` placeholders, ``%`` doubled, as
    ``Action.statement``) with ``names`` its placeholders in order; None when this
    shape has none (then it runs one by one)."""
    import pglast
    from pglast import ast
    from pglast.stream import RawStream

    if P in statement.lower():
        return None  # the statement's own name for something: leave it alone
    plain = statement.replace("%%", "\x00")
    for i, name in enumerate(names, 1):
        plain = plain.replace(f"%({name})s", f"({P}.a{i})")
    plain = plain.replace("\x00", "%")
    try:
        statements = pglast.parse_sql(plain)
    except pglast.parser.ParseError:
        return None
    if len(statements) != 1:
        return None  # not one statement: the rule's check says so
    stmt: Any = statements[0].stmt

    def parsed(text: str) -> Any:
        return pglast.parse_sql(text)[0].stmt

    batch = parsed(f"SELECT FROM {P}").fromClause[0]

    def deparse(node: Any) -> str:
        return str(RawStream()(node))  # a stream keeps what it printed: one each

    if isinstance(stmt, ast.UpdateStmt | ast.DeleteStmt):
        items = "fromClause" if isinstance(stmt, ast.UpdateStmt) else "usingClause"
        others = tuple(getattr(stmt, items) or ())
        setattr(stmt, items, (*others, batch))
        stmt.returningClause = parsed(f"DELETE FROM x RETURNING {P}.ord").returningClause
        matched = parsed(f"SELECT {P}.ord")
        matched.fromClause = (stmt.relation, *others, batch)
        matched.whereClause = stmt.whereClause
        body = (
            f"{P}_m AS ({deparse(matched)}), {P}_d AS ({deparse(stmt)}),"
            f" {P}_c (ord, count) AS (SELECT ord, count(*) FROM {P}_d GROUP BY ord"
            f" UNION ALL SELECT NULL, count(*) FROM {P}_m)"
        )
    elif isinstance(stmt, ast.InsertStmt):
        source = stmt.selectStmt
        if source is None or any(isinstance(n, ast.SetToDefault) for n in _nodes(source)):
            return None  # DEFAULT VALUES, or DEFAULT in VALUES: only an INSERT's own
        if any(_mentions(n, P) for n in _nodes(stmt.onConflictClause)):
            return None  # the batch is not in scope there
        rows = f"SELECT {P}.ord, {P}_r AS r FROM {P} CROSS JOIN LATERAL ({deparse(source)}) {P}_r"
        stmt.selectStmt = parsed(f"SELECT ({P}_s.r).* FROM {P}_s")
        stmt.returningClause = parsed("DELETE FROM x RETURNING 1").returningClause
        body = (
            f"{P}_s AS MATERIALIZED ({rows}), {P}_d AS ({deparse(stmt)}),"
            f" {P}_c (ord, count) AS (SELECT ord, count(*) FROM {P}_s GROUP BY ord"
            f" UNION ALL SELECT NULL, count(*) FROM {P}_d)"
        )
    elif isinstance(stmt, ast.SelectStmt) and len(targets := stmt.targetList or ()) == 1:
        call = deparse(targets[0].val)
        body = (
            f"{P}_s AS MATERIALIZED (SELECT {P}.ord, {call} AS v FROM {P}),"
            f" {P}_c (ord, count) AS (SELECT ord, count(*) FROM {P}_s GROUP BY ord"
            f" UNION ALL SELECT NULL, count(*) FROM {P}_s)"
        )
    else:
        return None
    return SetForm(body.replace("%", "%%"), len(names))


def batch_relation(types: list[str]) -> str:
    """``slawatch_p AS (...)``: the batch as rows (ord, a1, ..., an), each ``a`` read
    from text as ``types`` (the server's names for the one-row statement's
    parameter types). Parameters: ``ord`` (int[]) and ``a1``...``an`` (text[])."""
    # Each array behind a sub-SELECT (an InitPlan, run once): the planner then counts
    # on a few rows, not the batch's 1,000, and joins the batch to the target through
    # its index (a nested loop) rather than hashing a small target table whole: 26 ms
    # of 50,000 rows for 1,000 alerts. A target without a usable index is still hashed.
    arrays = ", ".join(
        [
            "(SELECT %(ord)s::int[])",
            *(f"(SELECT %(a{i})s::text[])" for i in range(1, len(types) + 1)),
        ]
    )
    names = ", ".join(["ord", *(f"a{i}" for i in range(1, len(types) + 1))])
    cols = ", ".join(["u.ord", *(f"CAST(u.a{i} AS {t}) AS a{i}" for i, t in enumerate(types, 1))])
    return f"{P} AS (SELECT {cols} FROM unnest({arrays}) AS u({names}))"


def _mentions(node: object, name: str) -> bool:
    from pglast import ast

    if isinstance(node, ast.ColumnRef):
        first = (node.fields or (None,))[0]
        return isinstance(first, ast.String) and first.sval == name
    return isinstance(node, ast.RangeVar) and node.relname == name


def _nodes(node: object) -> Iterator[object]:
    """Every AST node below ``node``, itself included."""
    from pglast import ast

    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple | list):
            stack.extend(item)
        elif isinstance(item, ast.Node):
            yield item
            stack.extend(getattr(item, slot) for slot in getattr(item, "__slots__", ()))
