"""What an action's statement needs of the database (docs/explanation/actions.md): the privileges,
read from PostgreSQL's parse tree (pglast), so ``migrate --print`` can print the
GRANTs a least-privilege role (the action's own, docs/explanation/safety.md)
needs for it.

An UPDATE needs UPDATE on the columns it sets and SELECT on the columns it reads
(its WHERE, its SET expressions, RETURNING); a DELETE needs DELETE and SELECT on
what it reads; an INSERT needs INSERT on the columns it names (the table, when it
names none), and UPDATE for ``ON CONFLICT DO UPDATE``; ``SELECT fn(...)`` needs
EXECUTE on the function. Any other table the statement reads (``FROM``,
``USING``, a subquery) needs SELECT, and then the written table's reads are
granted on the whole table, since an unqualified column could be either's.

``check`` with a database does not trust this reading: it has the server plan the
statement as the role (slawatch/actions/verify.py), which checks every privilege.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from slawatch.config.rules import action_numbered, action_statement, walk

Privilege = Literal["SELECT", "INSERT", "UPDATE", "DELETE", "EXECUTE"]


@dataclass(frozen=True)
class Need:
    """One privilege on one table (``columns`` empty: the whole table) or function."""

    privilege: Privilege
    schema: str | None  # as written: None resolves through the search_path
    name: str
    columns: tuple[str, ...] = field(default=())
    function: bool = False


def numbered(text: str) -> str:
    """The action's ``text`` as the server parses it: each ``:name`` as ``$n``, in
    the order of :attr:`Action.placeholders`."""
    return action_numbered(*action_statement(text))


def needs(text: str) -> list[Need]:
    """The privileges the action statement ``text`` (already checked) needs."""
    import pglast
    from pglast import ast

    stmt: Any = pglast.parse_sql(numbered(text))[0].stmt
    if isinstance(stmt, ast.SelectStmt):  # SELECT fn(...)
        call = stmt.targetList[0].val  # type: ignore[index]
        parts = [p.sval for p in call.funcname]
        schema, name = (parts[-2], parts[-1]) if len(parts) > 1 else (None, parts[-1])
        out = [Need("EXECUTE", schema, name, function=True)]
        return out + _other_reads(stmt, None) + _calls(stmt, call)
    return _dml_needs(stmt) + _calls(stmt, None)


def query_needs(text: str) -> list[Need]:
    """The privileges a query rule's SELECT (already checked) needs: SELECT on each
    table or view it reads (a view's own tables are read with its owner's rights), not
    on the names of its ``WITH`` queries; EXECUTE on a function it calls by a
    schema-qualified name."""
    import pglast
    from pglast import ast

    stmt: Any = pglast.parse_sql(text)[0].stmt
    ctes = {str(n.ctename) for n in walk(stmt) if isinstance(n, ast.CommonTableExpr)}
    reads = [n for n in _other_reads(stmt, None) if n.schema is not None or n.name not in ctes]
    return reads + _calls(stmt, None)


def _calls(stmt: Any, top: Any) -> list[Need]:
    """EXECUTE on each function the statement calls by a schema-qualified name outside
    pg_catalog (besides ``top``, the ``SELECT fn(...)`` itself). An unqualified one is
    taken as PostgreSQL's own, which PUBLIC may run; ``check`` with a database plans
    the statement as the role and names one it may not."""
    from pglast import ast

    seen: dict[tuple[str, str], None] = {}
    for node in walk(stmt):
        if isinstance(node, ast.FuncCall) and node is not top:
            parts = [str(p.sval) for p in node.funcname or () if isinstance(p, ast.String)]
            if len(parts) > 1 and parts[-2] != "pg_catalog":
                seen[(parts[-2], parts[-1])] = None
    return [Need("EXECUTE", s, n, function=True) for s, n in seen]


def _dml_needs(stmt: Any) -> list[Need]:
    """The privileges of an INSERT, UPDATE or DELETE."""
    from pglast import ast

    target = stmt.relation
    schema, name = target.schemaname, target.relname
    alias = target.alias.aliasname if target.alias else name
    out = []
    reads: list[Any] = [getattr(stmt, "whereClause", None), _returning(stmt)]
    if isinstance(stmt, ast.UpdateStmt):
        out.append(Need("UPDATE", schema, name, _names(stmt.targetList)))
        reads += [rt.val for rt in stmt.targetList or ()]
    elif isinstance(stmt, ast.DeleteStmt):
        out.append(Need("DELETE", schema, name))
    else:  # InsertStmt
        out.append(Need("INSERT", schema, name, _names(stmt.cols)))
        conflict = stmt.onConflictClause
        if conflict is not None:
            if conflict.infer is not None:
                inferred = [e.name for e in conflict.infer.indexElems or () if e.name]
                out.append(Need("SELECT", schema, name, tuple(dict.fromkeys(inferred))))
            if conflict.targetList:
                out.append(Need("UPDATE", schema, name, _names(conflict.targetList)))
                reads += [conflict.whereClause, *(rt.val for rt in conflict.targetList)]
    others = _other_reads(stmt, target)
    if others:
        # An unqualified column could be the written table's or another's: all of it.
        out.append(Need("SELECT", schema, name))
    else:
        columns = _columns(reads, alias, name)
        if columns is None or columns:
            out.append(Need("SELECT", schema, name, columns or ()))
    return out + others


def _names(targets: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(rt.name for rt in targets or () if rt.name))


def _returning(stmt: Any) -> Any:
    # pglast for PostgreSQL 18 wraps RETURNING in a node; earlier ones keep a list.
    clause = getattr(stmt, "returningClause", None)
    if clause is not None:
        return clause.exprs
    return getattr(stmt, "returningList", None)


def _columns(nodes: list[Any], alias: str, name: str) -> tuple[str, ...] | None:
    """The written table's columns that ``nodes`` read (``excluded.x`` is the row
    being inserted, not the table); None: all of them (``t.*``)."""
    from pglast import ast

    out: list[str] = []
    for node in walk(nodes):
        if not isinstance(node, ast.ColumnRef) or not node.fields:
            continue
        fields = [f.sval if isinstance(f, ast.String) else None for f in node.fields]
        if len(fields) > 1 and fields[-2] not in (alias, name):
            continue
        if fields[-1] is None:  # t.*: every column
            return None
        out.append(fields[-1])
    return tuple(sorted(set(out)))


def _other_reads(stmt: Any, target: Any) -> list[Need]:
    """SELECT on every table the statement reads besides the one it writes."""
    from pglast import ast

    seen: dict[tuple[str | None, str], None] = {}
    for node in walk(stmt):
        if isinstance(node, ast.RangeVar) and node is not target:
            seen[(node.schemaname, str(node.relname))] = None
    return [Need("SELECT", s, n) for s, n in seen]
