"""The command line as a user runs it: exit codes, one-line errors, a whole run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from slawatch.demo import SHOP
from slawatch.operate.inspect import stats
from tests.conftest import ROOT
from tests.integration.helpers import Conn
from tests.waiting import wait_until


def clean_env() -> dict[str, str]:
    """The environment without SLAWATCH_ settings, and no admin API: a test's
    `slawatch run` must not take port 8181 from a demo or another test run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")}
    return env | {"SLAWATCH_HTTP": ""}


def slawatch(
    *args: str,
    dsn: str | None = None,
    cwd: Path = ROOT,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``slawatch *args`` in a child process; ``env``: settings added to a clean environment."""
    environment = clean_env() | (env or {})
    if dsn:
        environment["SLAWATCH_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "slawatch", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("slawatch: error: ")]
    assert lines and text in lines[0], result.stderr


def test_check_shipped_files() -> None:
    result = slawatch("check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: 6 rules, 1 notifiers (files only")


def test_check_against_a_database_without_the_tables(dsn: str) -> None:
    result = slawatch("check", dsn=dsn)
    assert_one_line_error(result, 2, "rules/job_hung.yaml: table: public.jobs does not exist")
    assert result.stderr.count("does not exist") == 5  # every rule reported at once


def test_bad_rule_file(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("table: orders\nkey: id\nevery: 6 hourz\n")
    result = slawatch("--rules", str(tmp_path), "check")
    assert_one_line_error(result, 2, f"{tmp_path}/r.yaml: deadline: is required")
    assert "every: '6 hourz' is not a duration" in result.stderr


def test_an_open_when_that_escapes_its_parentheses_is_refused_everywhere(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """The case seen in the field: one stray ')' paged every row of the table. Now no
    command takes it, and nothing is written."""
    conn.execute(SHOP)
    text = (ROOT / "rules" / "order_unshipped.yaml").read_text()
    bad = text.replace("open_when: \"status = 'paid'\"", "open_when: \"status = 'paid') OR (true\"")
    assert bad != text
    (tmp_path / "order_unshipped.yaml").write_text(bad)
    for command in (["check"], ["migrate"], ["migrate", "--print"], ["run", "--once"]):
        result = slawatch("--rules", str(tmp_path), *command, dsn=dsn)
        assert_one_line_error(
            result, 2, "order_unshipped.yaml: open_when: not one SQL condition: syntax error"
        )
    assert conn.execute("SELECT to_regnamespace('slawatch')").fetchone() == (None,)


def test_malformed_yaml(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("table: [orders\n")
    result = slawatch("check", "--rules", str(tmp_path))  # flags may follow the command
    assert_one_line_error(result, 2, "r.yaml: line 2: invalid YAML")


def test_unknown_notifier(tmp_path: Path) -> None:
    text = (ROOT / "rules" / "job_hung.yaml").read_text().replace("[console]", "[pager]")
    (tmp_path / "job_hung.yaml").write_text(text)
    result = slawatch("--rules", str(tmp_path), "check")
    assert_one_line_error(result, 2, "job_hung.yaml: notify: unknown notifier 'pager'")


def test_unreachable_database() -> None:
    # run --once waits for the database up to SLAWATCH_DB_TIMEOUT (test_startup.py): 1s here.
    result = slawatch(
        "run",
        "--once",
        dsn="postgresql://postgres:secret@127.0.0.1:1/shop",
        env={"SLAWATCH_DB_TIMEOUT": "1"},
    )
    assert_one_line_error(result, 1, "cannot connect to postgresql://postgres:***@127.0.0.1:1/shop")
    assert "secret" not in result.stderr


def test_bad_usage() -> None:
    assert slawatch("frobnicate").returncode == 2
    assert slawatch("demo", "--seconds", "-1").returncode == 2


def test_migrate_print_needs_no_database() -> None:
    result = slawatch("migrate", "--print")
    assert result.returncode == 0, result.stderr
    assert 'DROP INDEX CONCURRENTLY IF EXISTS "public"."sw_order_unshipped_first"' in result.stdout
    assert 'CREATE INDEX CONCURRENTLY "sw_order_unshipped_first"' in result.stdout
    assert (
        'GRANT UPDATE ("sw_job_hung_n", "sw_job_hung_next", "sw_job_hung_seen", "sw_job_hung_ep")'
        ' ON "public"."jobs"' in result.stdout
    )


def test_migrate_print_against_an_unreachable_database() -> None:
    result = slawatch("migrate", "--print", dsn="postgresql://nobody@127.0.0.1:1/none")
    assert_one_line_error(result, 1, "cannot connect to postgresql://nobody@127.0.0.1:1/none")


def test_run_before_migrate_says_what_to_do(conn: Conn, dsn: str) -> None:
    conn.execute(SHOP)
    result = slawatch("run", "--once", dsn=dsn)
    assert_one_line_error(result, 2, "run 'slawatch migrate' first")


def test_run_names_every_rule_that_needs_migrate(conn: Conn, dsn: str, tmp_path: Path) -> None:
    conn.execute(SHOP)
    assert slawatch("migrate", dsn=dsn).returncode == 0
    for name in ("order_unshipped", "refund_unprocessed", "job_hung"):
        text = (ROOT / "rules" / f"{name}.yaml").read_text()
        if name != "job_hung":  # two rules change; job_hung stays as migrated
            text = text.replace('open_when: "', 'open_when: "id > 0 AND ')
        (tmp_path / f"{name}.yaml").write_text(text)
    result = slawatch("--rules", str(tmp_path), "run", "--once", dsn=dsn)
    assert result.returncode == 2, result
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("slawatch: error: ")]
    assert len(errors) == 2, result.stderr
    assert "order_unshipped.yaml: rule 'order_unshipped' is not migrated or changed" in errors[0]
    assert "refund_unprocessed.yaml: rule 'refund_unprocessed'" in errors[1]
    assert "run 'slawatch migrate'" in errors[1]
    check = slawatch("--rules", str(tmp_path), "check", dsn=dsn)
    assert check.returncode == 1 and "(order_unshipped, refund_unprocessed)" in check.stdout


def test_a_ca_file_that_is_no_certificate_stops_check_and_run_in_one_line(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """The probe's case: `ca_file: /etc/shadow` passed check, then run died with an
    ssl.SSLError traceback."""
    conn.execute(SHOP)
    assert slawatch("migrate", dsn=dsn).returncode == 0
    (tmp_path / "console.yaml").write_text((ROOT / "notifiers" / "console.yaml").read_text())
    not_a_ca = tmp_path / "shadow"
    not_a_ca.write_text("root:*:19000:0:99999:7:::\n")
    (tmp_path / "hook.yaml").write_text(
        f"type: webhook\nurl: https://127.0.0.1:9/in\nca_file: {not_a_ca}\n"
    )
    expected = f"{tmp_path}/hook.yaml: ca_file: not a PEM file of CA certificates"
    for command in (["check"], ["run", "--once"]):
        result = slawatch("--notifiers", str(tmp_path), *command, dsn=dsn)
        assert_one_line_error(result, 2, expected)


def test_a_notifier_aimed_at_slawatchs_own_admin_api_is_refused(tmp_path: Path) -> None:
    """No route of the admin API takes a notifier's alerts: each would be refused and end
    dead. check (and every command that loads the notifiers) says so; another port passes."""
    (tmp_path / "console.yaml").write_text((ROOT / "notifiers" / "console.yaml").read_text())
    env = {"SLAWATCH_HTTP": "0.0.0.0:8181", "SLAWATCH_API_TOKEN": "t" * 32}
    for url in ("http://localhost:8181/v1/events", "http://127.0.0.1:8181", "http://[::1]:8181/"):
        (tmp_path / "hook.yaml").write_text(f"type: webhook\nurl: {url}\n")
        result = slawatch("--notifiers", str(tmp_path), "check", env=env)
        assert_one_line_error(
            result,
            2,
            f"{tmp_path}/hook.yaml: url: aims at slawatch's own admin API (SLAWATCH_HTTP"
            " 0.0.0.0:8181), which takes no alerts",
        )
    for url, http in (
        ("http://127.0.0.1:8182/in", "0.0.0.0:8181"),  # another port
        ("http://hooks.example:8181/in", "127.0.0.1:8181"),  # another host
        ("http://127.0.0.1:8181/in", ""),  # no admin API
    ):
        (tmp_path / "hook.yaml").write_text(f"type: webhook\nurl: {url}\n")
        result = slawatch("--notifiers", str(tmp_path), "check", env=env | {"SLAWATCH_HTTP": http})
        assert result.returncode == 0, (url, result.stderr)


def test_migrate_then_run_once_prints_each_alert_once(conn: Conn, dsn: str) -> None:
    conn.execute(SHOP)
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', now() - interval '3 days')")
    before = slawatch("check", dsn=dsn)
    assert before.returncode == 1, before  # valid, but run would refuse: say so
    assert "not ready: 6 rules, 1 notifiers are valid, but 'slawatch run' needs" in before.stdout
    assert "order_unshipped: 1 rows would be notified on the next scan" in before.stdout
    # What migrate will do, not what it did (nothing is done yet).
    assert "not migrated: public.orders: will add sw_order_unshipped_n" in before.stdout
    assert "will build index sw_order_unshipped_first" in before.stdout
    assert ": added " not in before.stdout and "built index" not in before.stdout
    first = slawatch("migrate", dsn=dsn)
    assert first.returncode == 0, first.stderr
    assert "built index sw_order_unshipped_first" in first.stdout
    again = slawatch("migrate", dsn=dsn)
    assert again.stdout.strip() == "ok: 6 rules migrated (nothing to change)"
    conn.execute("INSERT INTO orders VALUES (2, 7, 990, 'paid', now() - interval '1 hour')")
    conn.execute("INSERT INTO jobs VALUES (9, 'sync', 'w1', 'running', now() - interval '1 hour')")
    ready = slawatch("check", dsn=dsn)
    assert ready.returncode == 0, ready
    assert "job_hung: 1 rows would be notified on the next scan" in ready.stdout
    result = slawatch("run", "--once", dsn=dsn)
    assert result.returncode == 0, result.stderr
    lines = alert_lines(result.stdout)
    assert len(lines) == 2, lines
    assert any(ln.startswith("[warning] order_unshipped #1 key=1 due ") for ln in lines)
    assert any(ln.startswith("[critical] job_hung #1 key=9 due ") for ln in lines)
    assert alert_lines(slawatch("run", "--once", dsn=dsn).stdout) == []  # nothing new is due
    # Counted as `slawatch stats` counts them: either shape of the outbox.
    sent = [(d.notifier, d.status, d.deliveries) for d in stats(conn).deliveries]
    assert sent == [("console", "sent", 2)]


def alert_lines(stdout: str) -> list[str]:
    """The console notifier's lines (``run --once`` ends with its summary)."""
    return [ln for ln in stdout.splitlines() if ln.startswith("[")]


def test_run_stops_cleanly_on_sigterm(conn: Conn, dsn: str) -> None:
    conn.execute(SHOP)
    assert slawatch("migrate", dsn=dsn).returncode == 0
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', now() - interval '3 days')")
    env = clean_env()
    with subprocess.Popen(
        [sys.executable, "-m", "slawatch", "run"],
        cwd=ROOT,
        env=env | {"SLAWATCH_DSN": dsn},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until the first alert is printed
            assert line.startswith("[warning] order_unshipped #1 key=1"), line
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr


def test_a_command_without_a_dsn_names_the_embedded_databases_folder(tmp_path: Path) -> None:
    """A forgotten SLAWATCH_DSN makes a database in the current folder: one line at
    start says so, with the whole path, and whether it is being created."""
    pgdata = tmp_path.resolve() / ".slawatch" / "pgdata"
    for doing in ("creating", "using"):
        result = slawatch("alerts", cwd=tmp_path, timeout=120)
        said = [ln for ln in result.stderr.splitlines() if "no SLAWATCH_DSN" in ln]
        assert said == [
            f"slawatch: no SLAWATCH_DSN: {doing} the embedded PostgreSQL in {pgdata},"
            " database 'slawatch' (where 'slawatch demo' keeps its shop)"
        ], result.stderr
    assert (pgdata / "PG_VERSION").exists()


def test_demo_twice_in_a_row(tmp_path: Path) -> None:
    env_dir = tmp_path / "data"
    for _ in range(2):
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "slawatch", "demo", "--seconds", "5"],
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")}
            | {"SLAWATCH_DATA_DIR": str(env_dir)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert time.monotonic() - started >= 5
        summary = result.stdout.split("\nsummary\n")[1]
        rows = [ln for ln in summary.splitlines()[1:] if ln.split()[1].isdigit()]
        alerts = sum(int(ln.split()[1]) for ln in rows)
        assert f"webhook received and verified: {alerts} alerts" in summary
        # Every alert went to the console and the webhook, in either shape of the outbox.
        (sent,) = [ln.split()[2:5] for ln in summary.splitlines() if "deliveries sent:" in ln]
        assert int(sent[0]) >= 2 * alerts and sent[1:] == ["of", sent[2]], summary
        assert "signature verified" in result.stdout and "INVALID" not in result.stdout
        for rule in (
            "order_unshipped",
            "refund_unprocessed",
            "receipt_unconfirmed",
            "job_hung",
            "task_timeout",
            "parcel_undelivered",  # an event rule, fed events
        ):
            assert any(
                ln.split()[0] == rule and int(ln.split()[1]) >= 4 for ln in summary.splitlines()
            ), summary
        # The example actions: one printed line per alert (each is notification #1),
        # and the summary's count of them; rules without an action show "-".
        counted = {ln.split()[0]: (ln.split()[1], ln.split()[3]) for ln in rows}
        for rule in ("job_hung", "receipt_unconfirmed", "task_timeout"):
            acted = [
                ln for ln in result.stdout.splitlines() if ln.startswith(f"  action {rule} key=")
            ]
            assert acted and all(ln.endswith(" ok rows=1") for ln in acted), result.stdout
            assert counted[rule] == (str(len(acted)), str(len(acted))), summary
        assert counted["order_unshipped"][1] == "-"


def test_the_demo_says_where_its_admin_api_is_and_serves_it(tmp_path: Path) -> None:
    """On SLAWATCH_HTTP's address, or, when that port is taken (a `slawatch run`
    beside it), on a free one: the address it prints is the one that answers."""
    import re
    import socket

    import httpx

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "slawatch", "demo", "--seconds", "8"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")}
        | {"SLAWATCH_DATA_DIR": str(tmp_path / "data"), "SLAWATCH_HTTP": f"127.0.0.1:{port}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url, printed = None, ""
        for line in proc.stdout:
            found = re.match(r"on-call page and admin API: (http://127\.0\.0\.1:\d+)/", line)
            if found:
                url, printed = found.group(1), line
                break
        assert url is not None, "the demo did not print its admin address"
        assert url != f"http://127.0.0.1:{port}"

        def ready() -> bool:
            return bool(httpx.get(f"{url}/readyz", timeout=10).json()["ready"])

        # Ready once its first readiness probe has run (503 until then, as for any
        # instance starting; on a loaded machine that can come after the address).
        wait_until(ready, "the demo's admin API to say it is ready", timeout=30)
        assert "slawatch_alerts_claimed_total" in httpx.get(f"{url}/metrics", timeout=10).text
        # The documents the line names answer (the OpenAPI document, the metrics).
        named = re.findall(r"(?:OpenAPI|metrics) at (http://127\.0\.0\.1:\d+/[^\s,)]+)", printed)
        assert len(named) == 2, printed
        for address in named:
            assert httpx.get(address, timeout=10).status_code == 200, address
        proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
        taken.close()


def test_replay(conn: Conn, dsn: str) -> None:
    conn.execute(SHOP)
    assert slawatch("migrate", dsn=dsn).returncode == 0
    result = slawatch("replay", "--rule", "job_hung", dsn=dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok: 0 dead deliveries back to pending\n"
    assert_one_line_error(slawatch("replay", "--rule", "nope", dsn=dsn), 2, "no rule named 'nope'")


def test_run_once_ends_with_a_summary_per_rule_and_notifier(conn: Conn, dsn: str) -> None:
    conn.execute(SHOP)
    assert slawatch("migrate", dsn=dsn).returncode == 0
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', now() - interval '3 days')")
    conn.execute("INSERT INTO orders VALUES (2, 7, 990, 'paid', now() - interval '3 days')")
    result = slawatch("run", "--once", dsn=dsn)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(alert_lines(result.stdout)) == 2
    assert lines[2:] == [
        "rule job_hung: 0 claimed, 0 closed",
        "rule order_unshipped: 2 claimed, 0 closed",
        "rule parcel_undelivered: 0 claimed, 0 closed",
        "rule receipt_unconfirmed: 0 claimed, 0 closed",
        "rule refund_unprocessed: 0 claimed, 0 closed",
        "rule task_timeout: 0 claimed, 0 closed",
        "notifier console: 2 sent, 0 retried, 0 dead",
    ]
    # Order 1 ships: its episode ends and the next scan closes it.
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    conn.execute("INSERT INTO jobs VALUES (9, 'sync', 'w1', 'running', now() - interval '1 hour')")
    result = slawatch("run", "--once", "--json", dsn=dsn)
    assert result.returncode == 0, result.stderr
    # One JSON document on stdout; the console notifier's line went to stderr.
    assert json.loads(result.stdout) == {
        "ok": True,
        "rules": {
            "job_hung": {"claimed": 1, "closed": 0},
            "order_unshipped": {"claimed": 0, "closed": 1},
            "parcel_undelivered": {"claimed": 0, "closed": 0},
            "receipt_unconfirmed": {"claimed": 0, "closed": 0},
            "refund_unprocessed": {"claimed": 0, "closed": 0},
            "task_timeout": {"claimed": 0, "closed": 0},
        },
        "notifiers": {"console": {"sent": 1, "retried": 0, "dead": 0}},
        "errors": [],
    }
    assert "[critical] job_hung #1 key=9" in result.stderr
    assert_one_line_error(slawatch("run", "--json", dsn=dsn), 2, "--json goes with --once")


def test_run_once_json_reports_a_failure_and_exits_1(conn: Conn, dsn: str, tmp_path: Path) -> None:
    conn.execute(SHOP)
    # job_hung accepts what an UPDATE of jobs sets off: the trigger below that fails it.
    for path in (ROOT / "rules").glob("*.yaml"):
        extra = "inline_triggers: fire\n" if path.stem == "job_hung" else ""
        (tmp_path / path.name).write_text(path.read_text() + extra)
    rules = ["--rules", str(tmp_path)]
    assert slawatch(*rules, "migrate", dsn=dsn).returncode == 0
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', now() - interval '3 days')")
    conn.execute("INSERT INTO jobs VALUES (9, 'sync', 'w1', 'running', now() - interval '1 hour')")
    # The first rule's claim fails at run time; the other rules and the delivery go on.
    conn.execute(
        "CREATE FUNCTION frozen() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'jobs are frozen'; END$$"
    )
    conn.execute(
        "CREATE TRIGGER frozen BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION frozen()"
    )
    result = slawatch(*rules, "run", "--once", "--json", dsn=dsn)
    assert_one_line_error(result, 1, "claim for rule job_hung: jobs are frozen")
    summary = json.loads(result.stdout)
    assert summary["ok"] is False
    assert summary["rules"]["job_hung"] is None
    assert summary["rules"]["order_unshipped"] == {"claimed": 1, "closed": 0}
    assert summary["notifiers"] == {"console": {"sent": 1, "retried": 0, "dead": 0}}
    assert len(summary["errors"]) == 1 and "jobs are frozen" in summary["errors"][0]
    text = slawatch(*rules, "run", "--once", dsn=dsn)
    assert "rule job_hung: not scanned (see the error)" in text.stdout.splitlines()


def test_a_bad_log_format_is_one_line(tmp_path: Path) -> None:
    env_result = subprocess.run(
        [sys.executable, "-m", "slawatch", "check"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")}
        | {"SLAWATCH_LOG_FORMAT": "xml"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(env_result, 2, "SLAWATCH_LOG_FORMAT: Input should be 'auto', 'text'")


def test_a_reader_that_goes_away_is_no_traceback() -> None:
    """`slawatch migrate --print | head -1`: the pipe closes under slawatch's output.
    The read end is closed before slawatch writes, so its first write fails."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "slawatch", "migrate", "--print"],
            cwd=ROOT,
            env=clean_env(),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert "Traceback" not in result.stderr, result.stderr
    assert "BrokenPipe" not in result.stderr, result.stderr
    assert result.returncode == 141
