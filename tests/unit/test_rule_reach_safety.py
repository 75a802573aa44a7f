"""What a rule's own SQL may reach (docs/explanation/safety.md): a query rule, an
``open_when`` and a deadline read the application's rows and nothing else. PostgreSQL's
server functions (``pg_*``, but a few that only tell about a value), those that reach
settings, files or SQL given as text, the system catalogs and slawatch's own schema
are refused as rules load, in FROM as in the select list, with one line naming the
object; so is a table rule's ``table:`` in a catalog's schema or slawatch's own
(``check`` would count its rows, ``migrate --print`` alter it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slawatch.cli import main
from slawatch.config.rules import Rule
from tests.conftest import ROOT

QUERY_RULE = """\
track: table
key: k
deadline: d
open_when: "true"
notify: [console]
"""
TABLE_RULE = """\
table: public.orders
key: id
deadline: paid_at
open_when: "status = 'paid'"
notify: [console]
"""


def check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``slawatch check`` (no database) of one rule file: its exit code and stderr."""
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "leak.yaml").write_text(text)
    code = main(["--rules", str(rules), "--notifiers", str(ROOT / "notifiers"), "check"])
    return code, capsys.readouterr().err


def refused_line(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    code, err = check(tmp_path, text, capsys)
    assert code == 2, err
    (line,) = err.splitlines()
    assert line.startswith(f"slawatch: error: {tmp_path / 'rules' / 'leak.yaml'}: "), line
    return line


@pytest.mark.parametrize(
    ("query", "named"),
    [
        # Other sessions' SQL, settings, configuration files, definitions: in FROM ...
        (
            "SELECT a.query AS k, now() AS d FROM pg_stat_get_activity(NULL) a",
            "pg_stat_get_activity()",
        ),
        (
            "SELECT a.query AS k, now() AS d FROM pg_catalog.pg_stat_get_activity(NULL) a",
            "pg_stat_get_activity()",
        ),
        ("SELECT s.name AS k, now() AS d FROM pg_show_all_settings() s", "pg_show_all_settings()"),
        ("SELECT h.address AS k, now() AS d FROM pg_hba_file_rules() h", "pg_hba_file_rules()"),
        (
            "SELECT m.map_name AS k, now() AS d FROM pg_ident_file_mappings() m",
            "pg_ident_file_mappings()",
        ),
        ("SELECT k, now() AS d FROM pg_read_file('/etc/passwd') k", "pg_read_file()"),
        # ... and in the select list.
        ("SELECT pg_get_functiondef(1) AS k, now() AS d", "pg_get_functiondef()"),
        ("SELECT current_setting('data_directory') AS k, now() AS d", "current_setting()"),
        (
            "SELECT table_to_xml('pg_authid', true, true, '')::text AS k, now() AS d",
            "table_to_xml()",
        ),
        ("SELECT w.word AS k, now() AS d FROM ts_stat('select 1') w", "ts_stat()"),
        # Writes at every sweep.
        ("SELECT 1 AS k, now() AS d, (pg_stat_reset() IS NULL) AS x", "pg_stat_reset()"),
        ("SELECT 1 AS k, now() AS d, pg_stat_reset_shared('wal') AS x", "pg_stat_reset_shared()"),
        (
            "SELECT 1 AS k, now() AS d, pg_log_backend_memory_contexts(1) AS x",
            "pg_log_backend_memory_contexts()",
        ),
        ("SELECT pg_export_snapshot() AS k, now() AS d", "pg_export_snapshot()"),
        ("SELECT 1 AS k, now() AS d, currval('s') AS x", "currval()"),
        ("SELECT lo_get(1)::text AS k, now() AS d", "lo_get()"),
        # Views of the catalogs stay refused.
        ("SELECT pid AS k, now() AS d FROM pg_stat_activity", "pg_stat_activity"),
        ("SELECT name AS k, now() AS d FROM pg_catalog.pg_settings", "pg_catalog.pg_settings"),
        ("SELECT name AS k, now() AS d FROM pg_settings", "pg_settings"),
        ("SELECT address AS k, now() AS d FROM pg_hba_file_rules", "pg_hba_file_rules"),
        (
            "SELECT table_name AS k, now() AS d FROM information_schema.tables",
            "information_schema.tables",
        ),
        (
            "SELECT information_schema._pg_char_max_length(25, 0) AS k, now() AS d",
            "information_schema._pg_char_max_length()",
        ),
        # slawatch's own schema: every rule's row data, the outbox, and what keeps them.
        ("SELECT id AS k, created_at AS d FROM slawatch.alert", "slawatch.alert"),
        (
            "SELECT a.id AS k, now() AS d FROM orders a JOIN slawatch.delivery x ON true",
            "slawatch.delivery",
        ),
        ("SELECT slawatch.history_drop(now()) AS k, now() AS d", "slawatch.history_drop()"),
        # A probe's ways past the name checks: SQL given as text to an extension's
        # function (tablefunc's crosstab ran a read of pg_authid and pg_read_file),
        # casts and functions that read catalogs and the server without a pg_ name.
        (
            "SELECT r AS k, now() AS d, v FROM crosstab($$SELECT 'r'::text, 'c'::text,"
            " rolpassword FROM pg_authid$$) AS ct(r text, v text)",
            "crosstab()",
        ),
        (
            "SELECT 1 AS k, now() AS d FROM connectby('t', 'a', 'b', '1', 0) AS c(a int)",
            "connectby()",
        ),
        (
            "SELECT g AS k, now() AS d, g::regrole::text AS r FROM generate_series(1, 9) g",
            "::regrole",
        ),
        ("SELECT 1 AS k, now() AS d, 'pg_authid'::pg_catalog.regclass::oid AS o", "::regclass"),
        ("SELECT 1 AS k, now() AS d, regclass('x')::text AS o", "regclass()"),
        (
            "SELECT 1 AS k, now() AS d, shobj_description(10, 'pg_authid') AS c",
            "shobj_description()",
        ),
        ("SELECT 1 AS k, now() AS d, version() AS v", "version()"),
        ("SELECT 1 AS k, now() AS d, inet_server_addr()::text AS v", "inet_server_addr()"),
        (
            "SELECT 1 AS k, now() AS d, txid_current_snapshot()::text AS v",
            "txid_current_snapshot()",
        ),
        (
            "SELECT 1 AS k, now() AS d, has_table_privilege('t', 'select') AS v",
            "has_table_privilege()",
        ),
        ("SELECT 1 AS k, now() AS d, to_regrole('postgres')::text AS v", "to_regrole()"),
    ],
)
def test_a_query_rule_reaching_past_the_applications_rows_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], query: str, named: str
) -> None:
    line = refused_line(tmp_path, QUERY_RULE + f"query: {json.dumps(query)}\n", capsys)
    assert "query: must not " in line and f" {named}" in line, line


