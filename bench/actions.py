"""Claim rate with an action on each row (docs/explanation/actions.md, issue 16's goal).

Loads a jobs table of ROWS rows of which DUE are hung, then drains them in
batches three ways, interleaved, ROUNDS times each (the table reset between runs):

- ``no action``: slawatch's claim of the rule without its action (one statement);
- ``action``: the same rule restarting each job (``update bench ... where id = :id``)
  in the claim's transaction, the batch's actions as one statement under one
  savepoint (its set form), recorded in slawatch.action (slawatch/actions/run.py);
- ``raw pair``: the seed's two statements in one transaction: the raw claim
  ``UPDATE ... RETURNING`` (no outbox), then one set-based UPDATE of the claimed rows
  (the issue's baseline, as written);
- ``raw, same work``: the same work as slawatch's by hand, in one transaction: the raw
  claim that also writes an alert and a delivery per row (data-modifying CTEs), the
  set-based UPDATE, then one INSERT of the action records;
- ``before the acted check``: ``action`` with the claim's due column as it was before
  it left out episodes acted on already (engine/acting.py: one probe of action_once's
  index per acting alert), to read the probe's cost. ``--history K`` gives each hung job
  K older episodes' attempts in slawatch.action, for the probe to look past.

Prints each run, the medians (with the WAL each run wrote, and the server process's
CPU seconds per run when the server is local), and the ratios action / raw pair (the issue's goal,
>= 1.0x) and action / raw same work. Not a test: figures depend on the machine.

    .venv/bin/python bench/actions.py [--rows 200000] [--due 20000] [--batch 1000]
                                      [--rounds 3] [--history 0]

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
from benchdb import scratch_database

from slawatch.actions.run import runner
from slawatch.config.rules import Rule
from slawatch.engine import acting as acting_module
from slawatch.engine.claim import claim_batch, plan_claim
from slawatch.engine.migrate import migrate

NOW = datetime(2026, 6, 1, tzinfo=UTC)
RESTART = "update bench set status = 'queued', restarts = restarts + 1 where id = :id"

# The seed's claim as written by hand: mark a batch notified, return the rows.
RAW_CLAIM = """
UPDATE bench SET sw_bench_n = sw_bench_n + 1, sw_bench_next = NULL
 WHERE ctid = ANY (ARRAY(
       SELECT ctid FROM bench WHERE heartbeat_at < %(cutoff)s::timestamptz
          AND sw_bench_n = 0 AND (status = 'running') ORDER BY heartbeat_at
        LIMIT %(batch)s::int))
