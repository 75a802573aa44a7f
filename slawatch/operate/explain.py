"""``slawatch explain RULE``: the claim's plan, and whether it reads the watched table whole.

The statement explained is the one ``slawatch run`` executes (``ready.prepare``),
with the parameters of a scan at ``now``: inline, the claim; ``track: table``,
the claim of a scan between sweeps (fresh rows from the watermark's look-back
on) and the sweep's close. With ``SLAWATCH_OUTBOX=rows`` they are the statements that
write the outbox in rows (docs/explanation/outbox-rows.md), as ``slawatch run`` with it.

A sequential scan of the watched table is what the partial indexes are there
to prevent, and fails the check, with one exception: a table so small that the
planner rightly prefers to read it (:data:`SMALL_PAGES`), as long as the plan
with sequential scans discouraged shows the indexes can serve it. A large
table read whole, or a plan that has no other way, fails.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from psycopg import sql
from pydantic import BaseModel, Field

from slawatch.config.durations import format_duration
from slawatch.config.rules import Rule
from slawatch.config.settings import DEFAULT_OUTBOX, Outbox
from slawatch.db import Connection, translate
from slawatch.engine.catalog import TableInfo, inspect_table
from slawatch.engine.claim import ClaimPlan
from slawatch.engine.ready import prepare_ready
from slawatch.engine.statetable import lookback
from slawatch.errors import ConfigError

# 128 pages of 8 kB: 1 MB, read in about a millisecond.
SMALL_PAGES = 128


class StatementPlan(BaseModel):
    """One statement of a scan and the planner's plan for it."""

    name: str = Field(description="claim | sweep")
    sql: str
    params: dict[str, str]
    text: str = Field(description="EXPLAIN's text form")
    plan: dict[str, Any] = Field(description="EXPLAIN (FORMAT JSON, VERBOSE)'s top node")
    indexes: list[str] = Field(description="indexes the plan reads on the watched table")
    seq_scans: list[str] = Field(description="watched relations the plan reads whole")
    seq_scans_unavoidable: list[str] = Field(
        description="those still read whole with sequential scans discouraged"
    )


class Explained(BaseModel):
    """The plans of one rule's scan and the verdict."""

    rule: str
    table: str
    track: str
    outbox: str = Field(description="SLAWATCH_OUTBOX: alerts | rows, the outbox the claim writes")
    at: datetime
    table_pages: int = Field(description="pages of the watched table (and its partitions)")
    statements: list[StatementPlan]
    ok: bool = Field(description="false: a scan would read the watched table whole")
    verdict: str


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(_nodes(child))
    return out


def _watched(info: TableInfo) -> set[tuple[str, str]]:
    return {(info.schema, info.name)} | {(p.schema, p.name) for p in info.partitions}


def _seq_scanned(plan: dict[str, Any], watched: set[tuple[str, str]]) -> list[str]:
    return sorted(
        {
            f"{n['Schema']}.{n['Relation Name']}"
            for n in _nodes(plan)
            if n["Node Type"] == "Seq Scan" and (n.get("Schema"), n.get("Relation Name")) in watched
        }
    )


def _explain(
    conn: Connection,
    statement: sql.Composable,
    params: dict[str, Any] | None,
    seqscan: bool,
) -> tuple[dict[str, Any], str]:
    """The JSON plan (verbose: it names each relation's schema) and the text plan."""
    with translate("explaining the claim"), conn.transaction(force_rollback=True):
        if not seqscan:
            conn.execute("SET LOCAL enable_seqscan = off")
        # Never executed: EXPLAIN without ANALYZE only plans (and the transaction rolls back).
        row = conn.execute(
            sql.SQL("EXPLAIN (FORMAT JSON, VERBOSE) {}").format(statement), params
        ).fetchone()
        text = conn.execute(sql.SQL("EXPLAIN {}").format(statement), params).fetchall()
    assert row is not None
    return row[0][0]["Plan"], "\n".join(r[0] for r in text)


def _statements(plan: ClaimPlan, now: datetime) -> list[tuple[str, sql.Composed, dict[str, Any]]]:
    params = plan.params(now)
    if plan.table is None:
        return [("claim", plan.statement, params)]
    rule = plan.rule
    # A scan between sweeps reads fresh rows from the watermark's look-back on.
    since = plan.to_deadline(rule.cutoff(now) - lookback(rule))
    close = plan.table.close.as_string(None)
    return [
        ("claim", plan.table.claim, params | {"since": since}),
        # The sweep ends the episodes it closes in the history: at now, for this rule (and
        # with resolve: true, sends their notices: severity, notifiers).
        ("sweep", plan.table.close, {k: v for k, v in params.items() if f"%({k})s" in close}),
    ]


