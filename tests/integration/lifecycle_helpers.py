"""Helpers for the ack, silence and resolved-notice tests."""

from __future__ import annotations

from typing import Any

from slawatch.config.notifiers import ConsoleConfig
from slawatch.delivery.notifiers.base import BaseNotifier
from tests.integration.helpers import Conn


class Inbox(BaseNotifier):
    """A receiver that keeps every alert it is sent."""

    def __init__(self, name: str = "console", batch: int = 100) -> None:
        super().__init__(ConsoleConfig(name=name, type="console", batch=batch))
        self.got: list[dict[str, Any]] = []

    def send(self, alerts: list[dict[str, Any]]) -> None:
        self.got.extend(alerts)

    def ids(self) -> list[str]:
        return sorted(a["id"] for a in self.got)


def statuses(conn: Conn) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM slawatch.delivery GROUP BY 1"))


def resolved(conn: Conn, rule: str = "order_unshipped") -> list[tuple[str, int, str, list[str]]]:
    """(key, episode, severity, [notifiers]) of every resolved notice of ``rule``."""
    rows = conn.execute(
        "SELECT a.key, a.episode, a.severity,"
        " array_remove(array_agg(d.notifier ORDER BY d.notifier), NULL)"
        " FROM slawatch.alert a LEFT JOIN slawatch.delivery d ON d.alert_id = a.id"
        " WHERE a.rule = %s AND a.kind = 'resolved' AND a.n = 0"
        " GROUP BY a.id ORDER BY a.key, a.episode",
        (rule,),
    ).fetchall()
    return [(k, e, s, list(ns)) for k, e, s, ns in rows]
