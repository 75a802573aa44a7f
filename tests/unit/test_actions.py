"""A rule's ``action:`` (docs/explanation/actions.md) as rules load: exactly one INSERT,
UPDATE, DELETE or SELECT fn(...), checked by PostgreSQL's parser; ``:name`` placeholders must be the
rule's key or columns and become parameters, never text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slawatch.config.rules import Rule, action_statement, load_rules
from slawatch.errors import ConfigError

GOOD = """\
table: public.jobs
key: id
deadline: heartbeat_at
after: 15m
open_when: "status = 'running'"
renotify: {every: 15m, max: 4}
columns: [id, kind]
notify: [console]
"""


def load(tmp_path: Path, action: object) -> Rule:
    (tmp_path / "jobs.yaml").write_text(GOOD + f"action: {json.dumps(action)}\n")
    return load_rules(tmp_path)[0]


def error_of(tmp_path: Path, action: object) -> str:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, action)
    return str(exc.value)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("update jobs set status = 'queued' where id = :id; delete from jobs", "exactly one"),
        ("update jobs set status = 'queued' where id = :id;;", None),  # empty statements
        ("drop table jobs", "DROP (DDL or a utility statement) is not allowed"),
        ("alter table jobs add column x int", "ALTERTABLE (DDL"),
        ("truncate jobs", "TRUNCATE (DDL"),
        ("begin", "a transaction statement is not allowed"),
        ("commit", "a transaction statement is not allowed"),
        ("copy jobs to '/tmp/x'", "COPY is not allowed"),
        ("select 1", "a SELECT must be one function call"),
        ("select * from jobs where id = :id", "a SELECT must be one function call"),
        ("with d as (delete from jobs returning 1) update jobs set kind = 'x'", "WITH clause"),
        ("update jobs set kind = :nope where id = :id", "unknown placeholder :nope"),
        ("update jobs set kind = 'x' where id = $1", "not $1"),
        ("update jobs set kind = where id = :id", "not an SQL statement: syntax error"),
        ("", "must be an SQL statement"),
        ("update jobs set kind = 'x\u0000' where id = :id", "NUL"),
        ("update jobs set kind = 'x' where id = :id", None),
        ("insert into restarts (job_id) values (:id)", None),
        ("delete from jobs where id = :id and kind = :kind", None),
        ("select requeue(:id)", None),
    ],
)
def test_action_sql_is_one_statement_of_the_allowed_kinds(
    tmp_path: Path, sql: str, expected: str | None
) -> None:
    if expected is None:
        assert load(tmp_path, {"sql": sql}).action is not None
    else:
        message = error_of(tmp_path, {"sql": sql})
        assert "jobs.yaml: action" in message and expected in message
        assert "\n" not in message  # one line


def test_placeholders_become_parameters_never_text() -> None:
    text = "update jobs set kind = :kind::text, note = 'at :id 50%' where id = :id and x::int > 0"
    statement, names = action_statement(text)
    assert statement == (
        "update jobs set kind = %(kind)s::text, note = 'at :id 50%%' where id = %(id)s"
        " and x::int > 0"
    )
    assert names == ["kind", "id"]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"on": "cap"}, None),
        ({"on": 4}, None),
        ({"on": 5}, "action.on: 5 is past the cap"),
        ({"on": 0}, "not a notification number"),
        ({"on": "last"}, "not a notification number"),
        ({"max_rows": -1}, "action.max_rows"),
        ({"when": 1}, "action.when"),
    ],
)
def test_on_and_max_rows(tmp_path: Path, fields: dict[str, object], expected: str | None) -> None:
    action = {"sql": "update jobs set kind = 'x' where id = :id"} | fields
    if expected is None:
        assert load(tmp_path, action).action is not None
    else:
        assert expected in error_of(tmp_path, action)


def test_cap_needs_renotify_max(tmp_path: Path) -> None:
    (tmp_path / "jobs.yaml").write_text(
        GOOD.replace("renotify: {every: 15m, max: 4}\n", "renotify: {every: 15m}\n")
        + 'action: {sql: "select requeue(:id)", on: cap}\n'
    )
    with pytest.raises(ConfigError, match=r"'cap' needs renotify\.max"):
        load_rules(tmp_path)


def test_an_event_rule_acts_on_its_key(tmp_path: Path) -> None:
    (tmp_path / "parcel.yaml").write_text(
        "events: {start: shipped, stop: delivered, within: 72h}\n"
        "notify: [console]\n"
        'action: {sql: "select flag_parcel(:key)"}\n'
    )
    rule = load_rules(tmp_path)[0]
    assert rule.action is not None and rule.action.placeholders == ["key"]


def test_a_bare_yaml_on_key_is_on(tmp_path: Path) -> None:
    """YAML 1.1 reads ``on:`` as the boolean true; the rule still means ``on``."""
    (tmp_path / "jobs.yaml").write_text(GOOD + 'action:\n  sql: "select requeue(:id)"\n  on: 3\n')
    rule = load_rules(tmp_path)[0]
    assert rule.action is not None and rule.action.on == 3 and rule.action_on == 3


HOOK = {"url": "http://127.0.0.1:9000/restart"}
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ({"webhook": HOOK}, None),
        ({"webhook": HOOK | {"timeout": "5s", "retry": {"attempts": 3}}, "on": "cap"}, None),
        ({"on": 1}, "jobs.yaml: action: needs sql: (a statement) or webhook:"),
        (
            {"webhook": HOOK, "sql": "select requeue(:id)"},
            "jobs.yaml: action: sql: and webhook: both given; an action is one of them",
        ),
        ({"webhook": HOOK, "max_rows": 1}, "jobs.yaml: action: max_rows: not for a webhook"),
        ({"webhook": {"url": "ftp://x"}}, "action.webhook.url: 'ftp://x' is not an http://"),
        ({"webhook": {}}, "action.webhook.url: is required"),
        (
            {"webhook": HOOK | {"secret": "not a secret!"}},
            "action.webhook.secret: must be a Standard",
        ),
        ({"webhook": HOOK | {"name": "x"}}, "action.webhook: name: not for an action's webhook"),
        ({"webhook": HOOK | {"storm": 5}}, "action.webhook: storm: not for an action's webhook"),
        ({"webhook": HOOK | {"retry": {"attempts": 0}}}, "action.webhook.retry.attempts"),
        ({"webhook": HOOK | {"wait": 1}}, "action.webhook.wait: unknown field"),
    ],
)
def test_a_webhook_action_is_a_webhook_notifiers_settings(
    tmp_path: Path, action: dict[str, object], expected: str | None
) -> None:
    if expected is None:
        rule = load(tmp_path, action)
        target = rule.action_target
        assert rule.action is not None and rule.action.kind == "webhook"
        # Sent as a notifier of its own, one alert per request, at any batch of claims.
        assert target is not None and (target.name, target.batch) == ("action:jobs", 1)
        assert rule.batch == 10_000 and rule.action.placeholders == []
    else:
        message = error_of(tmp_path, action)
        assert expected in message and len(message.splitlines()) == 1


def test_a_webhook_actions_secret_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "jobs.yaml").write_text(
        GOOD + "action: {webhook: {url: 'http://h/x', secret: '${JOB_SECRET}'}}\n"
        "description: costs ${PRICE}\n"  # only the webhook's settings are read so
    )
    with pytest.raises(ConfigError, match=r"action\.webhook\.secret: .* JOB_SECRET is not set"):
        load_rules(tmp_path)
    monkeypatch.setenv("JOB_SECRET", SECRET)
    rule = load_rules(tmp_path)[0]
    target = rule.action_target
    assert target is not None and target.secret is not None
    assert target.secret.get_secret_value() == SECRET
    assert rule.description == "costs ${PRICE}"
