from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slawatch.config.notifiers import load_notifiers
from slawatch.config.rules import Rule, check_notifier_names, load_rules
from slawatch.errors import ConfigError
from tests.conftest import ROOT
from tests.unit.yaml_text import last_wins

GOOD = """\
table: public.orders
key: id
deadline: paid_at
after: 48h
open_when: "status = 'paid'"
notify: [console]
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(last_wins(text))
    return tmp_path


def load_one(tmp_path: Path, text: str, name: str = "orders.yaml") -> Rule:
    return load_rules(write(tmp_path, name, text))[0]


def error_of(tmp_path: Path, text: str, name: str = "orders.yaml") -> str:
    with pytest.raises(ConfigError) as exc:
        load_rules(write(tmp_path, name, text))
    return str(exc.value)


def test_shipped_examples_load_and_reference_shipped_notifiers() -> None:
    rules = load_rules(ROOT / "rules")
    notifiers = load_notifiers(ROOT / "notifiers")
    check_notifier_names(rules, {n.name for n in notifiers})
    assert {r.name for r in rules} == {
        "order_unshipped",
        "refund_unprocessed",
        "receipt_unconfirmed",
        "job_hung",
        "parcel_undelivered",
        "task_timeout",
    }


def test_defaults(tmp_path: Path) -> None:
    rule = load_one(tmp_path, GOOD)
    assert rule.name == "orders"  # the file's stem
    assert rule.every == timedelta(seconds=30)
    assert rule.batch == 10_000
    assert rule.severity == "warning"
    assert rule.key == ["id"]
    assert rule.alert_columns(["id"]) == ["id", "paid_at"]
    assert rule.max_notifications == 1  # no renotify: notified once
    assert rule.schema_name == "public" and rule.table_name == "orders"
    assert rule.inline_triggers == "refuse"  # an UPDATE that sets something off is refused
    assert load_one(tmp_path, GOOD + "inline_triggers: fire\n").inline_triggers == "fire"


def test_escalation_tiers_pick_severity_and_notifiers(tmp_path: Path) -> None:
    rule = load_one(
        tmp_path,
        GOOD
        + "escalate:\n  - {from: 5, notify: [pager]}\n  - {from: 3, severity: critical}\n"
        + "renotify: {every: 1h}\n",
    )
    assert rule.tier_for(1) == ("warning", ["console"])
    assert rule.tier_for(3) == ("critical", ["console"])
    assert rule.tier_for(7) == ("critical", ["pager"])
    assert rule.max_notifications is None


def test_backoff_doubles_up_to_max(tmp_path: Path) -> None:
    rule = load_one(tmp_path, GOOD + "renotify: {backoff: {first: 1h, max: 5h}, max: 9}\n")
    assert rule.renotify is not None
    hours = [rule.renotify.interval_after(n).total_seconds() / 3600 for n in range(1, 6)]
    assert hours == [1, 2, 4, 5, 5]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GOOD + "every: 6 hourz\n",
            "orders.yaml: every: '6 hourz' is not a duration: 'hourz' is not a unit (a number",
        ),
        (GOOD + "renotify: {every: 6 hourz}\n", "orders.yaml: renotify.every: '6 hourz' is not"),
        (GOOD + "colour: red\n", "orders.yaml: colour: unknown field (known fields:"),
        (GOOD + "name: Orders-1\n", "orders.yaml: name: 'Orders-1' is not a rule name"),
        (GOOD + "key: [id, id]\n", "orders.yaml: key: names a column twice"),
        (GOOD + "sweep: 5m\n", "orders.yaml: sweep: applies to track: table only"),
        (
            GOOD + "inline_triggers: sometimes\n",
            "orders.yaml: inline_triggers: 'sometimes': Input should be 'refuse' or 'fire'",
        ),
        (
            GOOD + "track: table\ninline_triggers: fire\n",
            "orders.yaml: inline_triggers: applies to track: inline only",
        ),
        (GOOD + "track: elsewhere\n", "orders.yaml: track: 'elsewhere': Input should be"),
        (GOOD + "key: []\n", "orders.yaml: key: must name 1 to 8 columns"),
        (GOOD + "key: [id, 'x y']\n", "orders.yaml: key.1: 'x y' is not a column name"),
        (GOOD + "severity: loud\n", "orders.yaml: severity: 'loud': Input should be"),
        (GOOD + "renotify: {max: 3}\n", "renotify: renotify needs exactly one of"),
        (GOOD + "batch: 0\n", "orders.yaml: batch: 0: Input should be greater than"),
        (GOOD + "timezone: Mars/Base\n", "timezone: 'Mars/Base' is not a time zone"),
        (GOOD + 'table: "orders; drop"\n', "table: 'orders; drop' is not a table name"),
        (GOOD + "columns: [id, 'x y']\n", "columns.1: 'x y' is not a column name"),
        (GOOD.replace("'paid'\"", "'paid'; DROP TABLE orders\""), "open_when: must be one SQL"),
        (GOOD + "notify: []\n", "orders.yaml: notify:"),
        (GOOD + "notify: [a, a]\n", "orders.yaml: notify: lists a notifier twice"),
        ("table: [unclosed\n", "orders.yaml: line 2: invalid YAML"),
        ("- a list\n", "orders.yaml: expected a mapping of fields, got list"),
    ],
)
def test_bad_rules_name_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(tmp_path, text)


def test_key_is_one_column_or_several_or_the_primary_key(tmp_path: Path) -> None:
    composite = load_one(tmp_path, GOOD.replace("key: id\n", "key: [id, created]\n"))
    assert composite.key == ["id", "created"]
    assert composite.alert_columns(["id", "created"]) == ["id", "created", "paid_at"]
    assert load_one(tmp_path, GOOD.replace("key: id\n", "")).key is None


def test_every_bad_file_is_reported_at_once(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", GOOD + "every: nope\n")
    write(tmp_path, "b.yaml", GOOD + "after: nope\n")
    with pytest.raises(ConfigError) as exc:
        load_rules(tmp_path)
    lines = str(exc.value).splitlines()
    assert len(lines) == 2 and "a.yaml: every" in lines[0] and "b.yaml: after" in lines[1]


def test_duplicate_names_are_an_error(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", GOOD + "name: same\n")
    write(tmp_path, "b.yaml", GOOD + "name: same\n")
    with pytest.raises(ConfigError, match=r"b.yaml: name: 'same' is already used by .*a.yaml"):
        load_rules(tmp_path)


def test_unknown_notifier_is_named(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, "orders.yaml", GOOD))
    with pytest.raises(ConfigError, match=r"orders.yaml: notify: unknown notifier 'console'"):
        check_notifier_names(rules, {"ops"})


def test_missing_or_empty_rules_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rules folder not found"):
        load_rules(tmp_path / "nope")
    with pytest.raises(ConfigError, match="no rules"):
        load_rules(tmp_path)


@pytest.mark.parametrize(
    ("open_when", "expected"),
    [
        # A stray parenthesis would close the AND (...) the claim wraps it in.
        ("status = 'paid') OR (true", 'not one SQL condition: syntax error at or near ")"'),
        ("true) or (1=1", "not one SQL condition: syntax error"),
        ("(status = 'paid'", "not one SQL condition: syntax error"),
        ("status = 'paid' -- ) OR (true", "must not contain SQL comments"),
        ("status = 'paid' /* ) OR (true */", "must not contain SQL comments"),
        ("status = 'paid'; DELETE FROM orders", "must be one SQL condition, without ';'"),
        ("true UNION SELECT true", "must be one SQL condition, not a query"),
        ("true ORDER BY 1", "must be one SQL condition, not a query"),
        ("true LIMIT 1", "must be one SQL condition, not a query"),
        ("true GROUP BY status", "must be one SQL condition, not a query"),
        ("true FOR UPDATE", "must be one SQL condition, not a query"),
        ("id IN (SELECT order_id FROM refunds)", "must not contain a subquery"),
        ("EXISTS (SELECT 1)", "must not contain a subquery"),
        ("status = $1", "must not contain parameters ($1)"),
        ("status = 'paid", "not one SQL condition"),  # an unterminated literal
        ("status = $$paid", "not one SQL condition"),  # an unterminated dollar quote
        # Quoting that hides a parenthesis is one literal, so one expression: accepted.
        ("status = E'paid\\') OR (true'", None),
        ("status = $$ ) OR (true $$", None),
        ("status = 'it''s' AND note LIKE '%)%'", None),
        ("status IN ('paid', 'packed') AND total > 0", None),
        # Volatile functions parse; PostgreSQL refuses them at check/migrate (partial index).
        ("random() > 0.5", None),
        # PostgreSQL's server functions, slawatch's own and those reaching settings are
        # refused by name, as in a query rule (docs/explanation/safety.md).
        ("pg_sleep(1) IS NULL", "must not call pg_sleep(): a function that writes, locks"),
        ("pg_stat_reset() IS NULL", "must not call pg_stat_reset(): a server function"),
        ("current_setting('data_directory') <> ''", "must not call current_setting()"),
        ("slawatch.claim_gate('x', 'y')", "must not call slawatch.claim_gate(): slawatch's own"),
        ("pg_typeof(id) IS NOT NULL", None),
    ],
)
def test_open_when_is_exactly_one_expression(
    tmp_path: Path, open_when: str, expected: str | None
) -> None:
    text = GOOD.replace("open_when: \"status = 'paid'\"", f"open_when: {json.dumps(open_when)}")
    if expected is None:
        assert load_one(tmp_path, text).open_when == open_when
    else:
        assert f"orders.yaml: open_when: {expected}" in error_of(tmp_path, text)


def test_a_nul_in_open_when_is_refused(tmp_path: Path) -> None:
    """Both the parser and libpq stop reading at NUL: what follows would go unchecked."""
    text = GOOD.replace(
        "open_when: \"status = 'paid'\"", "open_when: \"status = 'paid'\\0) OR (true\""
    )
    assert "open_when: must not contain a NUL character" in error_of(tmp_path, text)


EVENTS = "name: parcel\nnotify: [ops]\n"


def test_an_event_rule_watches_its_own_timer_table(tmp_path: Path) -> None:
    rule = load_one(
        tmp_path,
        EVENTS + "events: {start: shipped, stop: [delivered, returned], within: 72h, min: 5m}\n",
    )
    assert rule.events is not None
    assert (rule.table, rule.key, rule.deadline, rule.open_when) == (
        "slawatch.parcel_timers",
        ["key"],
        "due_at",
        "open",
    )
    assert rule.columns == ["data", "started_at", "events", "too_fast"]
    assert rule.events.types() == {"shipped": "start", "delivered": "stop", "returned": "stop"}


PING_KEY = "5f0c2b9e-81d4-4a7c-9b3e-2d6f1a8c4e70"


def test_a_ping_key_is_a_secret_of_its_own_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ping = "events: {beat: a, fail: f, within: 1h, ping: {key: '${BACKUP_PING_KEY}'}}\n"
    write(tmp_path, "backup.yaml", "notify: [ops]\n" + ping)
    monkeypatch.setenv("BACKUP_PING_KEY", PING_KEY)
    (rule,) = load_rules(tmp_path)
    assert rule.events is not None and rule.events.ping is not None
    assert rule.events.ping.key.get_secret_value() == PING_KEY
    assert PING_KEY not in repr(rule)
    other = f"events: {{beat: b, fail: g, within: 1h, ping: {{key: {PING_KEY}}}}}\n"
    write(tmp_path, "nightly.yaml", "notify: [ops]\n" + other)
    assert "events.ping.key: the same key as rule backup's" in error_of(
        tmp_path, "notify: [ops]\n" + other, "nightly.yaml"
    )


def test_a_start_stop_rule_may_expect_its_runs(tmp_path: Path) -> None:
    write(
        tmp_path,
        "orders.yaml",
        EVENTS + "events: {start: a, stop: b, within: 10m, schedule: '0 * * * *', grace: 5m}\n",
    )
    (rule,) = load_rules(tmp_path)
    assert rule.events is not None and rule.events.scheduled
    at = datetime(2026, 11, 25, 2, 3, tzinfo=UTC)
    assert rule.events.next_due(at) == datetime(2026, 11, 25, 3, 5, tzinfo=UTC)
    write(
        tmp_path, "orders.yaml", EVENTS + "events: {start: a, stop: b, within: 10m, period: 1h}\n"
    )
    (rule,) = load_rules(tmp_path)
    assert rule.events is not None and rule.events.scheduled
    assert rule.events.period == timedelta(hours=1)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (
            "events: {start: a, stop: b, within: 1h}\ntable: orders\n",
            "table: not for an event rule",
        ),
        ("events: {start: a, stop: b, within: 1h}\nopen_when: x\n", "open_when: not for an event"),
        ("events: {start: a, within: 1h}\n", "events: 'start' needs 'stop'"),
        ("events: {start: a, stop: b}\n", "events: 'start' needs 'within'"),
        ("events: {start: a, stop: b, within: 1h, min: 1h}\n", "'min' must be shorter"),
        ("events: {start: a, stop: a, within: 1h}\n", "type 'a' is both start and stop"),
        ("events: {start: 'a b', stop: c, within: 1h}\n", "events.start: 'a b' is not an event"),
        ("events: {start: a, stop: b, within: 1h, wihtin: 2h}\n", "events.wihtin: unknown field"),
        ("events: {beat: a}\n", "'beat' needs exactly one of 'within'"),
        ("events: {beat: a, within: 1h, schedule: '0 2 * * *'}\n", "needs exactly one of"),
        ("events: {beat: a, schedule: '0 25 * * *'}\n", "is not a cron expression"),
        ("events: {beat: a, schedule: '0 0 31 2 *'}\n", "'0 0 31 2 *' never fires"),
        ("events: {beat: a, schedule: '0 0 31 4,6 *'}\n", "never fires"),
        ("events: {beat: a, within: 1h, grace: 5m}\n", "'grace' goes with 'schedule':"),
        ("events: {beat: a, within: 1h, timezone: UTC}\n", "'timezone' goes with 'schedule'"),
        ("events: {beat: a, within: 1h, period: 1h}\n", "'period' goes with 'start'"),
        (
            "events: {start: a, stop: b, within: 1h, grace: 5m}\n",
            "'grace' goes with 'schedule' or 'period'",
        ),
        (
            "events: {start: a, stop: b, within: 1h, period: 1h, timezone: UTC}\n",
            "'timezone' goes with 'schedule'",
        ),
        (
            "events: {start: a, stop: b, within: 10m, period: 1h, schedule: '0 * * * *'}\n",
            "'schedule' and 'period' both say when a run is expected: give one",
        ),
        (
            "events: {start: a, stop: b, within: 10m, period: 1h, min: 1m}\n",
            "'min' does not go with 'schedule' or 'period'",
        ),
        ("events: {start: a, stop: b, within: 10m, period: 0s}\n", "events.period"),
        ("events: {beat: a, stop: b, within: 1h}\n", "'stop' goes with 'start'"),
        ("events: {beat: a, schedule: '0 2 * * *', timezone: Mars/Base}\n", "not a time zone"),
        ("events: {start: [], stop: b, within: 1h}\n", "must name 1 to 100 event types"),
        ("events: {start: a, stop: b, within: 0s}\n", "events.within"),
        (
            "events: {beat: a, fail: f, within: 1h, ping: {key: short-key-0123456789}}\n",
            "events.ping.key: a ping key is a UUID or 22 to 200",
        ),
        (
            "events: {beat: a, within: 1h, ping: {key: 5f0c2b9e-81d4-4a7c-9b3e-2d6f1a8c4e70}}\n",
            "'ping' needs 'fail'",
        ),
    ],
)
def test_bad_event_rules_name_file_and_field(tmp_path: Path, events: str, expected: str) -> None:
    message = error_of(tmp_path, EVENTS + events)
    assert expected in message
    assert message.startswith(str(tmp_path / "orders.yaml"))
    assert "\n" not in message


def test_a_schedule_that_fires_once_in_four_years_is_taken(tmp_path: Path) -> None:
    found = load_one(tmp_path, EVENTS + "events: {beat: a, schedule: '0 0 29 2 *'}\n")
    assert found.events is not None and found.events.schedule == "0 0 29 2 *"


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ("columns: [id, _slawatch_truncated]\n", "columns: a column named _slawatch_truncated"),
        ("columns: [_slawatch_truncated]\n", "columns: a column named _slawatch_truncated"),
        ("key: [id, _slawatch_truncated]\n", "key or deadline: a column named"),
    ],
)
def test_a_column_named_as_the_row_cap_field_is_refused(
    tmp_path: Path, fields: str, where: str
) -> None:
    """The field that stands in for row data over 64 KiB (engine/outbox.py) is not also a
    real column of the row: a row that had one would read as replaced, and its value be
    overwritten by the sentence when the row is over the bound."""
    message = error_of(tmp_path, GOOD + fields)
    assert "orders.yaml" in message and where in message
    assert "in place of row data over 64 KiB" in message
    assert "\n" not in message
    # Left out of the alert's row, the column may be read elsewhere (open_when).
    text = GOOD.replace("'paid'", "'paid' and _slawatch_truncated") + "columns: [id]\n"
    assert load_one(tmp_path, text).columns == ["id"]
