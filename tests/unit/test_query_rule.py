"""The query rules of docs/how-to/watch-a-table.md (Watch a query) load as written."""

from __future__ import annotations

import re

import pytest
import yaml
from pydantic import ValidationError

from slawatch.config.rules import Rule
from slawatch.engine.generation import definition, generation
from tests.conftest import ROOT


def test_the_documented_query_rules_load() -> None:
    page = (ROOT / "docs" / "how-to" / "watch-a-table.md").read_text()
    section = page.split("## Watch a query", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(# rules/(\w+)\.yaml.*?\n.*?)```", section, re.S)
    assert [name for _, name in blocks] == ["order_unshipped", "job_stalled"]
    for text, name in blocks:
        rule = Rule.model_validate({"name": name, **yaml.safe_load(text)})
        assert rule.query is not None and rule.query.startswith("SELECT ")
        assert rule.track == "table" and rule.key == ["id"]
    assert rule.action is not None and rule.action.placeholders == ["id"]


def test_a_changed_query_is_a_new_generation() -> None:
    """Scanners of the old query stop at the claim gate until migrate records the new."""
    body = {
        "name": "late",
        "query": "SELECT id, due FROM a",
        "track": "table",
        "key": "id",
        "deadline": "due",
        "open_when": "true",
        "notify": ["console"],
    }
    before = Rule.model_validate(body)
    after = Rule.model_validate(body | {"query": "SELECT id, due FROM b"})
    assert generation(before) != generation(after)
    assert definition(before)["table"] != definition(after)["table"]


UNSHIPPED = "SELECT o.id, o.paid_at FROM orders o WHERE o.status = 'paid'"


def rule(query: str) -> Rule:
    return Rule.model_validate(
        {
            "name": "order_unshipped",
            "query": query,
            "track": "table",
            "key": "id",
            "deadline": "paid_at",
            "open_when": "true",
            "notify": ["console"],
        }
    )


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("SELECT 1; SELECT 2", "exactly one SELECT"),
        ("UPDATE orders SET status = 'x'", "exactly one SELECT"),
        ("WITH d AS (DELETE FROM orders RETURNING *) SELECT * FROM d", "must only read"),
        ("SELECT * FROM orders FOR UPDATE", "must not lock rows"),
        ("SELECT * FROM pg_catalog.pg_authid", "system catalog"),
        ("SELECT * FROM pg_stat_activity", "system catalog"),
        ("SELECT pg_read_file('x') AS f", "must not call pg_read_file"),
        ("SELECT * FROM orders -- x", "comments"),
        # Read-only, and run at every sweep: nothing that writes, locks, notifies or waits.
        ("SELECT id, nextval('s') AS n FROM orders", "must not call nextval"),
        ("SELECT id, setval('s', 1) AS n FROM orders", "must not call setval"),
        (
            "SELECT id FROM orders WHERE pg_try_advisory_lock(id)",
            "must not call pg_try_advisory_lock",
        ),
        ("SELECT id, pg_advisory_xact_lock(1) AS l FROM orders", "must not call pg_advisory_xact"),
        ("SELECT id, txid_current() AS x FROM orders", "must not call txid_current"),
        ("SELECT id, pg_current_xact_id() AS x FROM orders", "must not call pg_current_xact_id"),
        ("SELECT id, pg_notify('c', 'x') AS n FROM orders", "must not call pg_notify"),
        ("SELECT id FROM orders WHERE pg_sleep(10) IS NULL", "must not call pg_sleep"),
        ("SELECT id FROM orders, LATERAL pg_sleep_for('1 h') s", "must not call pg_sleep_for"),
    ],
)
def test_a_query_that_is_not_one_plain_select_is_refused(query: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        rule(query)


def test_query_needs_track_table_and_no_table() -> None:
    body = rule(UNSHIPPED).model_dump(mode="json", exclude_unset=True, exclude={"table"})
    with pytest.raises(ValidationError, match="query: needs track: table"):
        Rule.model_validate(body | {"track": "inline"})
    with pytest.raises(ValidationError, match="one of table:, query: or events:"):
        Rule.model_validate(body | {"table": "orders"})
    with pytest.raises(ValidationError, match="query: needs key"):
        Rule.model_validate({k: v for k, v in body.items() if k != "key"})
    with pytest.raises(ValidationError, match="deadline: must be a column of the query's output"):
        Rule.model_validate(body | {"deadline": "paid_at + interval '1 day'"})


def test_joins_unions_and_read_only_with_are_one_select() -> None:
    query = (
        "WITH w AS (SELECT id, last_heartbeat FROM workers)"
        " SELECT j.id, COALESCE(w.last_heartbeat, '-infinity') AS paid_at FROM jobs j"
        " LEFT JOIN w ON w.id = j.worker_id WHERE j.status LIKE 'do%'"
        " UNION ALL SELECT id, paid_at FROM orders;"
    )
    assert rule(query).query == query.rstrip(";")


def test_migrate_print_grants_select_on_what_the_query_reads() -> None:
    from slawatch.engine.migrate import grants

    rule = Rule.model_validate(
        {
            "name": "job_stalled",
            "query": "WITH w AS (SELECT * FROM procrastinate.procrastinate_workers)"
            " SELECT j.id, w.last_heartbeat AS beat FROM procrastinate_jobs j"
            " LEFT JOIN w ON w.id = j.worker_id"
            " WHERE NOT EXISTS (SELECT 1 FROM public.paused p WHERE p.task = j.task_name)",
            "track": "table",
            "key": "id",
            "deadline": "beat",
            "open_when": "true",
            "notify": ["console"],
        }
    )
    printed = [g.as_string(None) for g in grants([rule], "app")]
    reads = [g for g in printed if g.startswith("GRANT SELECT ON ") and "slawatch" not in g]
    assert sorted(reads) == [
        'GRANT SELECT ON "procrastinate"."procrastinate_workers" TO "app"',
        'GRANT SELECT ON "procrastinate_jobs" TO "app"',
        'GRANT SELECT ON "public"."paused" TO "app"',
    ]  # not "w": a WITH query's name
    assert 'GRANT USAGE ON SCHEMA "procrastinate" TO "app"' in printed
    assert printed.count('GRANT USAGE ON SCHEMA "public" TO "app"') == 1
