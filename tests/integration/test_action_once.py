"""One action per episode when the rule's action or its ``on`` changes while the
episode is open (docs/explanation/actions.md): a reload, or a restart with an edited rule.

The episode's action already ran (attempt 1 recorded for its rule, key and episode);
the edited rule's ``on`` is a later notification, or its action the other kind (SQL,
webhook). The next claims must keep the alerts flowing and neither run the action
again nor record a second attempt 1 (``action_once``: the unique violation rolled the
whole claim back, tick after tick, until the episode ended).

The rules are test_actions.py's (job_hung, renotified every 15 minutes, 3 times).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from slawatch.actions.run import runner
from slawatch.config.rules import Rule
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from tests.integration.helpers import Conn, claim_all, episodes
from tests.integration.test_action_examples import predicted
from tests.integration.test_action_webhook import SECRET
from tests.integration.test_actions import RESTART, job_rule_with, naive, restarts, setup
from tests.integration.test_events import send

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
HOOK = {"url": "http://127.0.0.1:9/unused", "secret": SECRET}


def rule_with(action: dict[str, Any], track: str) -> Rule:
    """job_hung with ``action`` and room for a fourth notification."""
    return job_rule_with(action, track, notifications=4)


def notification(k: int) -> datetime:
    """A moment at which notification ``k`` of job 1's first episode is due."""
    return T0 + 15 * M * k + k * S


def attempts(conn: Conn) -> list[tuple[Any, ...]]:
    """(key, episode, n, kind, status, attempt) of every attempt, in order."""
    return conn.execute(
        "SELECT key, episode, n, kind, status, attempt FROM slawatch.action"
        " ORDER BY key, episode, attempt"
    ).fetchall()


def action_deliveries(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*) FROM slawatch.delivery WHERE notifier = 'action:job_hung'"
    ).fetchone()
    assert row is not None
    return int(row[0])


SQL_ON_2 = {"sql": RESTART, "on": 2}
SQL_ON_3 = {"sql": RESTART, "on": 3}
HOOK_ON_2 = {"webhook": HOOK, "on": 2}
HOOK_ON_3 = {"webhook": HOOK, "on": 3}


@pytest.mark.parametrize(
    ("before", "after", "kind"),
    [
        (SQL_ON_2, SQL_ON_3, "sql"),  # `on` moved on
        (SQL_ON_2, HOOK_ON_3, "sql"),  # ... and SQL became a webhook
        (HOOK_ON_2, SQL_ON_3, "webhook"),  # ... and a webhook became SQL
        (HOOK_ON_2, HOOK_ON_3, "webhook"),
    ],
    ids=["sql-sql", "sql-webhook", "webhook-sql", "webhook-webhook"],
)
def test_an_on_moved_mid_episode_does_not_act_again_and_alerts_flow(
    conn: Conn, track: str, before: dict[str, Any], after: dict[str, Any], kind: str
) -> None:
    plan = setup(conn, rule_with(before, track))
    for k in (1, 2):
        assert claim_all(conn, plan, notification(k)) == 1
    acted = [("1", 1, 2, kind, "ok" if kind == "sql" else "pending", 1)]
    assert attempts(conn) == acted
    ran = restarts(conn)
    assert ran == ([1] if kind == "sql" else [])
    sent = action_deliveries(conn)
    # The edited rule, as a reload or a restart prepares it.
    edited = rule_with(after, track)
    migrate(conn, [edited])
    plan = prepare(conn, edited).with_act(runner("on"))
    # `run --dry-run` does not list it either.
    assert predicted(conn, edited, notification(3)) == []
    for k in (3, 4):
        assert claim_all(conn, plan, notification(k)) == 1
    assert [n for _, _, n in episodes(conn, "job_hung")] == [1, 2, 3, 4]
    # The episode's action was attempted once: not run, sent or recorded again.
    assert attempts(conn) == acted
    assert restarts(conn) == ran
    assert action_deliveries(conn) == sent


def test_the_next_episode_acts_at_the_new_on(conn: Conn, track: str) -> None:
    """Only the episode that was acted on is left alone: the next one acts at the
    edited rule's ``on``."""
    plan = setup(conn, rule_with(SQL_ON_2, track))
    for k in (1, 2):
        assert claim_all(conn, plan, notification(k)) == 1
    rule = rule_with(SQL_ON_3, track)
    migrate(conn, [rule])  # the edited rule's definition recorded (docs/how-to/rolling-deploys.md)
    plan = prepare(conn, rule).with_act(runner("on"))
    # The job recovers (its heartbeat moves on), then hangs again: episode 2.
    recovered = T0 + 40 * M
    conn.execute("UPDATE jobs SET heartbeat_at = %s", (recovered.replace(tzinfo=None),))
    claim_all(conn, plan, recovered + S)  # ends episode 1 (track: table: at its next check)
    for k in (1, 2, 3):
        if k == 3:
            assert predicted(conn, rule, recovered + 15 * M * k + k * S) == [
                ("1", 3, {"id": "1", "kind": "sync"})
            ]
        assert claim_all(conn, plan, recovered + 15 * M * k + k * S) == 1
    assert restarts(conn) == [1, 1]
    assert [(e, n, attempt) for _, e, n, _, _, attempt in attempts(conn)] == [
        (1, 2, 1),
        (2, 3, 1),
    ]


