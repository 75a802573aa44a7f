"""Every check of the configuration has a test that fails without it.

Issue 13 found two checks of rules.py (``renotify.backoff.max`` shorter than
``first``; two escalation tiers with the same ``from``) whose removal left every
test green. Each check of rules.py, the notifier models (slawatch/delivery/notifiers), the
settings and durations was removed once, and where no test failed, a case below
was added: one case per check, refused with the file and field it names, and the
bounds accepted at their limit. (Each case's comment names the check it holds.)
"""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from slawatch.config.durations import parse_duration
from slawatch.config.notifiers import RetrySettings, load_notifiers
from slawatch.config.rules import Rule, load_rules
from slawatch.config.settings import Settings, parse_bind
from slawatch.errors import ConfigError
from tests.unit.yaml_text import last_wins

GOOD = """\
table: public.orders
key: id
deadline: paid_at
after: 48h
open_when: "status = 'paid'"
notify: [console]
"""


def rule_error(tmp_path: Path, text: str) -> str:
    (tmp_path / "orders.yaml").write_text(last_wins(text))
    with pytest.raises(ConfigError) as exc:
        load_rules(tmp_path)
    return str(exc.value)


def load_rule(tmp_path: Path, text: str) -> Rule:
    (tmp_path / "orders.yaml").write_text(last_wins(text))
    (rule,) = load_rules(tmp_path)
    return rule


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # _ident: a column name is a string of letters, digits, _ and $.
        ("deadline: 5\n", "deadline: 5 is not a column name"),
        # _key_columns: at most 8 key columns.
        ("key: [a, b, c, d, e, f, g, h, i]\n", "key: must name 1 to 8 columns"),
        # Backoff._max_not_below_first.
        (
            "renotify: {backoff: {first: 2h, max: 1h}}\n",
            "renotify.backoff: backoff.max must not be shorter than backoff.first",
        ),
        # Backoff first/max, Renotify.every: at least MIN_RENOTIFY (0.001 was taken, and
        # re-notified at every scan).
        ("renotify: {backoff: {first: 0s, max: 1h}}\n", "backoff.first: '0s' is shorter than 1s"),
        ("renotify: {backoff: {first: 1h, max: 0s}}\n", "backoff.max: '0s' is shorter than 1s"),
        (
            "renotify: {backoff: {first: 0.001, max: 0.001}}\n",
            "backoff.first: 0.001 is shorter than 1s, the least slawatch accepts",
        ),
        ("renotify: {every: 0s}\n", "renotify.every: '0s' is shorter than 1s"),
        (
            "renotify: {every: 0.001}\n",
            "renotify.every: 0.001 is shorter than 1s, the least slawatch accepts (a"
            " re-notification is taken by a scan, at most one a second)",
        ),
        # Renotify.max: 1 to 1,000,000.
        ("renotify: {every: 1h, max: 0}\n", "renotify.max: 0: Input should be greater than or"),
        ("renotify: {every: 1h, max: 1000001}\n", "renotify.max: 1000001: Input should be less"),
        # Renotify._one_schedule: not both.
        ("renotify: {every: 1h, backoff: {first: 1h, max: 2h}}\n", "exactly one of 'every' or"),
        # Tier.from_ >= 1.
        ("escalate: [{from: 0, severity: critical}]\n", "escalate.0.from: 0: Input should be"),
        # Tier.notify: at least one, none twice.
        ("escalate: [{from: 2, notify: []}]\n", "escalate.0.notify: []: List should have at"),
        ("escalate: [{from: 2, notify: [a, a]}]\n", "escalate.0.notify: lists a notifier twice"),
        # Tier.severity: one of the three.
        ("escalate: [{from: 2, severity: loud}]\n", "escalate.0.severity: 'loud': Input should"),
        # Rule._tiers: one tier per `from`.
        (
            "renotify: {every: 1h}\nescalate: [{from: 3, severity: critical}, {from: 3,"
            " notify: [pager]}]\n",
            "orders.yaml: escalate: two tiers have the same 'from'",
        ),
        # Rule._table: table or schema.table.
        ("table: a.b.c\n", "table: 'a.b.c' is not a table name (table or schema.table)"),
        # Rule._open_when: not blank.
        ("open_when: '   '\n", "open_when: must be an SQL condition, e.g. status = 'paid'"),
        # Rule.every / sweep: PositiveDuration; after: a Duration (0 or more).
        ("every: 0s\n", "every: '0s' is shorter than 1s, the least slawatch accepts"),
        # Rule.every: at least MIN_EVERY (an operator's `every: 0.001` ran ~735
        # transactions a second); 'ms' is not a unit.
        (
            "every: 0.001\n",
            "every: 0.001 is shorter than 1s, the least slawatch accepts (each scan is a",
        ),
        ("every: 0.999\n", "every: 0.999 is shorter than 1s, the least slawatch accepts"),
        ("every: PT0.5S\n", "every: 'PT0.5S' is shorter than 1s, the least slawatch accepts"),
        ("every: 1ms\n", "every: '1ms' is not a duration: 'ms' is not a unit (a number of"),
        # Rule.sweep: at least MIN_SWEEP (it had no minimum but more than 0s).
        (
            "track: table\nsweep: 0s\n",
            "sweep: '0s' is shorter than 1s, the least slawatch accepts (a sweep is part of a"
            " scan, at most one a second)",
        ),
        ("track: table\nsweep: 0.5\n", "sweep: 0.5 is shorter than 1s, the least slawatch"),
        ("track: table\nsweep: PT0.5S\n", "sweep: 'PT0.5S' is shorter than 1s, the least"),
        ("after: -1\n", "after: -1 is negative; a duration must be 0 or more"),
        # A rule file's durations are YAML's: a quoted number is text there (elsewhere,
        # an environment variable's, a number needs a unit: test_durations.py).
        ("after: '30'\n", "after: '30' is not a duration: YAML reads it as text; write the"),
        (
            "after: P1.5D\n",
            "after: 'P1.5D' is not a duration: ISO 8601 fractions are accepted in seconds"
            " only (PT0.5S); write P1DT12H or 1d12h",
        ),
        # Rule.batch: 1 to 1,000,000.
        ("batch: 1000001\n", "batch: 1000001: Input should be less than or equal to 1000000"),
        # Rule.name: the pattern (here: too long).
        ("name: " + "a" * 41 + "\n", "is not a rule name"),
    ],
)
def test_a_rule_check(tmp_path: Path, extra: str, expected: str) -> None:
    message = rule_error(tmp_path, GOOD + extra)
    assert f"{tmp_path}/orders.yaml: " in message and expected in message, message


