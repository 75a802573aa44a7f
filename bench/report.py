"""The SLA report's cost: slawatch's report statement beside a hand-written GROUP BY
over the same episode history (docs/how-to/report.md, issue 17).

Loads EPISODES episodes over DAYS days into slawatch.episode (RULES rules; most
ended, some acknowledged, a few still open), beside a watched table of as many
rows whose deadline has no index for every row (so the report never touches it),
then times, interleaved, REPS times each:

- ``report``: the report's one statement (operate/report.py), ``--by day`` over
  the whole window, every rule;
- ``GROUP BY``: the plainest query a person would write for the same figures
  (breached and lateness/ack percentiles per rule and day) — no ``open``, no
  periods without episodes, no carried-over episodes.

Prints the medians, their ratio (goal <= 1.5x), and the report's plan: the index
scans it uses, and that no scan reads a table whole. Not a test: figures depend
on the machine.

    .venv/bin/python bench/report.py [--episodes 1000000] [--days 30] [--rules 5] [--reps 5]

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime

import psycopg
from benchdb import scratch_database

from slawatch.config.rules import Rule
from slawatch.engine.migrate import migrate
from slawatch.operate.report import REPORT_SQL, query, report

NOW = datetime(2026, 6, 1, tzinfo=UTC)

HAND = """\
SELECT rule, date_trunc('day', due_at, 'UTC') AS day, count(*),
       percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM ended_at - due_at)) FILTER (WHERE ended_at IS NOT NULL),
       percentile_cont(ARRAY[0.5, 0.9]) WITHIN GROUP (
           ORDER BY extract(epoch FROM acked_at - notified_at)) FILTER (WHERE acked_at IS NOT NULL)
  FROM slawatch.episode
 WHERE due_at >= %(start)s AND due_at < %(until)s
 GROUP BY 1, 2"""


def rules_for(n: int) -> list[Rule]:
    return [
        Rule.model_validate(
            {
                "name": f"bench{i}",
                "table": "bench_orders",
                "key": "id",
                "deadline": "paid_at",
                "after": "48h",
                "open_when": "status = 'paid'",
                "notify": ["ops"],
            }
        )
        for i in range(n)
    ]


def orders(conn: psycopg.Connection[tuple[object, ...]], rows: int, days: int) -> None:
    """``bench_orders``: ``rows`` shipped orders paid evenly over the ``days`` before NOW."""
    conn.execute(
        "CREATE TABLE bench_orders (id bigint PRIMARY KEY, status text NOT NULL,"
        " paid_at timestamptz)"
    )
    conn.execute(
        "INSERT INTO bench_orders SELECT g, 'shipped', %(now)s::timestamptz"
        " - g * (%(days)s * interval '1 day' / %(rows)s) FROM generate_series(1, %(rows)s) g",
        {"now": NOW, "days": days, "rows": rows},
    )


def load(conn: psycopg.Connection[tuple[object, ...]], episodes: int, days: int, n: int) -> None:
    orders(conn, episodes, days)
    migrate(conn, rules_for(n))
    # Due evenly over the window; 1 in 20 still open, 1 in 3 acked after 1-30 min,
    # the others ended 0-10 h after they fell due.
    conn.execute(
        "INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at,"
        " acked_at, acked_by, ended_at)"
        " SELECT 'bench' || mod(g, %(n)s), g::text, 1, d - interval '48 hours', d,"
        "        d + interval '30 seconds',"
        "        CASE WHEN mod(g, 3) = 0 THEN d + mod(g, 30) * interval '1 minute' END,"
        "        CASE WHEN mod(g, 3) = 0 THEN 'ann' END,"
        "        CASE WHEN mod(g, 20) <> 0"
        "             THEN d + mod(g::bigint * 7919, 36000) * interval '1 second' END"
        "   FROM generate_series(1, %(rows)s) g,"
        "        LATERAL (SELECT %(now)s::timestamptz"
        "                        - g * (%(days)s * interval '1 day' / %(rows)s) AS d) x",
        {"now": NOW, "days": days, "rows": episodes, "n": n},
    )
    conn.execute("VACUUM ANALYZE slawatch.episode")
    conn.execute("VACUUM ANALYZE bench_orders")


def plan_nodes(plan: object) -> list[tuple[str, str]]:
    """(node type, relation or index) of every node of an EXPLAIN (FORMAT JSON) plan."""
    out: list[tuple[str, str]] = []

    def walk(node: dict[str, object]) -> None:
        out.append(
            (str(node["Node Type"]), str(node.get("Index Name") or node.get("Relation Name", "")))
        )
        for child in node.get("Plans", []):  # type: ignore[attr-defined]
            walk(child)

    walk(plan[0]["Plan"])  # type: ignore[index]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--rules", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5, help="measurements of each (>= 3)")
    args = parser.parse_args()

    with scratch_database() as db, psycopg.connect(db, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        t = time.perf_counter()
        load(conn, args.episodes, args.days, args.rules)
        print(
            f"PostgreSQL {version[0] if version else '?'}; {args.episodes:,} episodes over"
            f" {args.days} days, {args.rules} rules; loaded in {time.perf_counter() - t:.1f}s\n"
        )
        q = query(rules_for(args.rules), rule=None, since=f"{args.days}d", by="day", now=NOW)
        params = {
            "rules": [r.name for r in q.rules],
            "start": q.start,
            "until": q.until,
            "step": q.step,
        }

        def ours() -> int:
            return len(report(conn, q).rows)

        def hand() -> int:
            return len(conn.execute(HAND, params).fetchall())

        times: dict[str, list[float]] = {"report": [], "GROUP BY": []}
        for _ in range(max(args.reps, 3)):
            for label, work in (("report", ours), ("GROUP BY", hand)):
                t = time.perf_counter()
                rows = work()
                times[label].append(time.perf_counter() - t)
        print(f"{'query':<10} {'rows':>6} {'median s':>9} {'min':>7} {'max':>7}")
        for label, values in times.items():
            rows = ours() if label == "report" else hand()
            print(
                f"{label:<10} {rows:>6} {statistics.median(values):>9.3f}"
                f" {min(values):>7.3f} {max(values):>7.3f}"
            )
        ratio = statistics.median(times["report"]) / statistics.median(times["GROUP BY"])
        print(f"\nreport / GROUP BY: {ratio:.2f}x (goal <= 1.5x)\n")

        conn.execute("SET jit = off")  # as report() runs it
        for days in (args.days, 7):
            week = query(rules_for(args.rules), rule=None, since=f"{days}d", by="day", now=NOW)
            plan = conn.execute(
                "EXPLAIN (FORMAT JSON) " + REPORT_SQL,
                params | {"start": week.start, "until": week.until},
            ).fetchone()
            assert plan is not None
            nodes = plan_nodes(plan[0])
            scans = sorted({f"{kind} on {name}" for kind, name in nodes if "Scan" in kind and name})
            print(f"the report's scans over {days} days:\n  " + "\n  ".join(scans))
            whole = [name for kind, name in nodes if kind == "Seq Scan"]
            print("  sequential scans:", ", ".join(whole) if whole else "none")
            print("  watched table read:", "yes" if "bench_orders" in json.dumps(plan[0]) else "no")


if __name__ == "__main__":
    main()
