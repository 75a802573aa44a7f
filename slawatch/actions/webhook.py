"""Webhook actions (``action: {webhook: ...}``, docs/explanation/actions.md): the alert POSTed to a
system's API, through the outbox like a delivery.

A claim that owes the action (its alert's number is ``on``) writes, in its own
transaction, a delivery of that alert to the notifier ``action:<rule>`` (the rule's
webhook settings, sent by the webhook notifier's sender: same body, same Standard
Webhooks signature) and the attempt's row in ``slawatch.action``, kind 'webhook',
status 'pending', naming that delivery. The delivery workers send it, retry it with
its backoff and let it die as any delivery; the write that settles the delivery also
settles the attempt (a trigger, 0005_action_webhook.sql): sent is 'ok', dead is
'failed' with the receiver's error. So a crash between the send and the settle
loses nothing: both stay pending, and the delivery is sent again (at least once).

An acknowledged or silenced episode is recorded 'skipped' and nothing is sent;
``SLAWATCH_ACTIONS=off`` or ``dry-run`` records 'would_run'. ``slawatch replay
--actions`` (and ``slawatch replay``) puts a failed one's dead delivery back: the
next attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Literal, LiteralString

from psycopg.types.json import Jsonb

from slawatch.config.rules import ACTION_TARGET, Rule
from slawatch.db import Connection, Database, translate
from slawatch.engine.acting import Due
from slawatch.engine.queries import parse_queries

log = logging.getLogger(__name__)


@cache
def queries() -> dict[str, LiteralString]:
    """The named queries of ``slawatch/sql/action_webhook.sql``."""
    text = resources.files("slawatch").joinpath("sql/action_webhook.sql").read_text()
    return parse_queries(text)


def target(rule: str) -> str:
    """The notifier a webhook action of ``rule`` is delivered as."""
    return ACTION_TARGET + rule


def act(
    conn: Connection,
    rule: Rule,
    dues: list[Due],
    now: datetime,
    mode: Literal["on", "off", "dry-run"],
    counted: Callable[[str, str], None] | None = None,
) -> None:
    """Record ``dues`` (the claim's alerts that owe ``rule``'s webhook action) and
    write a delivery for each to be sent, in the transaction ``conn`` is in."""
    assert rule.action is not None and rule.action.webhook is not None
    records = []
    for due in dues:
        if due.skip is not None:
            status, error = "skipped", due.skip
        elif mode != "on":
            log.info(
                "rule %s: would POST the alert for key %s (episode %d) to its webhook action"
                " (SLAWATCH_ACTIONS=%s)",
                rule.name,
                due.key,
                due.episode,
                mode,
            )
            status, error = "would_run", None
        else:
            status, error = "pending", None
        records.append(
            {
                "key": due.key,
                "episode": due.episode,
                "n": due.n,
                "status": status,
                "error": error,
                "params": due.params,
            }
        )
    if not records:
        return
    with translate(f"recording the webhook actions of rule {rule.name}"):
        conn.execute(
            queries()["record_webhook_actions"],
            {
                "rule": rule.name,
                "target": target(rule.name),
                "now": now,
                "records": Jsonb(records),
            },
        )
    if counted is not None:
        for r in records:
            counted(rule.name, str(r["status"]))


def replay(db: Database, rules: list[str], now: datetime, mode: str = "on") -> int:
    """Put the dead deliveries of ``rules``' failed webhook actions back to pending (the
    delivery workers send them; each is recorded as the action's next attempt); how
    many. ``mode`` other than "on" only counts them."""
    if not rules:
        return 0

    def work(conn: Connection) -> int:
        with translate("replaying webhook actions"), conn.transaction():
            if mode != "on":
                row = conn.execute(queries()["failed_webhook_actions"], {"rules": rules})
                got = row.fetchone()
                return int(got[0]) if got else 0
            cur = conn.execute(queries()["replay_webhook_actions"], {"rules": rules, "now": now})
            if cur.rowcount:
                conn.execute(queries()["wake_deliveries"])
            return cur.rowcount

    return db.run("replaying webhook actions", work)