def test_rule_bounds_are_accepted_at_their_limit(tmp_path: Path) -> None:
    text = GOOD.replace("key: id\n", "key: [a, b, c, d, e, f, g, h]\n")
    text += "batch: 1000000\nrenotify: {backoff: {first: 1h, max: 1h}, max: 1000000}\n"
    text += "escalate: [{from: 1, severity: info}]\nname: " + "a" * 40 + "\n"
    text += "every: 1\n"  # MIN_EVERY
    rule = load_rule(tmp_path, text)
    assert rule.every == timedelta(seconds=1)
    swept = load_rule(tmp_path, GOOD + "track: table\nsweep: 1s\n")  # MIN_SWEEP
    assert swept.sweep == timedelta(seconds=1)
    again = load_rule(tmp_path, GOOD + "renotify: {every: 1s}\n")  # MIN_RENOTIFY
    assert again.renotify is not None and again.renotify.every == timedelta(seconds=1)
    again = load_rule(tmp_path, GOOD + "renotify: {backoff: {first: 1s, max: 1s}}\n")
    assert again.renotify is not None and again.renotify.backoff is not None
    assert rule.batch == 1_000_000 and rule.key is not None and len(rule.key) == 8
    assert rule.renotify is not None and rule.renotify.max == 1_000_000


def test_open_when_is_kept_without_surrounding_space(tmp_path: Path) -> None:
    """Rule._open_when strips: the text goes into the partial index's predicate, which
    migrate compares with PostgreSQL's own text of it."""
    rule = load_rule(tmp_path, GOOD.replace("\"status = 'paid'\"", "\"  status = 'paid'\\n \""))
    assert rule.open_when == "status = 'paid'"


