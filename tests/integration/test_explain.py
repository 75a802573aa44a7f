"""The claim's plan: the two partial indexes, and never a scan of the whole table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from slawatch.claim import plan_claim
from tests.integration.helpers import Conn, shop


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(nodes(child))
    return out


def test_claim_uses_both_partial_indexes_and_no_seq_scan(conn: Conn) -> None:
    rules = shop(conn)
    now = datetime(2026, 3, 1, tzinfo=UTC)
    # 50,000 orders, nearly all shipped long ago: what a real shop's table looks like.
    conn.execute(
        "INSERT INTO orders SELECT g, mod(g, 1000), 100, CASE WHEN mod(g, 100) = 0 THEN 'paid'"
        " ELSE 'shipped' END, %s - g * interval '1 minute' FROM generate_series(1, 50000) g",
        (now,),
    )
    conn.execute("ANALYZE orders")
    rule = rules["order_unshipped"]
    plan = plan_claim(rule, "timestamp with time zone")
    with conn.transaction(force_rollback=True):
        (explained,) = conn.execute(
            b"EXPLAIN (FORMAT JSON) " + plan.statement.as_bytes(conn), plan.params(now)
        ).fetchone()  # type: ignore[misc]
    tree = nodes(explained[0]["Plan"])
    on_orders = [n for n in tree if n.get("Relation Name") == "orders"]
    wanted = {rule.first_index, rule.again_index, rule.ended_index}
    assert {n.get("Index Name") for n in on_orders} >= wanted
    assert not [n for n in on_orders if n["Node Type"] == "Seq Scan"], on_orders
    assert any(n["Node Type"] == "Tid Scan" for n in on_orders)
