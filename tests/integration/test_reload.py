"""Reload (SIGHUP): rules and notifiers re-read while ``slawatch run`` goes on.

A Runner serves in a thread against real files, a real database and real webhook
receivers, in real (short) time; the last test sends a real SIGHUP to a real
``slawatch run`` and reads its JSON log.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import psycopg
import pytest
import yaml
from psycopg.conninfo import make_conninfo

from slawatch.commands import load_config
from slawatch.config.rules import Rule
from slawatch.config.settings import Settings
from slawatch.engine.migrate import migrate
from slawatch.runtime.boot import start_admin
from slawatch.runtime.scheduler import Runner
from tests.conftest import ROOT
from tests.integration.helpers import Conn, alerts, episodes, shop
from tests.integration.test_deliver import shown_deliveries, shown_statuses
from tests.integration.test_outage import logged, wait_for
from tests.pgcluster import free_port
from tests.receivers import Reply, WebhookReceiver

LATE = """\
table: public.orders
key: id
deadline: paid_at
after: 1h
every: 1s
open_when: "status = 'paid'"
severity: warning
notify: [hook]
"""
BIG = """\
table: public.orders
key: id
deadline: paid_at
after: 1h
every: 1s
open_when: "status = 'paid' AND id > 100"
severity: critical
notify: [hook2]
"""


def hook_file(url: str) -> str:
    return f"type: webhook\nurl: {url}\ntimeout: 2s\nconcurrency: 1\n"


def rule(name: str, text: str) -> Rule:
    return Rule.model_validate(yaml.safe_load(text) | {"name": name})


def overdue(conn: Conn, *ids: int) -> None:
    for i in ids:
        conn.execute("INSERT INTO orders VALUES (%s, 'paid', now() - interval '1 day')", (i,))


@pytest.fixture
def config(tmp_path: Path, conn: Conn, receiver: WebhookReceiver) -> Settings:
    """rules/late.yaml to notifiers/hook.yaml (the receiver), migrated."""
    conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at timestamptz)")
    migrate(conn, [rule("late", LATE)])
    (tmp_path / "rules").mkdir()
    (tmp_path / "notifiers").mkdir()
    (tmp_path / "rules" / "late.yaml").write_text(LATE)
    (tmp_path / "notifiers" / "hook.yaml").write_text(hook_file(receiver.url))
    return Settings(rules_dir=tmp_path / "rules", notifiers_dir=tmp_path / "notifiers")


@pytest.fixture
def runner(config: Settings, dsn: str) -> Iterator[Runner]:
    """A Runner of ``config``, serving in a thread."""
    rules, notifiers = load_config(config)
    r = Runner(dsn, rules, notifiers, poll=0.2, load=lambda: load_config(config))
    serving = threading.Thread(target=r.serve, name="serve", daemon=True)
    serving.start()
    try:
        yield r
    finally:
        r.stop()
        serving.join(30)
        r.close()
    assert not serving.is_alive()


def ids(receiver: WebhookReceiver) -> set[str]:
    return set(receiver.alert_ids)


def test_an_invalid_set_is_refused_and_the_running_rules_go_on(
    runner: Runner, config: Settings, conn: Conn, receiver: WebhookReceiver, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="slawatch")
    overdue(conn, 1)
    wait_for(lambda: "late:1:e1:n1" in ids(receiver), "the first alert")
    (config.rules_dir / "late.yaml").write_text(LATE.replace("every: 1s", "every: 1 hourz"))
    (config.rules_dir / "broken.yaml").write_text("table: [orders\n")
    assert runner.reload() is False
    assert logged(caplog, "reload refused, the running rules and notifiers go on: 2 errors") == 1
    assert logged(caplog, "late.yaml: every: '1 hourz' is not a duration", logging.ERROR) == 1
    assert logged(caplog, "broken.yaml: line 2: invalid YAML", logging.ERROR) == 1
    assert list(runner.rules) == ["late"]
    assert runner.rules["late"].every.total_seconds() == 1
    overdue(conn, 2)  # still scanned every second, still delivered
    wait_for(lambda: "late:2:e1:n1" in ids(receiver), "an alert after the refused reload")
    assert runner.health()["ok"] is True


def test_the_scan_jobs_follow_the_rules_even_after_a_reload_that_failed_halfway(
    runner: Runner, config: Settings
) -> None:
    """A changed `every` reschedules the rule's job; a job lost by a reload that failed
    halfway (here: removed behind the runner's back) is back after the next reload."""
    wait_for(lambda: runner._scheduler is not None, "the scheduler")
    scheduler = runner._scheduler
    assert scheduler is not None
    (config.rules_dir / "late.yaml").write_text(LATE.replace("every: 1s", "every: 2s"))
    assert runner.reload() is True
    job = runner.scan_job("late")
    assert job is not None and job.trigger.interval.total_seconds() == 2
    scheduler.remove_job(job.id)
    assert runner.reload() is True  # nothing changed in the files
    job = runner.scan_job("late")
    assert job is not None and job.trigger.interval.total_seconds() == 2


def test_a_good_change_takes_effect(
    runner: Runner, config: Settings, conn: Conn, receiver: WebhookReceiver, caplog: Any
) -> None:
    """A rule added (to a notifier added), one changed, then one removed with its notifier."""
    caplog.set_level(logging.INFO, logger="slawatch")
    with WebhookReceiver() as second:
        migrate(conn, [rule("big", BIG)])
        (config.rules_dir / "big.yaml").write_text(BIG)
        (config.notifiers_dir / "hook2.yaml").write_text(hook_file(second.url))
        (config.rules_dir / "late.yaml").write_text(LATE.replace("warning", "info"))
        runner.request_reload()  # what SIGHUP does: serve() reloads
        wait_for(
            lambda: logged(caplog, "reload: 2 rules (added: big; changed: late;") == 1, "reload"
        )
        # The reload thread logs the notifiers' line just after the rules' line.
        wait_for(lambda: logged(caplog, "reload: 2 notifiers (added: hook2;") == 1, "notifiers")
        overdue(conn, 101)
        wait_for(lambda: "big:101:e1:n1" in ids(second), "the added rule's alert, to hook2")
        wait_for(lambda: "late:101:e1:n1" in ids(receiver), "the changed rule's alert")
        (late,) = [a for r in receiver.requests for a in r.alerts if a["id"] == "late:101:e1:n1"]
        assert late["severity"] == "info"
        assert "big:101:e1:n1" not in ids(receiver)

        (config.rules_dir / "late.yaml").unlink()
        (config.notifiers_dir / "hook.yaml").unlink()
        assert runner.reload() is True
        assert list(runner.rules) == ["big"]
        assert runner.scan_job("late") is None and runner.scan_job("big") is not None
        assert runner.health()["workers"] == {"hook2": True}
        assert not [t for t in threading.enumerate() if t.name == "deliver-hook"]
        before = len(receiver.requests)
        overdue(conn, 102)
        wait_for(lambda: "big:102:e1:n1" in ids(second), "the remaining rule's alert")
        assert len(receiver.requests) == before
        assert len(alerts(conn, "late")) == 1  # order 101 only: late no longer scans
        assert runner.health()["ok"] is True


def test_a_reload_of_the_same_calendar_rule_changes_nothing(
    config: Settings, conn: Conn, dsn: str, tmp_path: Path, caplog: Any
) -> None:
    """A calendar in use (its days looked at by the scans) and the same file read again
    are equal: the reload lists no rule as changed."""
    caplog.set_level(logging.INFO, logger="slawatch")
    (tmp_path / "calendars").mkdir()
    (tmp_path / "calendars" / "office.yaml").write_text(
        "timezone: Europe/Berlin\nhours:\n  mon-fri: 09:00-17:00\n"
    )
    (config.rules_dir / "late.yaml").write_text(LATE + "calendar: office\n")
    config = config.model_copy(update={"calendars_dir": tmp_path / "calendars"})
    rules, notifiers = load_config(config)
    migrate(conn, rules)
    runner = Runner(dsn, rules, notifiers, poll=0.2, load=lambda: load_config(config))
    serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
    serving.start()
    try:
        wait_for(
            lambda: conn.execute("SELECT 1 FROM slawatch.scan").fetchone() is not None,
            "a scan (the calendar's days looked at)",
        )
        assert runner.reload() is True
    finally:
        runner.stop()
        serving.join(30)
        runner.close()
    assert logged(caplog, "reload: 1 rules (added: none; changed: none; removed: none;") == 1


def test_a_rule_that_needs_a_migrate_is_reported_and_the_others_go_on(
    runner: Runner, config: Settings, conn: Conn, receiver: WebhookReceiver, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="slawatch")
    # New and never migrated: left out. Changed since its migrate: runs as it was.
    (config.rules_dir / "fresh.yaml").write_text(BIG.replace("hook2", "hook"))
    changed = LATE.replace("status = 'paid'", "status = 'paid' AND id < 100")
    (config.rules_dir / "late.yaml").write_text(changed)
    migrate(conn, [rule("big", BIG.replace("hook2", "hook"))])
    (config.rules_dir / "big.yaml").write_text(BIG.replace("hook2", "hook"))
    assert runner.reload() is True
    assert logged(caplog, "rule 'fresh' is not migrated", logging.ERROR) == 1
    assert logged(caplog, "rule fresh left out until then", logging.ERROR) == 1
    # It runs on as it was: a warning that says so, no error about it.
    goes_on = (
        "rule late goes on with its running definition until 'slawatch migrate' records"
        " the new one (then reload to run it)"
    )
    about_late = [r for r in caplog.records if "rule 'late' is not migrated" in r.getMessage()]
    assert [r.levelno for r in about_late] == [logging.WARNING]
    assert goes_on in about_late[0].getMessage()
    assert logged(caplog, "not migrated: fresh, late") == 1
    assert sorted(runner.rules) == ["big", "late"]
    assert runner.rules["late"].open_when == "status = 'paid'"  # the migrated definition
    overdue(conn, 150)  # the old late (no id < 100) and big page; fresh does not
    wait_for(
        lambda: {"late:150:e1:n1", "big:150:e1:n1"} <= ids(receiver), "the ready rules' alerts"
    )
    assert not any(i.startswith("fresh:") for i in ids(receiver))


def test_an_event_of_a_rule_waiting_for_migrate_says_to_migrate(
    runner: Runner, config: Settings, dsn: str
) -> None:
    """Was "no rule uses this type (rules use: none ...)": the type is in the rule files,
    its rule left out by the reload until a migrate."""
    (config.rules_dir / "parcel.yaml").write_text(
        "events: {start: parcel_shipped, stop: parcel_delivered, within: 1h}\n"
        "every: 1s\nseverity: warning\nnotify: [hook]\n"
    )
    assert runner.reload() is True
    assert sorted(runner.rules) == ["late"]
    assert runner.unmigrated_types == {"parcel_shipped", "parcel_delivered"}
    admin = start_admin(config.model_copy(update={"http": f"127.0.0.1:{free_port()}"}), dsn, runner)
    assert admin is not None
    try:
        answer = httpx.post(
            f"{admin.url}/v1/events", json={"type": "parcel_shipped", "key": "p1"}, timeout=10
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"] == (
            "type: 'parcel_shipped': no running rule uses this type; its rule is in the rule"
            " files but not migrated: run 'slawatch migrate' (then reload)"
        )
        unknown = httpx.post(
            f"{admin.url}/v1/events", json={"type": "parcel_lost", "key": "p1"}, timeout=10
        )
        assert "no rule uses this type" in unknown.json()["error"]
    finally:
        admin.stop()


class Lines:
    """The lines of a pipe, read in a thread as they come."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.append(line.rstrip("\n"))

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)


def test_sighup_reloads_a_running_slawatch_which_logs_json(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """A real process: SIGHUP adds a rule; the log (stderr, not a terminal) is JSON, its
    startup line shows the database without its password."""
    shop(conn)
    shutil.copy(ROOT / "rules" / "order_unshipped.yaml", tmp_path)
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', now() - interval '3 days')")
    conn.execute("INSERT INTO jobs VALUES (9, 'sync', 'w1', 'running', now() - interval '1 hour')")
    password = "pw-Zq81x"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")}
    env["SLAWATCH_DSN"] = make_conninfo(dsn, password=password)
    api = f"http://127.0.0.1:{free_port()}"  # the admin API (its default port may be taken)
    env["SLAWATCH_HTTP"] = api.removeprefix("http://")
    with psycopg.connect(env["SLAWATCH_DSN"]):
        pass  # the server takes it (trust): the password is only there to be hidden
    with subprocess.Popen(
        [sys.executable, "-m", "slawatch", "--rules", str(tmp_path), "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = Lines(proc.stdout), Lines(proc.stderr)
        try:
            wait_for(lambda: out.has("[warning] order_unshipped #1 key=1"), "the first alert")
            # The admin API serves this runner's health, metrics and rules.
            ready = httpx.get(f"{api}/readyz").json()
            assert ready["ready"] is True and ready["checks"]["workers.console"] is True
            wait_for(
                lambda: (
                    'slawatch_deliveries_total{notifier="console",outcome="sent"} 1.0'
                    in httpx.get(f"{api}/metrics").text
                ),
                "the delivery in /metrics",
            )
            assert httpx.get(f"{api}/v1/rules/job_hung").status_code == 404
            # Scanned every 2 s, not the sample's 30 s: a rule added by a reload joins a
            # step of its `every` (here none) and is first scanned at that step's tick.
            hung = (ROOT / "rules" / "job_hung.yaml").read_text()
            assert "\nevery: 30s\n" in hung
            (tmp_path / "job_hung.yaml").write_text(hung.replace("\nevery: 30s\n", "\nevery: 2s\n"))
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: out.has("[critical] job_hung #1 key=9"), "the added rule's alert")
            assert httpx.get(f"{api}/v1/rules/job_hung").status_code == 200
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    wait_for(lambda: err.has("stopping"), "the last log line")
    assert password not in "\n".join(err.lines)
    records = [json.loads(line) for line in err.lines]  # every line is one JSON object
    for record in records:
        assert {"time", "level", "logger", "message"} <= record.keys(), record
    (started,) = [r for r in records if r["message"].startswith("slawatch 0.1.0 running")]
    assert started["message"].startswith("slawatch 0.1.0 running: 1 rules (order_unshipped)")
    assert started["rules"] == ["order_unshipped"] and started["notifiers"] == ["console"]
    assert "***" in started["database"]
    (reload,) = [r for r in records if r["message"].startswith("reload: 2 rules")]
    assert reload["added"] == ["job_hung"] and reload["level"] == "INFO"
    scans = [r for r in records if r.get("rule") == "job_hung" and "claimed" in r]
    assert scans and scans[0]["claimed"] == 1 and scans[0]["closed"] == 0
    assert isinstance(scans[0]["ms"], float) and scans[0]["logger"] == "slawatch.activity"
    batches = [r for r in records if r.get("notifier") == "console" and "sent" in r]
    assert sum(b["sent"] for b in batches) == 2


def test_a_removed_notifiers_pending_deliveries_are_orphaned_by_the_reload(
    runner: Runner, config: Settings, conn: Conn, receiver: WebhookReceiver, caplog: Any
) -> None:
    """Its receiver is down, so its deliveries wait to retry; once it is removed nothing
    would ever send them: the reload settles them 'orphaned', in one warning."""
    caplog.set_level(logging.INFO, logger="slawatch")
    receiver.default = Reply(500)
    overdue(conn, 1, 2)

    def waiting() -> bool:
        return len([d for d in shown_deliveries(conn) if d.attempts > 0]) == 2

    wait_for(waiting, "both deliveries to fail once")
    with WebhookReceiver() as second:
        migrate(conn, [rule("big", BIG)])
        (config.rules_dir / "big.yaml").write_text(BIG)
        (config.notifiers_dir / "hook2.yaml").write_text(hook_file(second.url))
        (config.rules_dir / "late.yaml").unlink()
        (config.notifiers_dir / "hook.yaml").unlink()
        assert runner.reload() is True
    orphaned = "2 pending deliveries orphaned: their notifiers are not configured: hook (2)"
    assert logged(caplog, orphaned, logging.WARNING) == 1
    assert shown_statuses(conn) == {"orphaned": 2}


ACTING = """\
table: public.orders
key: id
deadline: paid_at
after: 1h
every: 1s
open_when: "status = 'paid'"
renotify: {every: 2s, max: 4}
notify: [hook]
action: {sql: "insert into restarts (order_id) values (:id)", on: 2}
"""


def test_an_action_whose_on_moved_mid_episode_keeps_its_rule_alerting(
    runner: Runner, config: Settings, conn: Conn, receiver: WebhookReceiver, caplog: Any
) -> None:
    """The episode acted at #2; a reload moves `on` to #3: #3 and #4 are still sent,
    and the action neither runs again nor fails the rule's claims (test_action_once.py
    has the claim's side)."""
    caplog.set_level(logging.INFO, logger="slawatch")
    conn.execute("CREATE TABLE restarts (order_id bigint NOT NULL)")
    migrate(conn, [rule("acting", ACTING)])
    (config.rules_dir / "acting.yaml").write_text(ACTING)
    assert runner.reload() is True
    overdue(conn, 1)
    wait_for(lambda: "acting:1:e1:n2" in ids(receiver), "the acting notification")
    assert conn.execute("SELECT order_id FROM restarts").fetchall() == [(1,)]
    moved = ACTING.replace("on: 2", "on: 3")
    (config.rules_dir / "acting.yaml").write_text(moved)
    migrate(conn, [rule("acting", moved)])  # migrate, then reload (docs/how-to/rolling-deploys.md)
    assert runner.reload() is True
    wait_for(lambda: "acting:1:e1:n4" in ids(receiver), "the last notification, after the reload")
    assert "acting:1:e1:n3" in ids(receiver)
    assert conn.execute("SELECT order_id FROM restarts").fetchall() == [(1,)]
    attempts = conn.execute("SELECT n, status FROM slawatch.action WHERE rule = 'acting'")
    assert attempts.fetchall() == [(2, "ok")]
    assert logged(caplog, "rule acting: scans failing") == 0
    assert runner.health()["ok"] is True


# A rule with an action, widened in the middle of a rolling reload (issue 24).
NARROW = """\
table: public.orders
key: id
deadline: paid_at
every: 1s
open_when: "status = 'paid'"
notify: [console]
action:
  sql: "INSERT INTO acted (order_id) VALUES (:id)"
"""
WIDE = NARROW.replace("status = 'paid'", "status IN ('paid', 'packed')")


class Instance:
    """A real ``slawatch run`` of ``rules``, with its admin API and JSON log."""

    def __init__(self, dsn: str, rules: Path, notifiers: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")}
        env["SLAWATCH_DSN"] = dsn
        self.api = f"http://127.0.0.1:{free_port()}"
        env["SLAWATCH_HTTP"] = self.api.removeprefix("http://")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "slawatch",
                *("--rules", str(rules)),
                *("--notifiers", str(notifiers)),
                "run",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        self.log = Lines(self.proc.stderr)

    def ready(self) -> dict[str, Any] | None:
        try:
            body: dict[str, Any] = httpx.get(f"{self.api}/readyz", timeout=5).json()
        except httpx.HTTPError:
            return None  # not listening yet
        return body

    def current(self, rule: str) -> bool | None:
        """Its /readyz check of the rule's definition (None: not answering yet)."""
        ready = self.ready()
        return None if ready is None else ready["checks"].get(f"definition.{rule}")

    def scans(self, rule: str) -> float:
        """Scans of ``rule`` that ran whole (the scan histogram's count)."""
        text = httpx.get(f"{self.api}/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith(f'slawatch_scan_duration_seconds_count{{rule="{rule}"}}'):
                return float(line.split()[-1])
        return 0.0

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.lines]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log._thread.join(10)  # the log read to its end
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def tally(
    conn: Conn,
) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, str]], dict[int, int]]:
    """Every page (key, episode, n), whichever shape of the outbox holds it, every action
    attempt (key, episode, status) and each order's episode number."""
    pages = [e for e in episodes(conn, "late") if e[2] > 0]  # n 0: a resolved notice
    actions = conn.execute(
        "SELECT key, episode, status FROM slawatch.action ORDER BY 1, 2, attempt"
    ).fetchall()
    numbers = dict(conn.execute("SELECT id, sw_late_ep FROM orders ORDER BY id").fetchall())
    return pages, actions, numbers