def test_tiers_apply_in_order_of_their_from_whatever_the_file_order(tmp_path: Path) -> None:
    """Rule._tiers sorts: the last tier *reached* wins, not the last one written."""
    rule = load_rule(
        tmp_path,
        GOOD + "renotify: {every: 1h}\n"
        "escalate: [{from: 5, severity: critical}, {from: 3, severity: info}]\n",
    )
    assert [t.from_ for t in rule.escalate] == [3, 5]
    assert [rule.tier_for(n)[0] for n in (1, 3, 4, 5, 9)] == [
        "warning",
        "info",
        "info",
        "critical",
        "critical",
    ]


def test_backoff_doublings_reach_the_cap_however_far(tmp_path: Path) -> None:
    """Backoff.doublings counts every doubling up to max (17 from 1s to 1d)."""
    rule = load_rule(tmp_path, GOOD + "renotify: {backoff: {first: 1s, max: 1d}}\n")
    assert rule.renotify is not None and rule.renotify.backoff is not None
    assert rule.renotify.backoff.doublings == 17
    waits = [rule.renotify.interval_after(n) for n in range(1, 20)]
    assert waits[:4] == [timedelta(seconds=s) for s in (1, 2, 4, 8)]
    assert waits[16] == timedelta(seconds=65536)
    assert waits[17:] == [timedelta(days=1)] * 2


# ---------------------------------------------------------------- notifiers


def notifier_error(tmp_path: Path, text: str) -> str:
    (tmp_path / "hook.yaml").write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_notifiers(tmp_path)
    return str(exc.value)


