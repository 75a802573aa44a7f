"""What a rule's action may touch (docs/explanation/safety.md): a statement that
reads or writes the system catalogs, or calls a function that reaches files, other
servers, settings or sessions, is refused as rules load (so ``check`` refuses it),
naming the rule and the object, unless the action allows that object by name; and
the action's timeouts and role as configured."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from slawatch.cli import main
from slawatch.config.rules import Rule, with_action_role
from slawatch.engine.migrate import grants
from tests.conftest import ROOT
from tests.unit.test_actions import GOOD, error_of, load

REFUSED = [
    ("insert into jobs (kind) select rolpassword from pg_authid where :id > 0", "pg_authid"),
    ("insert into jobs (kind) select passwd from pg_shadow where :id > 0", "pg_shadow"),
    (
        "insert into jobs (kind) select rolname from pg_catalog.pg_roles where :id > 0",
        "pg_catalog.pg_roles",
    ),
    ("update pg_catalog.pg_class set relname = 'x' where oid = :id", "pg_catalog.pg_class"),
    (
        "update jobs set kind = 'x' where id = :id and exists (select 1 from pg_stat_activity)",
        "pg_stat_activity",
    ),
    (
        "update jobs set kind = (select max(table_name) from information_schema.tables)"
        " where id = :id",
        "information_schema.tables",
    ),
    ("select pg_read_file('/etc/passwd', :id, 10)", "pg_read_file"),
    ("select pg_read_binary_file('/etc/passwd', :id, 10)", "pg_read_binary_file"),
    ("update jobs set kind = (select max(f) from pg_ls_dir('.') f) where id = :id", "pg_ls_dir"),
    ("update jobs set kind = (pg_stat_file('x')).size::text where id = :id", "pg_stat_file"),
    ("select lo_import('/etc/passwd', :id)", "lo_import"),
    ("select lo_export(:id, '/tmp/x')", "lo_export"),
    ("select pg_catalog.lo_unlink(:id)", "lo_unlink"),
    ("select dblink_exec('host=elsewhere', 'delete from jobs', :id > 0)", "dblink_exec"),
    ("update jobs set kind = set_config('role', 'postgres', false) where id = :id", "set_config"),
    ("select pg_terminate_backend(:id)", "pg_terminate_backend"),
    ("select pg_cancel_backend(:id)", "pg_cancel_backend"),
    ("update jobs set kind = pg_reload_conf()::text where id = :id", "pg_reload_conf"),
    (
        "update jobs set kind = query_to_xml('select 1', true, true, '')::text where id = :id",
        "query_to_xml",
    ),
    # Other sessions' SQL, configuration files, settings: every pg_* server function.
    (
        "update jobs set kind = (select max(query) from pg_stat_get_activity(null)) where id = :id",
        "pg_stat_get_activity",
    ),
    (
        "update jobs set kind = (select max(address) from pg_hba_file_rules()) where id = :id",
        "pg_hba_file_rules",
    ),
    (
        "update jobs set kind = current_setting('data_directory') where id = :id",
        "current_setting",
    ),
    ("select pg_catalog.pg_stat_reset() where :id > 0", "pg_stat_reset"),
    # slawatch's own schema: its outbox, every rule's alerts, what keeps them.
    ("delete from slawatch.delivery where true and :id > 0", "slawatch.delivery"),
    (
        "insert into jobs (kind) select row_data::text from slawatch.alert where :id > 0",
        "slawatch.alert",
    ),
    ("select slawatch.history_drop(now() + :id * interval '1 day')", "slawatch.history_drop"),
    # SQL given as text to an extension's function: a probe's crosstab reset the action's
    # role and copied pg_authid into the application's table; pageinspect's raw pages.
    (
        "insert into jobs (kind) select c from crosstab($$select 1$$,"
        " $$select set_config('role', 'none', false)$$) as ct(r text, c text) where :id > 0",
        "crosstab",
    ),
    (
        "update jobs set kind = encode(get_raw_page('slawatch.alert_h0', 0), 'escape')"
        " where id = :id",
        "get_raw_page",
    ),
    ("update jobs set kind = (:id)::regrole::text where id = :id", "regrole"),
]


@pytest.mark.parametrize(("sql", "name"), REFUSED)
def test_an_action_that_reaches_past_the_application_is_refused_by_name(
    tmp_path: Path, sql: str, name: str
) -> None:
    message = error_of(tmp_path, {"sql": sql})
    assert "\n" not in message, message  # one line
    assert message.startswith(f"{tmp_path / 'jobs.yaml'}: action: ")
    assert f" {name}" in message and f"allow: [{name}]" in message


@pytest.mark.parametrize(("sql", "name"), REFUSED)
def test_allowing_the_object_by_name_lets_the_action_load(
    tmp_path: Path, sql: str, name: str
) -> None:
    rule = load(tmp_path, {"sql": sql, "allow": [name]})
    assert rule.action is not None and rule.action.allow == [name]


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("copy jobs to program 'rm -rf /'", "COPY is not allowed"),
        ("copy jobs from '/etc/passwd'", "COPY is not allowed"),
        ("set role postgres", "VARIABLESET (DDL or a utility statement) is not allowed"),
        ("reset role", "VARIABLESET (DDL"),
        ("do $$ begin perform 1; end $$", "DO (DDL"),
        ("create table x (a int)", "CREATE (DDL"),
        ("grant select on jobs to public", "GRANT (DDL"),
        ("call requeue(:id)", "CALL (DDL"),
    ],
)
def test_statements_other_than_dml_are_refused_whatever_is_allowed(
    tmp_path: Path, sql: str, expected: str
) -> None:
    """``allow`` names objects, not kinds of statement: no opt-in for these."""
    assert expected in error_of(tmp_path, {"sql": sql, "allow": ["set_config"]})


def test_allow_names_only_what_the_statement_needs_allowed(tmp_path: Path) -> None:
    two = (
        "update jobs set kind = pg_read_file(:kind) || set_config('a.b', 'c', true) where id = :id"
    )
    message = error_of(tmp_path, {"sql": two, "allow": ["pg_read_file"]})
    assert "set_config(): " in message and "allow: [set_config]" in message
    assert load(tmp_path, {"sql": two, "allow": ["set_config", "pg_read_file"]}).action
    plain = "update jobs set kind = 'x' where id = :id"
    message = error_of(tmp_path, {"sql": plain, "allow": ["pg_authid"]})
    assert "allow: 'pg_authid' is not something the statement needs allowed" in message


def test_ordinary_functions_and_tables_are_not_refused(tmp_path: Path) -> None:
    sql = (
        "update jobs set kind = lower(:kind), heartbeat_at = now() where id = :id"
        " and kind <> coalesce(pg_typeof(id)::text, '')"
    )
    assert load(tmp_path, {"sql": sql}).action is not None
    # An action writes: a sequence, a lock held until the claim commits, a notice then.
    sql = (
        "insert into jobs (id, kind) select nextval('jobs_id_seq'), :kind"
        " where pg_try_advisory_xact_lock(:id) and pg_notify('jobs', :kind) is null"
    )
    assert load(tmp_path, {"sql": sql}).action is not None


def test_the_outbox_delete_of_the_probe_is_refused_in_one_line(tmp_path: Path) -> None:
    """The probe's action: it would empty slawatch's outbox at the first claim."""
    sql = {"sql": "delete from slawatch.delivery where true", "max_rows": 100000}
    message = error_of(tmp_path, sql)
    assert message == (
        f"{tmp_path / 'jobs.yaml'}: action: slawatch.delivery: slawatch's own table (every"
        " rule's alerts, the outbox, history) is refused (a rule file is code: add allow:"
        " [slawatch.delivery] to the action to run it anyway)"
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, (timedelta(seconds=1.5), timedelta(milliseconds=500), timedelta(seconds=4.5))),
        (
            {"timeout": "3s", "lock_timeout": "200ms"},
            (timedelta(seconds=3), timedelta(milliseconds=200), timedelta(seconds=9)),
        ),
        (
            {"timeout": 0.5, "lock_timeout": 0.5},
            (timedelta(seconds=0.5), timedelta(seconds=0.5), timedelta(seconds=1.5)),
        ),
        ({"timeout": "2m"}, "action.timeout: must be from 1ms to 1m"),
        ({"timeout": 0}, "action.timeout: must be from 1ms to 1m"),
        ({"timeout": "1s", "lock_timeout": "2s"}, "lock_timeout: longer than timeout"),
        ({"role": "none"}, "action.role: 'none' is not a role name"),
        ({"role": "a b"}, "action.role: 'a b' is not a role name"),
    ],
)
def test_an_actions_timeouts_and_role(
    tmp_path: Path, fields: dict[str, object], expected: object
) -> None:
    action = {"sql": "update jobs set kind = 'x' where id = :id"} | fields
    if isinstance(expected, str):
        assert expected in error_of(tmp_path, action)
        return
    got = load(tmp_path, action).action
    assert got is not None
    assert (got.timeout, got.lock_timeout, got.budget) == expected


@pytest.mark.parametrize("field", ["timeout", "lock_timeout", "role", "allow"])
def test_a_webhook_action_takes_none_of_the_sql_settings(tmp_path: Path, field: str) -> None:
    value: object = {"timeout": "1s", "lock_timeout": "1s", "role": "r", "allow": ["x"]}[field]
    action = {"webhook": {"url": "http://127.0.0.1:9/x"}, field: value}
    assert f"{field}: " in error_of(tmp_path, action)


def test_the_action_role_setting_is_each_sql_actions_unless_it_names_its_own(
    tmp_path: Path,
) -> None:
    plain = load(tmp_path, {"sql": "update jobs set kind = 'x' where id = :id"})
    own = load(tmp_path, {"sql": "update jobs set kind = 'x' where id = :id", "role": "mine"})
    hook = load(tmp_path, {"webhook": {"url": "http://127.0.0.1:9/x"}})
    got = with_action_role([plain, own, hook], "slawatch_action")
    assert [r.action.role if r.action else None for r in got] == ["slawatch_action", "mine", None]
    assert with_action_role([plain], None) == [plain]


def test_migrate_print_grants_an_actions_role_what_its_statement_needs(tmp_path: Path) -> None:
    rule = load(
        tmp_path,
        {
            "sql": "update jobs set kind = 'x' where id = :id and kind <> 'y'",
            "role": "slawatch_action",
        },
    )
    logged = Rule.model_validate(
        rule.model_dump(by_alias=True, exclude_unset=True)
        | {
            "name": "jobs_logged",
            "action": {
                "sql": "insert into ops.restarts (job_id) values (:id)",
                "role": "slawatch_action",
            },
        }
    )
    printed = [g.as_string(None) for g in grants([rule, logged])]
    theirs = [g for g in printed if g.endswith('TO "slawatch_action"')]
    assert theirs == [
        'GRANT USAGE ON SCHEMA "public" TO "slawatch_action"',
        'GRANT UPDATE ("kind") ON "jobs" TO "slawatch_action"',
        'GRANT SELECT ("id", "kind") ON "jobs" TO "slawatch_action"',
        'GRANT USAGE ON SCHEMA "ops" TO "slawatch_action"',
        'GRANT INSERT ("job_id") ON "ops"."restarts" TO "slawatch_action"',
    ]
    assert printed.count('GRANT "slawatch_action" TO "slawatch_app"') == 1
    # slawatch's own role gets nothing of the actions' (it reads the table, no more).
    assert not [g for g in printed if "slawatch_app" in g and ('("kind")' in g or "ops" in g)]


def test_the_docs_show_checks_refusal_and_the_opt_in_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page = (ROOT / "docs" / "explanation" / "safety.md").read_text()
    section = page.split("## What a rule file can do", 1)[1].split("\n## ", 1)[0]
    (tmp_path / "rules").mkdir()
    leak = {"sql": "insert into jobs (kind) select rolpassword from pg_authid where :id > 0"}
    (tmp_path / "rules" / "leak.yaml").write_text(GOOD + f"action: {json.dumps(leak)}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["--rules", "rules", "--notifiers", str(ROOT / "notifiers"), "check"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"$ slawatch check\n{line}\n" in section
    (example,) = re.findall(r"```yaml\n(action:.*?)```", section, re.S)
    (tmp_path / "rules" / "leak.yaml").write_text(GOOD + example)
    assert main(["--rules", "rules", "--notifiers", str(ROOT / "notifiers"), "check"]) == 0
