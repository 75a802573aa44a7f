"""The console notifier: one readable line per alert on standard output."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from slawatch.config.notifiers import ConsoleConfig
from slawatch.delivery.notifiers.base import BaseNotifier, is_summary, number
from slawatch.logs import printable


def format_alert(alert: dict[str, Any]) -> str:
    """``[warning] order_unshipped #1 key=42 due 2026-11-20T10:00:00Z {"id": 42, ...}``
    (``resolved`` in place of ``#1`` for a resolved notice). A storm summary is
    ``[warning] order_unshipped storm: <its description>``, its listed alerts below it.

    Each line's control characters are written out (``\\x1b``, ``\\r\\n``): a key or
    a value cannot retitle or clear the terminal, nor forge a line of the output."""
    if is_summary(alert):
        head = printable(f"[{alert['severity']}] {alert['rule']} storm: {alert['description']}")
        return "\n".join([head] + ["  " + format_alert(a) for a in alert["first"]])
    row = json.dumps(alert["row"], default=str, separators=(", ", ": "))
    return printable(
        f"[{alert['severity']}] {alert['rule']} {number(alert)} key={alert['key']} "
        f"due {alert['due_at']} {row}"
    )


class ConsoleNotifier(BaseNotifier):
    """Writes alerts to a stream (standard output by default)."""

    def __init__(self, config: ConsoleConfig, stream: TextIO | None = None) -> None:
        super().__init__(config)
        self._stream = stream

    def send(self, alerts: list[dict[str, Any]]) -> None:
        stream = self._stream or sys.stdout
        for alert in alerts:
            stream.write(format_alert(alert) + "\n")
        stream.flush()