HOOK = "type: webhook\nurl: http://127.0.0.1:9/hook\n"
ROUTING_KEY = "0123456789abcdef0123456789ABCDEF"
PAGERDUTY = f"type: pagerduty\nrouting_key: {ROUTING_KEY}\n"
SLACK = "type: slack\nurl: https://hooks.slack.com/services/T/B/X\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # RetrySettings.attempts: 1 to 1000.
        (HOOK + "retry: {attempts: 1001}\n", "retry.attempts: 1001: Input should be less"),
        # RetryInterval: longer than 0, at most 30 days.
        (HOOK + "retry: {first: 0s}\n", "retry.first: '0s' must be longer than 0s"),
        (HOOK + "retry: {max: 31d}\n", "retry.max: '31d' is longer than 30 days"),
        # Timeout: longer than 0, at most 1 hour.
        (HOOK + "timeout: 0s\n", "timeout: '0s' must be longer than 0s"),
        (HOOK + "timeout: 61m\n", "timeout: '61m' is longer than 1 hour"),
        # StormSettings: threshold 1 to 1,000,000, listed 0 to 100, wait at most 10m.
        (HOOK + "storm: 0\n", "storm.threshold: 0: Input should be greater than or equal"),
        (HOOK + "storm: 1000001\n", "storm.threshold: 1000001: Input should be less"),
        (HOOK + "storm: {threshold: 5, listed: -1}\n", "storm.listed: -1: Input should be"),
        (HOOK + "storm: {threshold: 5, listed: 101}\n", "storm.listed: 101: Input should be"),
        (HOOK + "storm: {threshold: 5, wait: 11m}\n", "storm.wait: '11m' is longer than 10m"),
        # _storm: YAML's true is no threshold; a word is neither form.
        (HOOK + "storm: true\n", "storm: True is neither a threshold (storm: 100) nor a"),
        (HOOK + "storm: lots\n", "storm: 'lots' is neither a threshold"),
        # _Base: name pattern, batch 1 to 10,000, concurrency 1 to 16.
        (HOOK + "name: 'ops hook'\n", "name: 'ops hook': String should match pattern"),
        (HOOK + "batch: 0\n", "batch: 0: Input should be greater than or equal to 1"),
        (HOOK + "batch: 10001\n", "batch: 10001: Input should be less than or equal"),
        (HOOK + "concurrency: 0\n", "concurrency: 0: Input should be greater than or equal"),
        (HOOK + "concurrency: 17\n", "concurrency: 17: Input should be less than or equal"),
        # _HttpTarget._url: a URL with a password in it is not quoted.
        (
            "type: webhook\nurl: 'ftp://u:hunter2@h/x'\n",
            "url: the value is not an http:// or https:// URL",
        ),
        # _HttpTarget._url: httpx's own check (a character it refuses).
        ('type: webhook\nurl: "http://h/x\\x7f"\n', "url: not a valid URL: Invalid non-printable"),
        # WebhookConfig._secret: base64, checked strictly (not only its valid characters).
        (HOOK + "secret: 'whsec_QUJD!'\n", "secret: must be a Standard Webhooks secret"),
        # EmailConfig: port 1 to 65535, at least one recipient.
        ("type: email\nhost: h\nfrom: a@b\nto: [c@d]\nport: 0\n", "port: 0: Input should be"),
        ("type: email\nhost: h\nfrom: a@b\nto: [c@d]\nport: 65536\n", "port: 65536: Input"),
        ("type: email\nhost: h\nfrom: a@b\nto: []\n", "to: []: List should have at least 1"),
        # broker_url: the broker's own parser (redis, amqp).
        ("type: redis\nurl: 'redis://h/0?db=x'\n", "url: not a valid URL: Invalid value for"),
        ("type: amqp\nurl: 'amqp://h/?frobnicate=1'\n", "url: not a valid URL: Unknown URL"),
        # RedisConfig.maxlen >= 1.
        ("type: redis\nmaxlen: 0\n", "maxlen: 0: Input should be greater than or equal to 1"),
        # _http_parse: httpx's check of a Slack URL.
        ('type: slack\nurl: "https://h/x\\x7f"\n', "url: not a valid URL: Invalid non-printable"),
        # SlackConfig: batch >= 1, listed 1 to 45.
        (SLACK + "batch: 0\n", "batch: 0: Input should be greater than or equal to 1"),
        (SLACK + "listed: 0\n", "listed: 0: Input should be greater than or equal to 1"),
        # PagerDutyConfig: source at most 255 characters, batch >= 1.
        (PAGERDUTY + "source: " + "s" * 256 + "\n", "String should have at most 255"),
        (PAGERDUTY + "batch: 0\n", "batch: 0: Input should be greater than or equal to 1"),
        # _plain_url: a base URL that httpx refuses, or whose port is not a number.
        (PAGERDUTY + 'base_url: "https://h/x\\x7f"\n', "base_url: not a valid URL: Invalid"),
        (PAGERDUTY + "base_url: 'https://h:99999/'\n", "base_url: not a valid URL: the port"),
        # _HttpTarget._url: a port out of range (httpx takes it, every send would fail).
        ("type: webhook\nurl: 'http://h:99999/'\n", "url: not a valid URL: the port is not"),
        # AlertmanagerConfig._labels: a value of at most 1024 characters.
        (
            "type: alertmanager\nurl: http://am\nlabels: {team: " + "t" * 1025 + "}\n",
            "labels: team: the value must be 1 to 1024 characters",
        ),
    ],
)
def test_a_notifier_check(tmp_path: Path, text: str, expected: str) -> None:
    message = notifier_error(tmp_path, text)
    assert message.startswith(f"{tmp_path}/hook.yaml: "), message
    assert expected in message, message
    assert "hunter2" not in message


def test_notifier_bounds_are_accepted_at_their_limit(tmp_path: Path) -> None:
    (tmp_path / "hook.yaml").write_text(
        HOOK + "batch: 10000\nconcurrency: 16\ntimeout: 1h\n"
        "retry: {first: 30d, max: 30d, attempts: 1000}\n"
        "storm: {threshold: 1000000, listed: 100, wait: 10m}\n"
    )
    (tmp_path / "mail.yaml").write_text("type: email\nhost: h\nfrom: a@b\nto: [c@d]\nport: 65535\n")
    (tmp_path / "am.yaml").write_text(
        "type: alertmanager\nurl: http://am\nlabels: {team: " + "t" * 1024 + "}\n"
    )
    assert len(load_notifiers(tmp_path)) == 3