def _shown(value: Any) -> str:
    """A parameter as an operator would write it."""
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _pages(conn: Connection, watched: set[tuple[str, str]]) -> int:
    """The watched tables' size in pages (a partitioned table's partitions', a query's
    tables')."""
    if not watched:
        return 0
    schemas, names = zip(*sorted(watched), strict=True)
    with translate("reading the size of the watched table"):
        row = conn.execute(
            "SELECT COALESCE(sum(pg_relation_size(to_regclass(format('%%I.%%I', s, n)))), 0)"
            " / current_setting('block_size')::bigint"
            " FROM unnest(%s::text[], %s::text[]) AS t(s, n)",
            (list(schemas), list(names)),
        ).fetchone()
    return int(row[0]) if row else 0


def explain(
    conn: Connection,
    rule: Rule,
    now: datetime,
    rules: list[Rule] | None = None,
    *,
    outbox: Outbox = DEFAULT_OUTBOX,
) -> Explained:
    """Plan ``rule``'s scan at ``now``; ConfigError when the rule is not ready to run.

    ``rules``: every configured rule (default: this one). An event rule is ready only
    when ``slawatch.event()`` is the one generated from all of them, so it is judged
    among them, as ``slawatch run`` judges it; another rule's trouble is not this one's.
    ``outbox``: SLAWATCH_OUTBOX, the shape of the outbox the statements write.
    """
    info = (
        None if rule.query is not None else inspect_table(conn, rule.schema_name, rule.table_name)
    )
    if info is None and rule.query is None:
        raise ConfigError(f"{rule.source}: table: {rule.table} does not exist")
    # In their configured order: slawatch.event()'s text (and so its tag) follows it.
    every = [rule if r.name == rule.name else r for r in rules or ()]
    if rule not in every:
        every.append(rule)
    plans, problems = prepare_ready(conn, every, outbox=outbox)
    if rule.name in problems:
        raise ConfigError(problems[rule.name])
    plan = plans[rule.name]
    statements = _statements(plan, now)
    if info is not None:
        watched = _watched(info)
    else:
        # A query rule watches every table its query reads (views expanded): the
        # relations of its plans outside slawatch's own schema.
        watched = {
            (n["Schema"], n["Relation Name"])
            for _, statement, params in statements
            for n in _nodes(_explain(conn, statement, params or None, seqscan=True)[0])
            if "Relation Name" in n and n.get("Schema") != "slawatch"
        }
    pages = _pages(conn, watched)
    out = []
    for name, statement, params in statements:
        tree, text = _explain(conn, statement, params or None, seqscan=True)
        seq = _seq_scanned(tree, watched)
        forced: list[str] = []
        if seq:
            forced = _seq_scanned(_explain(conn, statement, params or None, False)[0], watched)
        nodes = _nodes(tree)
        out.append(
            StatementPlan(
                name=name,
                sql=statement.as_string(conn),
                params={k: _shown(v) for k, v in sorted(params.items())},
                text=text,
                plan=tree,
                indexes=sorted(
                    {
                        n["Index Name"]
                        for n in nodes
                        if "Index Name" in n
                        and (n.get("Schema"), n.get("Relation Name")) in watched
                    }
                ),
                seq_scans=seq,
                seq_scans_unavoidable=forced,
            )
        )
    ok, verdict = judge(rule, out, pages)
    return Explained(
        rule=rule.name,
        table=rule.table,
        track=rule.track,
        outbox=outbox,
        at=now,
        table_pages=pages,
        statements=out,
        ok=ok,
        verdict=verdict,
    )


def judge(rule: Rule, plans: list[StatementPlan], pages: int) -> tuple[bool, str]:
    seq = sorted({r for p in plans for r in p.seq_scans})
    if rule.query is not None and seq:
        # A query is read as written, at each scan: what it reads whole is its own cost.
        if pages <= SMALL_PAGES:
            return True, (f"ok: the query reads {', '.join(seq)} whole, small now ({pages} pages)")
        return False, (
            f"the query reads {', '.join(seq)} whole at each scan ({pages:,} pages): an index"
            " on the columns it filters or joins by would serve it"
        )
    if not seq:
        used = sorted({i for p in plans for i in p.indexes})
        return True, (
            f"ok: no sequential scan of {rule.table}"
            + (f"; indexes used: {', '.join(used)}" if used else "")
        )
    unavoidable = sorted({r for p in plans for r in p.seq_scans_unavoidable})
    if unavoidable:
        return False, (
            f"a scan would read {', '.join(unavoidable)} whole: no index can serve it "
            "(run 'slawatch migrate', and check that the indexes are valid)"
        )
    if pages <= SMALL_PAGES:
        return True, (
            f"ok: the planner reads {', '.join(seq)} whole because it is small now "
            f"({pages} pages); with sequential scans discouraged it uses the partial indexes"
        )
    return False, (
        f"a scan would read {', '.join(seq)} whole ({pages:,} pages), though the partial "
        "indexes could serve it (are the table's statistics current? try ANALYZE)"
    )
