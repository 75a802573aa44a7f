"""docs/explanation/guarantees.md, one clock: slawatch's SQL never reads the database's clock; the
application's time is always a parameter (so freezegun moves it, and a server's
clock skew cannot move a deadline)."""

from __future__ import annotations

import re

import pytest

from slawatch.config.rules import load_rules
from slawatch.engine.claim import plan_claim
from slawatch.engine.queries import queries
from tests.conftest import ROOT

CLOCK = re.compile(
    r"\b(now|clock_timestamp|statement_timestamp|transaction_timestamp|timeofday)\s*\(\)"
    r"|\bcurrent_(timestamp|date|time)\b|\blocaltimestamp\b",
    re.IGNORECASE,
)


def test_no_fixed_query_reads_the_database_clock() -> None:
    for name, text in queries().items():
        assert not CLOCK.search(text), name


@pytest.mark.parametrize("track", ["inline", "table"])
def test_no_claim_reads_the_database_clock(track: str) -> None:
    for rule in load_rules(ROOT / "rules"):
        plan = plan_claim(
            rule.model_copy(update={"track": track}), "timestamp with time zone", key=["id"]
        )
        statements = [plan.statement]
        if plan.table is not None:
            statements += [plan.table.claim, plan.table.close]
        for statement in statements:
            text = "".join(str(part) for part in _strings(statement))
            assert not CLOCK.search(text), (rule.name, track)


def _strings(composable: object) -> list[str]:
    """The SQL text pieces of a psycopg Composed."""
    from psycopg import sql

    if isinstance(composable, sql.Composed):
        return [s for part in composable for s in _strings(part)]
    if isinstance(composable, sql.SQL):
        return [composable.as_string(None)]
    return []  # identifiers and literals are names and values, never a call