def test_no_notifiers_folder_means_no_notifiers(tmp_path: Path) -> None:
    assert load_notifiers(tmp_path / "absent") == []


def test_retry_delays_double_from_first_and_stop_at_max() -> None:
    """RetrySettings.delay: min(first * 2^(attempt-1), max), exactly (jitter is applied by
    the delivery loop, and tested there against a real receiver: test_backoff.py)."""
    retry = RetrySettings(first=timedelta(seconds=1), max=timedelta(seconds=10), attempts=9)
    delays = [retry.delay(attempt).total_seconds() for attempt in range(1, 9)]
    assert delays == [1, 2, 4, 8, 10, 10, 10, 10]
    # Thousands of attempts cannot overflow: the cap holds.
    assert retry.delay(100_000) == timedelta(seconds=10)


# ---------------------------------------------------------------- settings


def settings_error(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> str:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as exc:
        Settings()
    return str(exc.value)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        # Settings.db_timeout: at most an hour.
        ("SLAWATCH_DB_TIMEOUT", "3601", "less than or equal to 3600"),
        # _http: an address that is not host:port.
        ("SLAWATCH_HTTP", "nonsense", "'nonsense' is not host:port"),
        # _public_url: http(s) only, no query, at most 2000 characters.
        ("SLAWATCH_PUBLIC_URL", "ftp://s.example", "is not an http:// or https:// URL"),
        ("SLAWATCH_PUBLIC_URL", "https://s.example/" + "p" * 2000, "is not an http://"),
        # _token: 16 or more printable ASCII characters, no space.
        ("SLAWATCH_API_TOKEN", "short", "at least 16 printable ASCII characters"),
        ("SLAWATCH_API_TOKEN", "tøken-tøken-tøken-tøken", "at least 16 printable ASCII"),
        ("SLAWATCH_API_TOKEN", "token\x01token-token-token", "at least 16 printable ASCII"),
        ("SLAWATCH_API_TOKEN", "token token token token", "at least 16 printable ASCII"),
    ],
)
def test_a_setting_check(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    assert expected in settings_error(monkeypatch, variable, value)


def test_settings_accepted_at_their_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLAWATCH_DB_TIMEOUT", "3600")
    monkeypatch.setenv("SLAWATCH_API_TOKEN", "t" * 16)
    monkeypatch.setenv("SLAWATCH_PUBLIC_URL", "https://s.example/oncall/")
    settings = Settings()
    assert settings.db_timeout == 3600
    assert settings.admin_url == "https://s.example/oncall"  # no trailing slash in links


@pytest.mark.parametrize(
    ("http", "url"),
    [
        ("127.0.0.1:8181", "http://127.0.0.1:8181"),
        ("[::1]:8181", "http://[::1]:8181"),  # an IPv6 host in brackets
        ("0.0.0.0:8181", None),  # every interface: no address to link to
        ("[::]:8181", None),
        ("", None),
    ],
)
def test_admin_url_from_the_bind_address(
    monkeypatch: pytest.MonkeyPatch, http: str, url: str | None
) -> None:
    monkeypatch.delenv("SLAWATCH_PUBLIC_URL", raising=False)
    monkeypatch.setenv("SLAWATCH_HTTP", http)
    assert Settings().admin_url == url


@pytest.mark.parametrize(
    "text",
    [
        "127.0.0.1:\uff18\uff11\uff18\uff11",  # fullwidth digits: digits, not ASCII
        "127.0.0.1:000080",  # more than 5 digits
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "[not-an-address]:8181",
    ],
)
def test_a_bind_address_check(text: str) -> None:
    with pytest.raises(ValueError, match="is not host:port"):
        parse_bind(text)


# ---------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # _bounded applies to a timedelta too.
        (timedelta(days=36501), "is longer than 100 years"),
        # Neither a string nor a number.
        ([1, 2], "is not a duration"),
        (None, "is not a duration"),
        (math.nan, "nan is not a duration"),
        # ISO 8601 with nothing after the T.
        ("P1DT", "is not a duration"),
    ],
)
def test_a_duration_check(value: Any, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        parse_duration(value)


# Names as PostgreSQL reads them (an operator probe: `key: ключ` was refused as "not
# letters"): a letter of any script or _ first, then letters, digits, _ and $, at most
# 63 bytes in UTF-8 (NAMEDATALEN - 1), not 63 characters.
CYRILLIC_63 = "я" * 31 + "x"  # 63 bytes, 32 characters
CYRILLIC_64 = "я" * 32  # 64 bytes, 32 characters


def test_names_of_any_script_are_column_table_and_schema_names(tmp_path: Path) -> None:
    text = GOOD.replace("table: public.orders", "table: склад.заказы")
    text = text.replace("key: id", "key: ключ")
    text = text.replace("deadline: paid_at", "deadline: оплачен")
    text += "columns: [ключ, Сумма_2$, हिन्दी, 日本語, _x]\n"
    rule = load_rule(tmp_path, text)
    assert (rule.schema_name, rule.table_name) == ("склад", "заказы")
    assert rule.key == ["ключ"] and rule.deadline_column == "оплачен"
    assert rule.columns == ["ключ", "Сумма_2$", "हिन्दी", "日本語", "_x"]
    assert rule.deadline_sql("t") == '"t"."оплачен"'
    assert load_rule(tmp_path, GOOD + f"columns: [{CYRILLIC_63}]\n").columns == [CYRILLIC_63]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            f"columns: [{CYRILLIC_64}]\n",
            f"columns.0: '{CYRILLIC_64}' is not a column name: 64 bytes in UTF-8, at most 63",
        ),
        (
            f"key: {CYRILLIC_64}\n",
            f"key.0: '{CYRILLIC_64}' is not a column name: 64 bytes in UTF-8, at most 63",
        ),
        # The part of schema.table that is wrong is named (the schema was "a table name").
        (
            f"table: {CYRILLIC_64}.orders\n",
            f"table: '{CYRILLIC_64}.orders': '{CYRILLIC_64}' is not a schema name: 64 bytes in"
            " UTF-8, at most 63",
        ),
        (
            f"table: public.{CYRILLIC_64}\n",
            f"table: 'public.{CYRILLIC_64}': '{CYRILLIC_64}' is not a table name: 64 bytes in"
            " UTF-8, at most 63",
        ),
        (
            "table: 2x.orders\n",
            "table: '2x.orders': '2x' is not a schema name (a letter or _, then letters,"
            " digits, _ and $)",
        ),
        ("table: .orders\n", "table: '.orders': '' is not a schema name (a letter or _"),
        ("table: склад.2x\n", "table: 'склад.2x': '2x' is not a table name (a letter or _"),
        ("table: 2x\n", "table: '2x' is not a table name (a letter or _, then letters,"),
        (
            "columns: [2x]\n",
            "columns.0: '2x' is not a column name (a letter or _, then letters, digits, _ and $)",
        ),
        ("columns: ['ключ-2']\n", "columns.0: 'ключ-2' is not a column name (a letter or _"),
        ("key: '$x'\n", "key.0: '$x' is not a column name"),
    ],
)
def test_a_name_is_refused_for_what_is_wrong_with_it(
    tmp_path: Path, extra: str, expected: str
) -> None:
    message = rule_error(tmp_path, GOOD + extra)
    assert f"{tmp_path}/orders.yaml: {expected}" in message, message


