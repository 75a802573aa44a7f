"""Helpers for integration tests: the demo shop, claiming, reading alerts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from slawatch.claim import ClaimPlan, claim_batch, prepare
from slawatch.clock import Clock
from slawatch.demo import SHOP
from slawatch.migrate import migrate
from slawatch.rules import Rule, load_rules
from tests.conftest import ROOT

Conn = psycopg.Connection[Any]


def shop(conn: Conn) -> dict[str, Rule]:
    """The demo shop's tables, migrated for the shipped example rules."""
    conn.execute(SHOP)
    rules = load_rules(ROOT / "rules")
    migrate(conn, rules)
    return {r.name: r for r in rules}


def plans(conn: Conn, rules: dict[str, Rule]) -> dict[str, ClaimPlan]:
    return {name: prepare(conn, rule) for name, rule in rules.items()}


def claim_all(conn: Conn, plan: ClaimPlan, now: datetime | None = None) -> int:
    """Claim until a batch comes back short, at the application clock's now."""
    total = 0
    while True:
        got = claim_batch(conn, plan, now or Clock().now())
        total += got
        if got < plan.rule.batch:
            return total


def alerts(conn: Conn, rule: str) -> list[tuple[str, int, str, list[str]]]:
    """(key, n, severity, [notifiers]) of every alert of ``rule``, in order."""
    rows = conn.execute(
        "SELECT a.key, a.n, a.severity, array_agg(d.notifier ORDER BY d.notifier)"
        " FROM slawatch.alert a LEFT JOIN slawatch.delivery d ON d.alert_id = a.id"
        " WHERE a.rule = %s GROUP BY a.id ORDER BY a.key, a.n",
        (rule,),
    ).fetchall()
    return [(k, n, s, list(ns)) for k, n, s, ns in rows]


def episodes(conn: Conn, rule: str) -> list[tuple[str, int, int]]:
    """(key, episode, n) of every alert of ``rule``, in order."""
    rows = conn.execute(
        "SELECT key, episode, n FROM slawatch.alert WHERE rule = %s ORDER BY key, episode, n",
        (rule,),
    ).fetchall()
    return [(k, e, n) for k, e, n in rows]


def tracking(conn: Conn, rule: str, table: str, key: int) -> tuple[Any, ...]:
    """(n, next, seen, ep) of one row of ``table``."""
    from psycopg import sql

    row = conn.execute(
        sql.SQL("SELECT {}, {}, {}, {} FROM {} WHERE id = %s").format(
            *(sql.Identifier(f"sw_{rule}_{c}") for c in ("n", "next", "seen", "ep")),
            sql.Identifier(table),
        ),
        (key,),
    ).fetchone()
    assert row is not None
    return tuple(row)
