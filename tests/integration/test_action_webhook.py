"""Webhook actions (docs/explanation/actions.md): the alert POSTed to a real HTTP receiver in a
thread, through the outbox like a delivery, each attempt recorded in slawatch.action.

The rule is job_hung's shape (tests/integration/test_actions.py) with
``action: {webhook: ...}``; its target is delivered by the dispatcher's own functions
as the notifier ``action:job_hung``, at the test's clock.
"""

from __future__ import annotations

import base64
import os
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from standardwebhooks import Webhook

from slawatch.actions.history import list_actions, replay_actions
from slawatch.actions.run import Mode, runner
from slawatch.cli import main
from slawatch.config.notifiers import ConsoleConfig
from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.delivery.dispatcher import (
    claim_deliveries,
    deliver_notifier,
    lease_for,
    replay,
    replay_problem,
    settle_orphans,
)
from slawatch.delivery.notifiers import Notifier, build
from slawatch.demo import SHOP
from slawatch.engine.claim import ClaimPlan, drain
from slawatch.engine.migrate import grants, migrate
from slawatch.engine.outbox import DEFAULT_OUTBOX, Outbox, alert_payload
from slawatch.engine.ready import prepare
from slawatch.operate.metrics import Metrics
from slawatch.runtime.scheduler import Runner
from tests.conftest import ROOT
from tests.integration.helpers import Conn, FixedClock, alerts_of, claim_all
from tests.integration.test_actions import job_rule_with, silence_1_ack_2
from tests.integration.test_events import send
from tests.receivers import Reply, WebhookReceiver, closed_port
from tests.waiting import WAIT, lock_waits, wait_until

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
DUE = T0 + 15 * M + S  # job 1's first notification
SECRET = "whsec_" + base64.b64encode(os.urandom(24)).decode()
# Quick retries, three attempts: the test's clock walks past each backoff.
RETRY = {"first": "1s", "max": "1s", "attempts": 3}


def hook_rule(url: str, track: str = "inline", **action: Any) -> Rule:
    return job_rule_with(
        {"webhook": {"url": url, "secret": SECRET, "retry": RETRY}} | action, track
    )


def setup(
    conn: Conn, rule: Rule, mode: Mode = "on", jobs: int = 1, outbox: Outbox = DEFAULT_OUTBOX
) -> ClaimPlan:
    conn.execute(SHOP)
    migrate(conn, [rule])
    conn.execute(
        "INSERT INTO jobs SELECT i, 'sync', 'w1', 'running', %s FROM generate_series(1, %s) i",
        (T0.replace(tzinfo=None), jobs),
    )
    return prepare(conn, rule, outbox=outbox).with_act(runner(mode))


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    with Database(dsn, size=2, pooler="none") as database:
        yield database


def target(rule: Rule) -> Notifier:
    config = rule.action_target
    assert config is not None
    return build(config)


def deliver(db: Database, rule: Rule, at: datetime) -> tuple[int, int, int]:
    """One delivery pass of the action's target at ``at``: (sent, retried, dead)."""
    done = deliver_notifier(db, target(rule), FixedClock(at), {"job_hung": "hung"})
    return done.sent, done.retried, done.dead


def actions(conn: Conn) -> list[tuple[Any, ...]]:
    """(key, episode, n, kind, status, error, attempt) of every attempt, in order."""
    return conn.execute(
        "SELECT key, episode, n, kind, status, error, attempt FROM slawatch.action"
        " ORDER BY key, episode, attempt"
    ).fetchall()


def action_deliveries(conn: Conn) -> list[tuple[Any, ...]]:
    """(alert n, status) of the deliveries to the action's target."""
    return conn.execute(
        "SELECT a.n, d.status FROM slawatch.delivery d JOIN slawatch.alert a"
        " ON a.id = d.alert_id WHERE d.notifier = 'action:job_hung' ORDER BY d.id"
    ).fetchall()