def test_an_actions_placeholders_and_role_may_be_of_any_script(tmp_path: Path) -> None:
    text = GOOD.replace("key: id", "key: ключ") + "columns: [ключ, сумма]\n"
    text += "action: {on: 1, role: роль, sql: 'UPDATE orders SET n = :сумма WHERE id = :ключ'}\n"
    rule = load_rule(tmp_path, text)
    assert rule.action is not None and rule.action.role == "роль"
    assert rule.action.placeholders == ["сумма", "ключ"]
    assert Settings(action_role="роль").action_role == "роль"


# Names are compared byte for byte by PostgreSQL: 'é' decomposed (e + U+0301, NFD, as
# some systems write text) is another name than the 'é' a table is created with (NFC),
# so such a name passed load and then missed its table or column. It is refused, with
# the NFC form to write (test_unicode_names.py: against a real table).
CAFE_NFD, CAFE = "cafe\u0301", "caf\u00e9"
CHAI_NFD, CHAI = "ча\u0438\u0306", "ча\u0439"
NOT_NFC = "is not composed (Unicode NFC) and PostgreSQL compares names byte for byte"
E_NFC = f"its 'e\u0301' (U+0065 U+0301) {NOT_NFC}; write it as NFC has it (U+00E9)"
Y_NFC = f"its '\u0438\u0306' (U+0438 U+0306) {NOT_NFC}; write it as NFC has it (U+0439)"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            f"table: склад.{CHAI_NFD}\n",
            f"table: 'склад.{CHAI_NFD}': '{CHAI_NFD}' is not a table name: {Y_NFC}: '{CHAI}'",
        ),
        (
            f"table: {CAFE_NFD}.orders\n",
            f"table: '{CAFE_NFD}.orders': '{CAFE_NFD}' is not a schema name: {E_NFC}: '{CAFE}'",
        ),
        (f"key: {CAFE_NFD}\n", f"key.0: '{CAFE_NFD}' is not a column name: {E_NFC}: '{CAFE}'"),
        (
            f"deadline: {CAFE_NFD}\n",
            f"deadline: '{CAFE_NFD}' is not a column name: {E_NFC}: '{CAFE}'",
        ),
        (
            f"columns: [id, {CHAI_NFD}_2]\n",
            f"columns.1: '{CHAI_NFD}_2' is not a column name: {Y_NFC}: '{CHAI}_2'",
        ),
        (
            f"columns: [{CAFE}]\n"
            f"action: {{on: 1, sql: 'UPDATE t SET n = 1 WHERE c = :{CAFE_NFD}'}}\n",
            f":{CAFE_NFD}: '{CAFE_NFD}' is not a column name: {E_NFC}: '{CAFE}'",
        ),
        (
            f"action: {{on: 1, role: {CAFE_NFD}, sql: 'UPDATE t SET n = 1'}}\n",
            f"action.role: '{CAFE_NFD}' is not a role name: {E_NFC}: '{CAFE}'",
        ),
        # A deadline written as a name is a name (longer than 63 bytes: refused, not
        # taken for an expression that PostgreSQL would truncate).
        (
            f"deadline: {CYRILLIC_64}\n",
            f"deadline: '{CYRILLIC_64}' is not a column name: 64 bytes in UTF-8, at most 63",
        ),
    ],
)
def test_a_name_not_in_nfc_is_refused_with_its_nfc_form(
    tmp_path: Path, extra: str, expected: str
) -> None:
    message = rule_error(tmp_path, GOOD + extra)
    assert f"{tmp_path}/orders.yaml: " in message and expected in message, message
    assert len(message.splitlines()) == 1, message