@pytest.mark.parametrize(
    "query",
    [
        # What the documented rules and their kin call: plain functions, pg_typeof,
        # random() and clock_timestamp(), a pg_-named function of the application's.
        "SELECT o.id AS k, o.paid_at AS d FROM orders o WHERE lower(o.status) = 'paid'",
        "SELECT id AS k, pg_catalog.now() AS d, pg_typeof(id)::text AS t FROM orders",
        "SELECT id AS k, clock_timestamp() AS d, random() AS r, pg_column_size(id) AS s"
        " FROM orders",
        "SELECT id AS k, paid_at AS d FROM orders WHERE shop.pg_stuff(id)",
        "SELECT id AS k, coalesce(w.last_heartbeat, '-infinity') AS d"
        " FROM jobs j LEFT JOIN workers w USING (id)",
        # Casts to other types, regexp_* (not reg* types), a has_ function of its own.
        "SELECT id::text AS k, (paid_at + interval '1 h')::timestamptz AS d FROM orders"
        " WHERE regexp_replace(status, 'a', 'b') = 'pbid' AND shop.has_shipped(id)",
    ],
)
def test_a_query_rule_over_the_applications_rows_loads(query: str) -> None:
    rule = Rule.model_validate(
        {"name": "q", "query": query, "track": "table", "key": "k", "deadline": "d"}
        | {"open_when": "true", "notify": ["console"]}
    )
    assert rule.query == query


@pytest.mark.parametrize(
    ("field", "text", "named"),
    [
        ("open_when", "current_setting('is_superuser') = 'on'", "current_setting()"),
        ("open_when", "pg_stat_reset() IS NULL", "pg_stat_reset()"),
        ("open_when", "slawatch.claim_gate('x', 'y')", "slawatch.claim_gate()"),
        ("deadline", "paid_at + current_setting('x')::interval", "current_setting()"),
        ("deadline", "slawatch.history_lo(paid_at)::text::timestamptz", "slawatch.history_lo()"),
        ("deadline", "pg_postmaster_start_time()", "pg_postmaster_start_time()"),
        ("open_when", "user_id::regrole::text = 'postgres'", "::regrole"),
        ("deadline", "paid_at + length(version()) * interval '1 s'", "version()"),
    ],
)
def test_a_condition_or_deadline_reaching_past_the_row_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, text: str, named: str
) -> None:
    rule = TABLE_RULE.replace("deadline: paid_at", f"deadline: {json.dumps(text)}")
    if field == "open_when":
        rule = TABLE_RULE.replace("\"status = 'paid'\"", json.dumps(text))
    line = refused_line(tmp_path, rule, capsys)
    assert f"{field}: must not call {named}" in line, line


@pytest.mark.parametrize(
    ("table", "what"),
    [
        ("pg_catalog.pg_authid", "a system catalog"),
        ("pg_catalog.pg_class", "a system catalog"),
        ("information_schema.tables", "a system catalog"),
        ("pg_toast.pg_toast_1260", "a system catalog"),
        ("pg_temp_3.x", "a system catalog"),
        ("slawatch.delivery", "slawatch's own table (its alerts, outbox, history)"),
        ("slawatch.alert", "slawatch's own table (its alerts, outbox, history)"),
    ],
)
def test_a_table_rule_on_a_catalog_or_slawatchs_own_table_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, what: str
) -> None:
    line = refused_line(tmp_path, TABLE_RULE.replace("public.orders", table), capsys)
    assert line.endswith(f"table: '{table}' is {what}: a rule watches the application's tables")


def test_the_applications_tables_and_an_event_rules_own_are_watched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name without a schema is public's (``pg_orders`` too); an event rule watches
    slawatch's own timer table, which the model fills in."""
    for table in ("orders", "public.orders", "pg_orders", "shop.orders"):
        code, err = check(tmp_path, TABLE_RULE.replace("public.orders", table), capsys)
        assert code == 0, err
    events = "events: {start: job.started, stop: job.done, within: 1h}\nnotify: [console]\n"
    code, err = check(tmp_path, events, capsys)
    assert code == 0, err
