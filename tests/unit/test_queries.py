from __future__ import annotations

import pytest

from slawatch.engine.queries import parse_queries, queries


def test_parses_named_blocks_and_drops_comments() -> None:
    text = "-- preamble\n-- one --\n-- why\nSELECT 1;\n\n-- two --\nSELECT 2\n  FROM t;\n"
    assert parse_queries(text) == {"one": "SELECT 1;", "two": "SELECT 2\n  FROM t;"}


def test_duplicate_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- a --\nSELECT 1;\n-- a --\nSELECT 2;")


def test_shipped_queries_load() -> None:
    assert {"claim_deliveries", "mark_sent", "mark_retry", "mark_dead"} <= set(queries())