def test_a_query_rules_deadline_not_in_nfc_is_refused_with_its_nfc_form(tmp_path: Path) -> None:
    text = (
        f"query: SELECT 1 AS id, now() AS {CAFE}\ntrack: table\nkey: id\n"
        f"deadline: {CAFE_NFD}\nopen_when: 'true'\nnotify: [console]\n"
    )
    message = rule_error(tmp_path, text)
    assert f"deadline: '{CAFE_NFD}' is not a column name: {E_NFC}: '{CAFE}'" in message, message


def test_the_nfc_forms_are_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = GOOD.replace("table: public.orders", f"table: {CAFE}.{CHAI}")
    text = text.replace("key: id", f"key: {CAFE}").replace("deadline: paid_at", f"deadline: {CHAI}")
    text += f"action: {{on: 1, role: {CAFE}, sql: 'UPDATE t SET n = 1 WHERE c = :{CAFE}'}}\n"
    rule = load_rule(tmp_path, text)
    assert (rule.schema_name, rule.table_name, rule.deadline_column) == (CAFE, CHAI, CHAI)
    assert rule.action is not None and rule.action.placeholders == [CAFE]
    monkeypatch.setenv("SLAWATCH_ACTION_ROLE", CAFE_NFD)
    with pytest.raises(ValidationError) as exc:
        Settings()
    assert f"'{CAFE_NFD}' is not a role name: {E_NFC}: '{CAFE}'" in str(exc.value)