def test_delivered_once_is_ok(conn: Conn, db: Database, receiver: WebhookReceiver) -> None:
    rule = hook_rule(receiver.url)
    plan = setup(conn, rule)
    assert claim_all(conn, plan, DUE) == 1
    # The claim wrote the delivery and a pending attempt; nothing is sent yet.
    assert actions(conn) == [("1", 1, 1, "webhook", "pending", None, 1)]
    assert action_deliveries(conn) == [(1, "pending")]
    assert receiver.requests == []
    assert deliver(db, rule, DUE + S) == (1, 0, 0)
    assert actions(conn) == [("1", 1, 1, "webhook", "ok", None, 1)]
    # The webhook notifier's body and signature, the alert as every receiver sees it.
    (request,) = receiver.requests
    body = Webhook(SECRET).verify(request.body, request.headers)
    alert = conn.execute(
        "SELECT rule, key, episode, n, severity, deadline, due_at, fired_at, row_data, kind"
        " FROM slawatch.alert WHERE n = 1"
    ).fetchone()
    assert alert is not None
    names = ("rule", "key", "episode", "n", "severity", "deadline", "due_at", "fired_at")
    expected = alert_payload(dict(zip((*names, "row_data", "kind"), alert, strict=True)), "hung")
    assert body == {"alerts": [expected]}
    assert body["alerts"][0]["id"] == "job_hung:1:e1:n1"
    # Re-notifications up to the cap: alerts, no second action, nothing more sent.
    for k in (2, 3):
        assert claim_all(conn, plan, T0 + 15 * M * k + k * S) == 1
    assert deliver(db, rule, T0 + 50 * M) == (0, 0, 0)
    assert len(receiver.requests) == 1 and len(actions(conn)) == 1
    assert action_deliveries(conn) == [(1, "sent")]


def test_receiver_down_then_up_is_retried_and_ok(conn: Conn, db: Database, track: str) -> None:
    port = closed_port()
    rule = hook_rule(f"http://127.0.0.1:{port}/hook", track)
    plan = setup(conn, rule)
    assert claim_all(conn, plan, DUE) == 1
    assert deliver(db, rule, DUE) == (0, 1, 0)  # nothing listens: a retry
    (attempt,) = actions(conn)
    assert attempt[4] == "pending"
    # The receiver comes up on that port; the retry is due a second later.
    with WebhookReceiver(port=port) as up:
        assert deliver(db, rule, DUE + 2 * S) == (1, 0, 0)
        assert up.alert_ids == ["job_hung:1:e1:n1"]
    assert actions(conn) == [("1", 1, 1, "webhook", "ok", None, 1)]