def test_a_rolling_reload_never_opens_or_closes_an_episode_twice(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """Two real ``slawatch run``: open_when widened and migrated, then one instance
    reloaded, then the other. The one still running the narrow condition would close
    the episode of a row only the wide one holds open, and the reloaded one open it
    again, on every scan: a page and an action each time. Here the instance whose
    definition is not the recorded one claims nothing until it is reloaded: at every
    step each row has one episode, one page and one action."""
    conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at timestamptz)")
    conn.execute("CREATE TABLE acted (order_id bigint PRIMARY KEY)")
    rules, notifiers = tmp_path / "rules", tmp_path / "notifiers"
    rules.mkdir()
    notifiers.mkdir()
    (notifiers / "console.yaml").write_text("type: console\n")
    (rules / "late.yaml").write_text(NARROW)
    settings = Settings(rules_dir=rules, notifiers_dir=notifiers)
    migrate(conn, load_config(settings)[0])
    conn.execute("INSERT INTO orders VALUES (1, 'paid', now() - interval '1 day')")
    conn.execute("INSERT INTO orders VALUES (2, 'packed', now() - interval '1 day')")
    a, b = Instance(dsn, rules, notifiers), Instance(dsn, rules, notifiers)
    try:
        wait_for(lambda: a.current("late") is True and b.current("late") is True, "both ready")
        wait_for(lambda: tally(conn)[1] == [("1", 1, "ok")], "order 1's action")
        one = ([("1", 1, 1)], [("1", 1, "ok")], {1: 1, 2: 0})
        assert tally(conn) == one

        # Widened and migrated: neither instance runs the recorded definition now.
        (rules / "late.yaml").write_text(WIDE)
        migrate(conn, load_config(settings)[0])
        conn.execute("INSERT INTO orders VALUES (3, 'paid', now() - interval '1 day')")
        wait_for(lambda: a.current("late") is False and b.current("late") is False, "both stale")
        assert tally(conn) == (*one[:2], {1: 1, 2: 0, 3: 0})  # order 3: due, not claimed

        # One reloaded: it claims orders 2 and 3; the other does not touch them.
        a.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: a.current("late") is True, "the reloaded instance ready")
        wait_for(lambda: len(tally(conn)[1]) == 3, "the actions of orders 2 and 3")
        three = (
            [("1", 1, 1), ("2", 1, 1), ("3", 1, 1)],
            [("1", 1, "ok"), ("2", 1, "ok"), ("3", 1, "ok")],
            {1: 1, 2: 1, 3: 1},
        )
        assert tally(conn) == three
        # Five more scans of the reloaded one: the other had as many turns to undo them.
        scanned = a.scans("late")
        wait_for(lambda: a.scans("late") >= scanned + 5, "five scans of the reloaded instance")
        assert b.current("late") is False
        assert tally(conn) == three

        # The other reloaded: both claim the rule, and nothing is paged again.
        b.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: b.current("late") is True, "the second instance ready")
        scanned = b.scans("late")
        wait_for(lambda: b.scans("late") >= scanned + 3, "three scans of the second instance")
        assert tally(conn) == three
        assert conn.execute("SELECT count(*) FROM acted").fetchone() == (3,)
    finally:
        a.stop()
        b.stop()
    for instance in (a, b):
        turns = [
            r["definition"]
            for r in instance.records()
            if r.get("rule") == "late" and "definition" in r
        ]
        assert turns == ["stale", "current"]  # one line each way
        (stale,) = [r for r in instance.records() if r.get("definition") == "stale"]
        assert "open_when differ" in stale["message"] and stale["level"] == "WARNING"
