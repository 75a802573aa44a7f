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
    """Deliveries by status, of today's outbox only (SLAWATCH_OUTBOX=alerts)."""
    return dict(conn.execute("SELECT status, count(*) FROM slawatch.delivery GROUP BY 1"))