RETURNING id"""
# ... then its second statement: the restart, set-based.
RAW_RESTART = (
    "UPDATE bench SET status = 'queued', restarts = restarts + 1 WHERE id = ANY(%(ids)s::bigint[])"
)

# The same work by hand: the raw claim writing the outbox, the UPDATE, the records.
RAW_CLAIM_OUTBOX = """
WITH claimed AS (
    UPDATE bench SET sw_bench_n = sw_bench_n + 1, sw_bench_next = NULL
     WHERE ctid = ANY (ARRAY(
           SELECT ctid FROM bench WHERE heartbeat_at < %(cutoff)s::timestamptz
              AND sw_bench_n = 0 AND (status = 'running') ORDER BY heartbeat_at
            LIMIT %(batch)s::int))
    RETURNING id, kind, heartbeat_at
), alerts AS (
    INSERT INTO slawatch.alert (rule, key, episode, n, severity, deadline, due_at, fired_at,
                                row_data)
    SELECT 'bench', id::text, 1, 1, 'warning', heartbeat_at, heartbeat_at + interval '15m',
           %(now)s::timestamptz, jsonb_build_object('id', id, 'kind', kind)
      FROM claimed
    RETURNING id
), deliveries AS (
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT id, 'ops', %(now)s::timestamptz FROM alerts
)
SELECT id FROM claimed"""
RAW_RECORD = """
INSERT INTO slawatch.action (rule, key, episode, n, status, rows, at, params)
SELECT 'bench', k::text, 1, 1, 'ok', 1, %(now)s::timestamptz, jsonb_build_object('id', k::text)
  FROM unnest(%(ids)s::bigint[]) k"""

ACT_LABEL = "slawatch claim + action per row"
RAW_LABEL = "raw pair (claim, then one UPDATE)"
SAME_LABEL = "raw, same work (+outbox, +records)"
BEFORE_LABEL = "action, before the acted check"
# The due column's acted check (engine/acting.py), taken out for BEFORE_LABEL's plan.
ACTED_CHECK = """
           AND (a.key, a.episode) NOT IN (
                SELECT x.key, x.episode FROM slawatch.action x
                 WHERE x.rule = %(rule)s
                   AND x.key = ANY (ARRAY(SELECT b.key FROM alerts b
                                           WHERE b.n = %(action_on)s::integer)))"""

Conn = psycopg.Connection[tuple[object, ...]]


def load(conn: Conn, rows: int, due: int) -> Rule:
    conn.execute("DROP TABLE IF EXISTS bench; DROP SCHEMA IF EXISTS slawatch CASCADE")
    conn.execute(
        "CREATE TABLE bench (id bigint PRIMARY KEY, kind text NOT NULL, status text NOT NULL,"
        " restarts int NOT NULL DEFAULT 0, heartbeat_at timestamptz)"
    )
    step = max(rows // due, 1)  # every step-th job is running and hung; the rest done
    conn.execute(
        "INSERT INTO bench SELECT g, 'sync',"
        " CASE WHEN mod(g, %(step)s::int) = 0 THEN 'running' ELSE 'done' END, 0,"
        " %(now)s::timestamptz - interval '2 hours' - g * interval '1 second'"
        " FROM generate_series(1, %(rows)s::int) g",
        {"step": step, "now": NOW, "rows": rows},
    )
    rule = Rule.model_validate(
        {
            "name": "bench",
            "table": "bench",
            "key": "id",
            "deadline": "heartbeat_at",
            "after": "15m",
            "open_when": "status = 'running'",
            "columns": ["id", "kind"],
            "notify": ["ops"],
            "action": {"sql": RESTART},
        }
    )
    migrate(conn, [rule])
    conn.execute("VACUUM ANALYZE bench")
    return rule


def reset(conn: Conn, history: int = 0) -> None:
    conn.execute(
        "UPDATE bench SET status = 'running', restarts = 0, sw_bench_n = 0,"
        " sw_bench_next = NULL, sw_bench_seen = NULL, sw_bench_ep = 0"
        " WHERE sw_bench_n > 0 OR restarts > 0"
    )
    conn.execute("TRUNCATE slawatch.alert, slawatch.delivery, slawatch.action")
    if history:
        # Older episodes' attempts of the hung jobs (episodes 1001, 1002, ...).
        conn.execute(
            "INSERT INTO slawatch.action (rule, key, episode, n, status, rows, at, params)"
            " SELECT 'bench', b.id::text, 1000 + e, 1, 'ok', 1, %(now)s::timestamptz, '{}'"
            "   FROM bench b, generate_series(1, %(history)s::int) e"
            "  WHERE b.status = 'running'",
            {"now": NOW, "history": history},
        )
        # As old rows are in a live database: hint bits set, visible to index-only scans.
        conn.execute("VACUUM ANALYZE slawatch.action")
    conn.execute("VACUUM ANALYZE bench")
    conn.execute("CHECKPOINT")


def backend_cpu(conn: Conn) -> float | None:
    """CPU seconds the connection's server process has used (utime + stime), when the
    server runs on this machine and its /proc is readable; else None. Less inflated
    than wall time by other work on a busy machine."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain(step: Callable[[], int], batch: int) -> int:
    total = 0
    while True:
        got = step()
        total += got
        if got < batch:
            return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--due", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--history", type=int, default=0)
    parser.add_argument(
        "--acted-check",
        action="store_true",
        help="run only the action and its before-the-acted-check twin, alternating"
        " which goes first from round to round",
    )
    args = parser.parse_args()

    with scratch_database() as db, psycopg.connect(db, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        rule = load(conn, args.rows, args.due).model_copy(update={"batch": args.batch})
        print(
            f"PostgreSQL {version[0] if version else '?'}; {args.rows:,} jobs, {args.due:,} hung,"
            f" batch {args.batch:,}; {args.rounds} interleaved rounds\n"
        )
        kind = "timestamp with time zone"
        bare = plan_claim(rule.model_copy(update={"action": None}), kind)
        acting = plan_claim(rule, kind).with_act(runner("on"))
        checked = acting_module._DUE
        assert checked.count(ACTED_CHECK) == 1, "engine/acting.py's acted check moved"
        acting_module._DUE = checked.replace(ACTED_CHECK, "")
        try:
            before = plan_claim(rule, kind).with_act(runner("on"))
        finally:
            acting_module._DUE = checked
        params = {"cutoff": NOW - timedelta(minutes=15), "batch": args.batch, "now": NOW}

        def raw_pair() -> int:
            with conn.transaction():
                ids = [r[0] for r in conn.execute(RAW_CLAIM, params).fetchall()]
                if ids:
                    conn.execute(RAW_RESTART, {"ids": ids})
                return len(ids)

        def raw_same() -> int:
            with conn.transaction():
                ids = [r[0] for r in conn.execute(RAW_CLAIM_OUTBOX, params).fetchall()]
                if ids:
                    conn.execute(RAW_RESTART, {"ids": ids})
                    conn.execute(RAW_RECORD, {"ids": ids, "now": NOW})
                return len(ids)

        variants: dict[str, Callable[[], int]] = {
            "slawatch claim, no action": lambda: claim_batch(conn, bare, NOW),
            ACT_LABEL: lambda: claim_batch(conn, acting, NOW),
            RAW_LABEL: raw_pair,
            SAME_LABEL: raw_same,
            BEFORE_LABEL: lambda: claim_batch(conn, before, NOW),
        }
        rates: dict[str, list[float]] = {label: [] for label in variants}
        cpu: dict[str, list[float]] = {label: [] for label in variants}
        wal: dict[str, list[float]] = {label: [] for label in variants}
        print(f"{'variant':<36} {'run':>3} {'rows':>8} {'seconds':>8} {'rows/s':>9}")
        if args.acted_check:
            variants = {k: v for k, v in variants.items() if k in (ACT_LABEL, BEFORE_LABEL)}
            rates = {label: rates[label] for label in variants}
        for round_ in range(args.rounds):
            order = list(variants.items())
            if args.acted_check and round_ % 2:
                order.reverse()
            for label, step in order:
                reset(conn, args.history)
                lsn = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
                t, c = time.perf_counter(), backend_cpu(conn)
                total = drain(step, args.batch)
                secs = time.perf_counter() - t
                if c is not None and (after := backend_cpu(conn)) is not None:
                    cpu[label].append(after - c)
                written = conn.execute(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)::float8",
                    (lsn[0] if lsn else None,),
                ).fetchone()
                wal[label].append(float(written[0]) if written else 0.0)
                restarted = conn.execute("SELECT count(*) FROM bench WHERE restarts > 0")
                done = restarted.fetchone()
                assert total == args.due, (label, total)
                assert "no action" in label or (done and done[0] == args.due), (label, done)
                rates[label].append(total / secs)
                print(f"{label:<36} {round_ + 1:>3} {total:>8,} {secs:>8.2f} {total / secs:>9,.0f}")
        print("\nmedians (rows/s)")
        median = {label: statistics.median(r) for label, r in rates.items() if r}
        for label, value in median.items():
            used = f"   server CPU {statistics.median(cpu[label]):.2f} s" if cpu[label] else ""
            mb = statistics.median(wal[label]) / 1e6
            print(f"  {label:<36} {value:>9,.0f}   WAL {mb:5.1f} MB{used}")
        if args.acted_check:
            checked_ratio = median[ACT_LABEL] / median[BEFORE_LABEL]
            print(f"\naction / before the acted check: {checked_ratio:.2f}x")
            return
        acted, raw, same = median[ACT_LABEL], median[RAW_LABEL], median[SAME_LABEL]
        ratio = acted / raw
        verdict = "met" if ratio >= 1.0 else "MISSED"
        print(f"\naction / raw pair: {ratio:.2f}x   (goal >= 1.0x: {verdict})")
        print(f"action / raw, same work: {acted / same:.2f}x   (like with like)")
        print(f"action / before the acted check: {acted / median[BEFORE_LABEL]:.2f}x")


if __name__ == "__main__":
    main()