def test_always_500_is_dead_failed_and_replay_actions_retries(
    conn: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    receiver.default = Reply(status=500, body=b"no such job")
    rule = hook_rule(receiver.url)
    plan = setup(conn, rule, jobs=2)
    assert claim_all(conn, plan, DUE) == 2
    # Attempts 1 and 2 retry, 3 is the last; a pass stops at its first failure (the
    # receiver is down) and sends one action (batch 1): six passes, at most.
    for i in range(6):
        deliver(db, rule, DUE + 10 * i * S)
    assert action_deliveries(conn) == [(1, "dead"), (1, "dead")]
    rows = actions(conn)
    assert [r[4] for r in rows] == ["failed", "failed"]
    assert "500" in rows[0][5] and "no such job" in rows[0][5]
    # Listed as every action is.
    with db.connection("test") as c:
        listed = list_actions(c, "job_hung", "failed").actions
    assert [(a.kind, a.status) for a in listed] == [("webhook", "failed")] * 2
    # Off: only counted, nothing changes.
    assert replay_actions(db, [rule], DUE + M, "off").would_run == 2
    assert action_deliveries(conn) == [(1, "dead"), (1, "dead")]
    # replay --actions: each dead delivery back to pending, recorded as attempt 2.
    receiver.default = Reply()
    done = replay_actions(db, [rule], DUE + M)
    assert (done.queued, done.ok, done.failed) == (2, 0, 0)
    assert [(r[0], r[4], r[6]) for r in actions(conn)] == [
        ("1", "failed", 1),
        ("1", "pending", 2),
        ("2", "failed", 1),
        ("2", "pending", 2),
    ]
    assert deliver(db, rule, DUE + M) == (2, 0, 0)
    assert [(r[0], r[4], r[6]) for r in actions(conn)] == [
        ("1", "failed", 1),
        ("1", "ok", 2),
        ("2", "failed", 1),
        ("2", "ok", 2),
    ]
    # Once each: nothing failed and dead is left.
    assert replay_actions(db, [rule], DUE + 2 * M).queued == 0


def test_plain_replay_of_the_dead_delivery_is_the_next_attempt(
    conn: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    receiver.default = Reply(status=400)  # permanent: dead at once
    rule = hook_rule(receiver.url)
    plan = setup(conn, rule)
    assert claim_all(conn, plan, DUE) == 1
    assert deliver(db, rule, DUE) == (0, 0, 1)
    assert [r[4] for r in actions(conn)] == ["failed"]
    receiver.default = Reply()
    assert replay(conn, DUE + M, "job_hung", "action:job_hung") == 1
    assert deliver(db, rule, DUE + M) == (1, 0, 0)
    assert [(r[4], r[6]) for r in actions(conn)] == [("failed", 1), ("ok", 2)]


def test_a_replayed_action_is_not_followed_by_the_resolved_notice(
    conn: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """A replayed firing notification is followed by its episode's resolved notice to
    the same notifier; an action's target is not a notifier: the replay of its dead
    delivery sends the action's alert again, never the resolved notice."""
    receiver.default = Reply(status=400)  # permanent: dead at once
    rule = hook_rule(receiver.url).model_copy(update={"resolve": True})
    plan = setup(conn, rule)
    assert claim_all(conn, plan, DUE) == 1
    assert deliver(db, rule, DUE) == (0, 0, 1)
    # The job completes: the episode ends with its resolved notice (to console only).
    conn.execute("UPDATE jobs SET status = 'done'")
    claim_all(conn, plan, DUE + M)
    assert alerts_of(conn, "job_hung", "key", kind="resolved") == [("1",)]
    receiver.default = Reply()
    assert replay(conn, DUE + 2 * M, "job_hung", None) == 1
    assert action_deliveries(conn) == [(1, "pending")]
    assert deliver(db, rule, DUE + 2 * M) == (1, 0, 0)
    assert receiver.alert_ids == ["job_hung:1:e1:n1"] * 2
    assert [(r[4], r[6]) for r in actions(conn)] == [("failed", 1), ("ok", 2)]


def test_replay_moves_nothing_to_or_from_an_action(conn: Conn, db: Database) -> None:
    """``replay --notifier N --to NEW``: an action's target is neither (its alerts are
    the action's, and a notifier's would make the action run again)."""
    rule = hook_rule("http://127.0.0.1:9/hook")
    setup(conn, rule)
    configured = {"console", "action:job_hung"}
    to_action = replay_problem(conn, "console", "action:job_hung", configured, "--")
    assert to_action == (
        "--to: 'action:job_hung' is a rule's webhook action, not a notifier: nothing is moved to it"
    )
    from_action = replay_problem(conn, "action:job_hung", "console", configured, "--")
    assert from_action == (
        "--notifier: 'action:job_hung' is a rule's webhook action: its deliveries are"
        " not moved to a notifier ('replay --actions' sends them again)"
    )
    assert replay_problem(conn, "action:job_hung", None, configured, "--") is None


def test_a_settle_whose_next_attempt_is_taken_does_not_abort(
    conn: Conn, db: Database, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """action_once is per episode, not per delivery: when the episode already has an
    attempt numbered after the delivery's latest (here the one an older release's
    ``replay --actions`` wrote, running a webhook's failed attempt as SQL), 0005's
    trigger numbered the replayed delivery's attempt the same and the unique violation
    aborted the whole replay. Migration 0008 numbers it after the episode's latest."""
    from slawatch.engine import schema

    shipped = schema.migrations()
    settled = [m.filename for m in shipped].index("0008_action_settled.sql")
    # The previous release (and the later migrations, which do not touch actions).
    previous = shipped[:settled] + shipped[settled + 1 :]
    monkeypatch.setattr(schema, "migrations", lambda: previous)
    receiver.default = Reply(status=400)  # permanent: dead at once
    rule = hook_rule(receiver.url)
    plan = setup(conn, rule)
    assert claim_all(conn, plan, DUE) == 1
    assert deliver(db, rule, DUE) == (0, 0, 1)
    conn.execute(
        "INSERT INTO slawatch.action (rule, key, episode, n, kind, status, error, at, attempt)"
        " VALUES ('job_hung', '1', 1, 1, 'sql', 'failed', 'no such table', %s, 2)",
        (DUE + S,),
    )
    with pytest.raises(psycopg.errors.UniqueViolation):
        replay(conn, DUE + M, "job_hung", "action:job_hung")
    assert action_deliveries(conn) == [(1, "dead")]  # the replay rolled back whole
    monkeypatch.setattr(schema, "migrations", lambda: shipped)
    migrate(conn, [rule])
    # Replayed, dead again, replayed again (replay --actions this time): each settle
    # is the episode's next attempt.
    assert replay(conn, DUE + M, "job_hung", "action:job_hung") == 1
    assert deliver(db, rule, DUE + M) == (0, 0, 1)
    receiver.default = Reply()
    assert replay_actions(db, [rule], DUE + 2 * M).queued == 1
    assert deliver(db, rule, DUE + 2 * M) == (1, 0, 0)
    assert [(r[3], r[4], r[6]) for r in actions(conn)] == [
        ("webhook", "failed", 1),
        ("sql", "failed", 2),
        ("webhook", "failed", 3),
        ("webhook", "ok", 4),
    ]
    assert receiver.alert_ids == ["job_hung:1:e1:n1"] * 3


def test_two_settles_numbering_the_same_attempt_at_once_do_not_abort(
    conn: Conn, db: Database, dsn: str, receiver: WebhookReceiver
) -> None:
    """Two deliveries of one episode's action (a state the claim does not make, one
    attempt per episode, but the trigger must not abort on) back to pending at the same
    moment, in two transactions: both number their attempt 3; the second waits for the
    first, then records nothing rather than abort (ON CONFLICT DO NOTHING)."""
    receiver.default = Reply(status=400)
    rule = hook_rule(receiver.url)
    # Today's outbox: the test adds a delivery to the alert of n = 2 in slawatch.alert,
    # which the rows do not write (they keep there only the alert the action is on).
    plan = setup(conn, rule, outbox="alerts")
    assert claim_all(conn, plan, DUE) == 1
    assert deliver(db, rule, DUE) == (0, 0, 1)
    assert claim_all(conn, plan, T0 + 30 * M + 2 * S) == 1  # the episode's n = 2
    conn.execute(
        "WITH d AS (INSERT INTO slawatch.delivery (alert_id, notifier, status, next_attempt_at)"
        " SELECT id, 'action:job_hung', 'dead', %(at)s FROM slawatch.alert WHERE n = 2"
        " RETURNING id)"
        " INSERT INTO slawatch.action (rule, key, episode, n, kind, status, at, attempt,"
        " delivery_id) SELECT 'job_hung', '1', 1, 2, 'webhook', 'failed', %(at)s, 2, id FROM d",
        {"at": DUE + M},
    )
    settle = (
        "UPDATE slawatch.delivery SET status = 'pending' WHERE status = 'dead'"
        " AND alert_id = (SELECT id FROM slawatch.alert WHERE n = %s)"
        " AND notifier = 'action:job_hung'"
    )
    errors: list[BaseException] = []
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        assert first.execute(settle, (1,)).rowcount == 1  # attempt 3, not committed yet

        def other() -> None:
            try:
                assert second.execute(settle, (2,)).rowcount == 1
                second.commit()
            except BaseException as exc:  # reported by the test's thread
                errors.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        wait_until(lambda: lock_waits(conn) == ["transactionid"], "the second settle to wait")
        first.commit()
        thread.join(WAIT)
    assert not thread.is_alive() and errors == []
    assert action_deliveries(conn) == [(1, "pending"), (2, "pending")]
    assert [(r[2], r[4], r[6]) for r in actions(conn)] == [
        (1, "failed", 1),
        (2, "failed", 2),
        (1, "pending", 3),
    ]


def test_outcomes_are_counted_in_slawatch_actions(
    conn: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """``slawatch_actions_total{rule, status}`` counts a webhook action's outcome when
    its delivery settles, as an sql action's when it runs: sent is ok, dead or orphaned
    failed, acknowledged or silenced before the send skipped (beside the claim's
    pending record, and the delivery metrics of the notifier ``action:<rule>``)."""
    metrics = Metrics(db, FixedClock(DUE), lambda: ["console", "action:job_hung"])
    rule = hook_rule(receiver.url)
    setup(conn, rule, jobs=4)
    plan = prepare(conn, rule).with_act(runner("on", metrics.acted))
    assert claim_all(conn, plan, DUE) == 4
    # After the claim, before the send: job 3's episode acknowledged, job 4 silenced.
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " SELECT rule, key, episode, id, %s, 'test' FROM slawatch.alert WHERE key = '3'",
        (DUE,),
    )
    conn.execute(
        "INSERT INTO slawatch.silence (rule, key, starts_at, ends_at, created_at, author)"
        " VALUES ('job_hung', '4', %s, %s, %s, 'test')",
        (DUE, DUE + 60 * M, DUE),
    )
    receiver.replies = [Reply(), Reply(status=400)]  # job 1 taken, job 2 dead at once
    for i in range(4):
        deliver_notifier(db, target(rule), FixedClock(DUE + i * S), {}, metrics=metrics)
    assert [(r[0], r[4]) for r in actions(conn)] == [
        ("1", "ok"),
        ("2", "failed"),
        ("3", "skipped"),
        ("4", "skipped"),
    ]
    # A 5th hung job, its delivery orphaned (the rule lost its action): failed.
    conn.execute(
        "INSERT INTO jobs VALUES (5, 'sync', 'w1', 'running', %s)", (T0.replace(tzinfo=None),)
    )
    assert claim_all(conn, plan, DUE + M) == 1
    counts = settle_orphans(db, {"console"}, FixedClock(DUE + M))
    assert counts == {"action:job_hung": 1}
    metrics.orphaned(counts)

    def counted(status: str) -> float | None:
        return metrics.registry.get_sample_value(
            "slawatch_actions_total", {"rule": "job_hung", "status": status}
        )

    assert [counted(s) for s in ("pending", "ok", "failed", "skipped")] == [5, 1, 2, 2]
    # A notifier's deliveries are not actions.
    console = build(ConsoleConfig.model_validate({"name": "console", "type": "console"}))
    assert deliver_notifier(db, console, FixedClock(DUE + M), {}, metrics=metrics).sent == 3
    rules = {
        sample.labels["rule"]
        for family in metrics.registry.collect()
        if family.name == "slawatch_actions"
        for sample in family.samples
    }
    assert rules == {"job_hung"}
    deliveries = "slawatch_deliveries_total"
    got = metrics.registry.get_sample_value(
        deliveries, {"notifier": "action:job_hung", "outcome": "sent"}
    )
    assert got == 1


def test_a_crash_between_send_and_settle_loses_no_record(
    conn: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """The receiver took the alert, and the process died before recording it: the
    attempt stays pending with its delivery, which is sent again once its lease ran
    out (at least once), and then recorded ok."""
    rule = hook_rule(receiver.url)
    plan = setup(conn, rule)
    assert claim_all(conn, plan, DUE) == 1
    hook = target(rule)
    batch = claim_deliveries(db, hook, DUE)
    (row,) = batch.rows
    hook.send([alert_payload(row)])  # ... and the process dies here, before settling
    assert [r[4] for r in actions(conn)] == ["pending"]
    assert deliver(db, rule, DUE + S) == (0, 0, 0)  # leased: not due yet
    assert deliver(db, rule, DUE + lease_for(hook) + S) == (1, 0, 0)
    assert receiver.alert_ids == ["job_hung:1:e1:n1"] * 2
    assert actions(conn) == [("1", 1, 1, "webhook", "ok", None, 1)]


def test_an_event_rule_posts_its_alert(conn: Conn, db: Database, receiver: WebhookReceiver) -> None:
    rule = Rule.model_validate(
        {
            "name": "parcel",
            "events": {"start": "parcel_shipped", "stop": "parcel_delivered", "within": "72h"},
            "notify": ["console"],
            "action": {"webhook": {"url": receiver.url}},
        }
    )
    migrate(conn, [rule])
    send(conn, "parcel_shipped", "1Z999", T0, {"carrier": "ups"})
    send(conn, "parcel_shipped", "1Z777", T0)
    send(conn, "parcel_delivered", "1Z777", T0 + 10 * M)
    with db.connection("test") as c:
        plan = prepare(c, rule).with_act(runner("on"))
    assert drain(db, plan, FixedClock(T0 + 73 * 60 * M)).claimed == 1
    target_config = rule.action_target
    assert target_config is not None
    assert deliver_notifier(db, build(target_config), FixedClock(T0 + 74 * 60 * M)).sent == 1
    (alert,) = [a for r in receiver.requests for a in r.alerts]
    assert (alert["id"], alert["row"]["data"]) == ("parcel:1Z999:e1:n1", {"carrier": "ups"})
    row = conn.execute("SELECT key, kind, status FROM slawatch.action").fetchone()
    assert row == ("1Z999", "webhook", "ok")


def test_an_acknowledged_or_silenced_episode_is_skipped_and_not_sent(
    conn: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    rule = hook_rule(receiver.url)
    plan = setup(conn, rule, jobs=3)
    silence_1_ack_2(conn)
    assert claim_all(conn, plan, DUE) == 3
    assert [(r[0], r[4], r[5]) for r in actions(conn)] == [
        ("1", "skipped", "silenced"),
        ("2", "skipped", "acknowledged"),
        ("3", "pending", None),
    ]
    assert action_deliveries(conn) == [(1, "pending")]  # job 3's only
    assert deliver(db, rule, DUE) == (1, 0, 0)
    assert receiver.alert_ids == ["job_hung:3:e1:n1"]


def test_an_ack_after_the_claim_and_before_the_send_skips_it(
    conn: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    rule = hook_rule(receiver.url)
    plan = setup(conn, rule)
    assert claim_all(conn, plan, DUE) == 1
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " SELECT rule, key, episode, id, %s, 'test' FROM slawatch.alert",
        (DUE,),
    )
    deliver(db, rule, DUE + S)
    assert receiver.requests == []
    assert [(r[4], r[5]) for r in actions(conn)] == [("skipped", "acknowledged")]


@pytest.mark.parametrize("mode", ["off", "dry-run"])
def test_actions_off_records_would_run_and_sends_nothing(
    conn: Conn, db: Database, receiver: WebhookReceiver, mode: Mode
) -> None:
    rule = hook_rule(receiver.url)
    plan = setup(conn, rule, mode=mode)
    assert claim_all(conn, plan, DUE) == 1
    assert [r[4] for r in actions(conn)] == ["would_run"]
    assert action_deliveries(conn) == []
    assert deliver(db, rule, DUE) == (0, 0, 0)
    assert receiver.requests == []


def test_run_once_sends_the_action_and_replay_actions_cli(
    conn: Conn,
    dsn: str,
    tmp_path: Path,
    receiver: WebhookReceiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``slawatch run --once`` delivers the action's target as a notifier; its secret
    comes from the environment; ``replay --actions`` puts a dead one back."""
    receiver.default = Reply(status=410)  # permanent: dead at once
    rule = hook_rule(receiver.url)
    setup(conn, rule)
    conn.execute("UPDATE jobs SET heartbeat_at = now() - interval '1 hour'")
    rules = tmp_path / "rules"
    rules.mkdir()
    data = rule.model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["action"]["webhook"]["secret"] = "${JOB_HOOK_SECRET}"
    (rules / "job_hung.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("JOB_HOOK_SECRET", SECRET)
    monkeypatch.setenv("SLAWATCH_HTTP", "")
    args = ["--dsn", dsn, "--rules", str(rules), "--notifiers", str(ROOT / "notifiers")]
    assert main([*args, "run", "--once"]) == 1  # a delivery went dead
    assert "notifier action:job_hung: 0 sent, 0 retried, 1 dead" in capsys.readouterr().out
    assert [r[4] for r in actions(conn)] == ["failed"]
    # `slawatch replay` knows the action's target: its dead delivery goes back.
    assert main([*args, "replay"]) == 0
    assert "ok: 1 dead deliveries back to pending" in capsys.readouterr().out
    assert main([*args, "run", "--once"]) == 1
    assert [(r[4], r[6]) for r in actions(conn)] == [("failed", 1), ("failed", 2)]
    receiver.default = Reply()
    assert main([*args, "replay", "--actions"]) == 0
    assert "1 webhook action to be sent again" in capsys.readouterr().out
    assert main([*args, "run", "--once"]) == 0
    assert [(r[4], r[6]) for r in actions(conn)] == [("failed", 1), ("failed", 2), ("ok", 3)]
    last = receiver.requests[-1]
    assert Webhook(SECRET).verify(last.body, last.headers)["alerts"][0]["key"] == "1"


def test_the_runner_sends_a_webhook_action_as_a_notifier_and_a_reload_follows(
    conn: Conn, dsn: str, receiver: WebhookReceiver
) -> None:
    """The target action:<rule> is one of the runner's notifiers (its worker, its
    deliveries): added and removed with its rule's action by a reload."""
    rule = hook_rule(receiver.url)
    plain = rule.model_copy(update={"action": None})
    setup(conn, rule)
    console = ConsoleConfig(name="console", type="console")
    runner_ = Runner(dsn, [plain], [console], clock=FixedClock(DUE))
    try:
        assert sorted(runner_.notifiers) == ["console"]
        assert runner_.apply([rule], [console])
        assert sorted(runner_.notifiers) == ["action:job_hung", "console"]
        once = runner_.once()
        assert once.notifiers["action:job_hung"] is not None
        assert once.notifiers["action:job_hung"].sent == 1
        assert receiver.alert_ids == ["job_hung:1:e1:n1"]
        assert [r[4] for r in actions(conn)] == ["ok"]
        assert runner_.apply([plain], [console])
        assert sorted(runner_.notifiers) == ["console"]
    finally:
        runner_.close()


def test_a_role_with_only_the_printed_grants_runs_and_settles_it(
    conn: Conn, dsn: str, receiver: WebhookReceiver, track: str
) -> None:
    """Least privilege: the claim writes the attempt, and the trigger that settles it
    runs as the delivering role: the GRANTs `migrate --print` prints must cover both."""
    rule = hook_rule(receiver.url, track)
    setup(conn, rule)
    name = f"slawatch_hook_{uuid.uuid4().hex[:6]}"
    conn.execute(f"CREATE ROLE {name} LOGIN")
    try:
        for g in grants([rule], name):
            conn.execute(g)
        as_role = make_conninfo(**(conninfo_to_dict(dsn) | {"user": name}))
        with psycopg.connect(as_role, autocommit=True) as app:
            plan = prepare(app, rule).with_act(runner("on"))
            assert claim_all(app, plan, DUE) == 1
        with Database(as_role, size=2, pooler="none") as db:
            assert deliver(db, rule, DUE + S) == (1, 0, 0)
        assert actions(conn) == [("1", 1, 1, "webhook", "ok", None, 1)]
        assert len(receiver.requests) == 1
    finally:
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")
