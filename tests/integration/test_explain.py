"""The claim's plan: the two partial indexes, and never a scan of the whole table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from slawatch.engine.claim import plan_claim
from slawatch.errors import ConfigError
from slawatch.operate.explain import SMALL_PAGES, explain
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


# ---------------------------------------------------------------- slawatch explain

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def big_shop(conn: Conn, track: str) -> dict[str, Any]:
    rules = shop(conn, track)
    conn.execute(
        "INSERT INTO orders SELECT g, mod(g, 1000), 100, CASE WHEN mod(g, 100) = 0 THEN 'paid'"
        " ELSE 'shipped' END, %s - g * interval '1 minute' FROM generate_series(1, 50000) g",
        (NOW,),
    )
    conn.execute("ANALYZE orders")
    return rules


def test_explain_finds_the_partial_indexes(conn: Conn, track: str) -> None:
    rule = big_shop(conn, track)["order_unshipped"]
    result = explain(conn, rule, NOW)
    assert result.ok, result.verdict
    assert result.verdict.startswith("ok: no sequential scan of public.orders; indexes used: ")
    names = [s.name for s in result.statements]
    assert names == (["claim"] if track == "inline" else ["claim", "sweep"])
    used = {i for s in result.statements for i in s.indexes}
    wanted = (
        {rule.first_index, rule.again_index, rule.ended_index}
        if track == "inline"
        else {rule.due_index}
    )
    assert used >= wanted
    claim = result.statements[0]
    assert claim.sql.startswith("WITH ") and "cutoff" in claim.params
    assert "Index" in claim.text and claim.seq_scans == []


def test_explain_fails_on_a_large_table_read_whole(conn: Conn) -> None:
    rule = big_shop(conn, "inline")["order_unshipped"]
    conn.execute("SET random_page_cost = 100000")  # index reads priced out: a seq scan wins
    result = explain(conn, rule, NOW)
    assert result.table_pages > SMALL_PAGES
    assert result.statements[0].seq_scans == ["public.orders"]
    assert result.statements[0].seq_scans_unavoidable == []
    assert not result.ok and "though the partial indexes could serve it" in result.verdict


def test_explain_allows_a_small_table_read_whole(conn: Conn) -> None:
    rule = shop(conn)["order_unshipped"]
    conn.execute("INSERT INTO orders VALUES (1, 1, 100, 'paid', %s)", (NOW,))
    conn.execute("ANALYZE orders")
    result = explain(conn, rule, NOW)
    assert result.statements[0].seq_scans == ["public.orders"]
    assert result.ok and "because it is small now" in result.verdict


def test_explain_of_a_rule_not_migrated(conn: Conn) -> None:
    rule = shop(conn)["order_unshipped"]
    conn.execute(f"DROP INDEX {rule.first_index}")
    with pytest.raises(ConfigError, match="run 'slawatch migrate'"):
        explain(conn, rule, NOW)
