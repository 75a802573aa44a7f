"""What the webhook actions' trigger (migration 0005) costs every other delivery.

The trigger on ``slawatch.delivery`` fires only for deliveries to ``action:<rule>``,
but its WHEN is evaluated for each row whose status changes. This settles DUE
pending deliveries to an ordinary notifier as the delivery workers do (``mark_sent``,
batches of 100), with the trigger and with it dropped, in interleaved rounds, and
prints the median rows/s of each; and the same with every delivery an action's
(the trigger's function runs: one UPDATE of slawatch.action per row).

    .venv/bin/python bench/action_webhook.py [--due 20000] [--rounds 5]

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import UTC, datetime

import psycopg
from benchdb import scratch_database

from slawatch.engine.migrate import migrate
from slawatch.engine.queries import queries

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
BATCH = 100


def fill(
    conn: psycopg.Connection[tuple[object, ...]], due: int, notifier: str
) -> list[tuple[int, int]]:
    """DUE alerts, each with a pending delivery leased to one owner (and, for an
    action's target, its pending attempt); the deliveries' (id, alert id)."""
    conn.execute("TRUNCATE slawatch.alert, slawatch.delivery, slawatch.action")
    conn.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " SELECT 'job_hung', i::text, 1, 1, 'warning', %s, '{}' FROM generate_series(1, %s) i",
        (NOW, due),
    )
    rows = conn.execute(
        "INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)"
        " SELECT id, %s, %s FROM slawatch.alert RETURNING id, alert_id",
        (notifier, NOW),
    ).fetchall()
    if notifier.startswith("action:"):
        conn.execute(
            "INSERT INTO slawatch.action (rule, key, episode, n, kind, status, at, delivery_id)"
            " SELECT a.rule, a.key, 1, 1, 'webhook', 'pending', %s, d.id"
            "   FROM slawatch.delivery d JOIN slawatch.alert a ON a.id = d.alert_id",
            (NOW,),
        )
    conn.execute("VACUUM ANALYZE slawatch.delivery")
    conn.execute("VACUUM ANALYZE slawatch.action")
    return [(int(r[0]), int(r[1])) for r in rows]


def settle(conn: psycopg.Connection[tuple[object, ...]], ids: list[tuple[int, int]]) -> float:
    """mark_sent over ``ids`` in batches, each its own transaction: rows/s."""
    owner = uuid.uuid4()
    conn.execute("UPDATE slawatch.delivery SET lease_owner = %s", (owner,))
    started = time.perf_counter()
    for i in range(0, len(ids), BATCH):
        conn.execute(
            queries()["mark_sent"],
            {
                "ids": [d for d, _ in ids[i : i + BATCH]],
                "alerts": [a for _, a in ids[i : i + BATCH]],
                "owner": owner,
                "now": NOW,
            },
        )
    return len(ids) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--due", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trigger = (
        "CREATE TRIGGER action_settled AFTER UPDATE OF status ON slawatch.delivery"
        " FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status"
        " AND NEW.notifier LIKE 'action:%') EXECUTE FUNCTION slawatch.action_delivery_settled()"
    )
    results: dict[str, list[float]] = {"with": [], "without": [], "actions": []}
    with scratch_database() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [])
        for _ in range(args.rounds):
            results["with"].append(settle(conn, fill(conn, args.due, "ops-webhook")))
            conn.execute("DROP TRIGGER action_settled ON slawatch.delivery")
            results["without"].append(settle(conn, fill(conn, args.due, "ops-webhook")))
            conn.execute(trigger)
            results["actions"].append(settle(conn, fill(conn, args.due, "action:job_hung")))
    print(f"mark_sent, batches of {BATCH}, {args.due} deliveries, median of {args.rounds}:")
    for name, label in (
        ("without", "a notifier's deliveries, no trigger"),
        ("with", "a notifier's deliveries, trigger (WHEN false)"),
        ("actions", "an action's deliveries (the trigger runs)"),
    ):
        print(f"  {label:48} {statistics.median(results[name]):>9,.0f} rows/s")


if __name__ == "__main__":
    main()