def test_another_keys_episode_acts_at_the_new_on(conn: Conn, track: str) -> None:
    """Left out: the episode that acted, not the rule's other rows. Job 2 hangs half an
    hour after job 1, once the edited rule runs."""
    plan = setup(conn, rule_with(SQL_ON_2, track))
    for k in (1, 2):
        assert claim_all(conn, plan, notification(k)) == 1
    conn.execute("INSERT INTO jobs VALUES (2, 'sync', 'w1', 'running', %s)", (naive(T0 + 30 * M),))
    rule = rule_with(SQL_ON_3, track)
    migrate(conn, [rule])  # the edited rule's definition recorded (docs/how-to/rolling-deploys.md)
    plan = prepare(conn, rule).with_act(runner("on"))
    assert claim_all(conn, plan, notification(3)) == 2  # job 1's #3, job 2's #1
    assert claim_all(conn, plan, notification(4)) == 2  # #4, #2
    assert claim_all(conn, plan, notification(5)) == 1  # job 2's #3: it acts
    assert restarts(conn) == [1, 2]
    assert [(key, n) for key, _, n, _, _, _ in attempts(conn)] == [("1", 2), ("2", 3)]


def test_an_event_rules_webhook_action_moved_on_is_not_sent_again(conn: Conn) -> None:
    def parcel(on: int) -> Rule:
        return Rule.model_validate(
            {
                "name": "job_hung",  # action_deliveries() counts action:job_hung's
                "events": {"start": "parcel_shipped", "stop": "parcel_delivered", "within": "1h"},
                "renotify": {"every": "1h", "max": 3},
                "notify": ["console"],
                "action": {"webhook": HOOK, "on": on},
            }
        )

    migrate(conn, [parcel(1)])
    send(conn, "parcel_shipped", "1Z999", T0)
    plan = prepare(conn, parcel(1)).with_act(runner("on"))
    assert claim_all(conn, plan, T0 + 60 * M + S) == 1
    assert action_deliveries(conn) == 1
    migrate(conn, [parcel(2)])  # the edited rule's definition recorded
    plan = prepare(conn, parcel(2)).with_act(runner("on"))
    assert claim_all(conn, plan, T0 + 120 * M + 2 * S) == 1
    assert claim_all(conn, plan, T0 + 180 * M + 3 * S) == 1
    assert [n for _, _, n in episodes(conn, "job_hung")] == [1, 2, 3]
    assert action_deliveries(conn) == 1
    assert attempts(conn) == [("1Z999", 1, 1, "webhook", "pending", 1)]


def test_another_rules_attempt_is_not_this_rules(conn: Conn, track: str) -> None:
    """Two rules on one table: the same key and episode acted on by one rule is still
    acted on by the other."""
    plan = setup(conn, rule_with(SQL_ON_2, track))
    other = rule_with(SQL_ON_2, track).model_copy(update={"name": "job_stuck"})
    migrate(conn, [other])
    second = prepare(conn, other).with_act(runner("on"))
    for k in (1, 2):
        assert claim_all(conn, plan, notification(k)) == 1
        if k == 2:  # job_hung acted: job_stuck still will, and `run --dry-run` says so
            assert predicted(conn, other, notification(k)) == [
                ("1", 2, {"id": "1", "kind": "sync"})
            ]
        assert claim_all(conn, second, notification(k)) == 1
    assert restarts(conn) == [1, 1]
    rows = conn.execute("SELECT rule, key, episode, n FROM slawatch.action ORDER BY rule")
    assert rows.fetchall() == [("job_hung", "1", 1, 2), ("job_stuck", "1", 1, 2)]


def test_the_acted_check_is_one_index_scan_hashed(conn: Conn) -> None:
    """With slawatch.action empty when planned (a new install), NOT EXISTS was an anti
    join reading every attempt of the rule for each alert; the check is one scan of
    action_once's index by rule and the batch's keys and episodes, looked up in a hash."""
    plan = setup(conn, rule_with(SQL_ON_3, "inline"))
    explained = conn.execute(
        b"EXPLAIN " + plan.statement.as_bytes(conn), plan.params(notification(3))
    ).fetchall()
    text = "\n".join(str(row[0]) for row in explained)
    assert re.search(
        # PostgreSQL 15: NOT (hashed SubPlan 35); 17+: NOT (ANY ((key = (hashed SubPlan 35).col1)
        r"NOT \(.*hashed SubPlan (\d+)\).*\n.*SubPlan \1\n.*using action_once on action x.*\n"
        # this batch's keys and episodes, not every attempt of a recurring key (as index
        # conditions, or on 15 with the table empty when planned, a filter of the scan)
        r"(?:.*\n)?.*\(key = ANY .*\) AND \(episode = ANY ",
        text,
    ), text
    assert "Anti Join" not in text, text
