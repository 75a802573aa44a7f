"""The Microsoft Teams notifier: one Adaptive Card per batch, to a Workflows webhook
(or a channel's incoming webhook, which takes the same message).

The message is ``{"type": "message", "attachments": [one Adaptive Card]}``. The
card is a title, one container per alert (up to ``listed``) and, when the batch
holds more, a last line counting the rest. Teams refuses a message over about
28 KB: a key is cut at 200 characters, a description at 500 and a row at 1000,
and an alert still too big for its share of the message (a tenth of 24 KB at
most ten alerts, as sent: UTF-8, JSON escapes) is cut again by half until it fits.
"""

from __future__ import annotations

import json
from typing import Any

from slawatch.config.notifiers import TeamsConfig
from slawatch.delivery.notifiers.base import cut, encode, is_resolved, is_summary
from slawatch.delivery.notifiers.http import HttpNotifier
from slawatch.delivery.notifiers.slack import headline

CARD_VERSION = "1.4"  # what Teams renders on every client
# Adaptive Card colours ("attention" is red, "warning" amber, "good" green).
COLORS = {"critical": "attention", "warning": "warning", "info": "accent"}
# Bytes of the whole message: Teams' limit is about 28 KB, the rest is headroom.
MESSAGE_BUDGET = 24_000


def _text(text: str, **style: Any) -> dict[str, Any]:
    # wrap: Teams shows one line otherwise, cut at the card's width.
    return {"type": "TextBlock", "text": text, "wrap": True, **style}


def alert_container(alert: dict[str, Any], scale: int = 1) -> dict[str, Any]:
    """One alert as a container: a coloured first line, when, what, and the row;
    every text cut at its limit divided by ``scale``."""
    if is_summary(alert):
        keys = ", ".join(a["key"] for a in alert["first"])
        items = [
            _text(
                f"storm · {alert['rule']} · {alert['count']:,} overdue",
                weight="Bolder",
                color="attention",
            ),
            _text(cut(alert["description"], 1000 // scale)),
        ]
        if keys:
            shown = cut(keys, 2000 // scale)
            items.append(_text(f"First {alert['listed']}: {shown}", isSubtle=True))
        if alert.get("link"):
            items.append(_text(f"[All of them]({alert['link']})"))
        return {"type": "Container", "separator": True, "items": items}
    key = cut(alert["key"], 200 // scale)
    if is_resolved(alert):
        first = _text(f"resolved · {alert['rule']} · key {key}", weight="Bolder", color="good")
        when = f"Ended by {alert['fired_at']} (episode {alert['episode']})"
    else:
        color = COLORS.get(alert["severity"], "default")
        first = _text(
            f"{alert['severity']} · {alert['rule']} · key {key}", weight="Bolder", color=color
        )
        since = alert["due_at"] or alert["fired_at"]
        when = f"Overdue since {since} (episode {alert['episode']}, notification {alert['n']})"
    items = [first, _text(when, isSubtle=True)]
    if alert.get("description"):
        items.append(_text(cut(alert["description"], 500 // scale)))
    if not is_resolved(alert):
        row = json.dumps(alert.get("row"), default=str, ensure_ascii=False)
        items.append(_text(cut(row, 1000 // scale), fontType="Monospace", size="Small"))
    return {"type": "Container", "separator": True, "items": items}


def fitted(alert: dict[str, Any], budget: int) -> dict[str, Any]:
    """The alert's container in at most about ``budget`` bytes as sent."""
    scale = 1
    container = alert_container(alert)
    # A character takes up to 6 bytes as sent (a JSON escape): 4 halvings suffice.
    while len(encode(container)) > budget and scale < 16:
        scale *= 2
        container = alert_container(alert, scale)
    return container


def card(alerts: list[dict[str, Any]], listed: int) -> dict[str, Any]:
    """The Adaptive Card for one batch."""
    shown = alerts[:listed]
    body: list[dict[str, Any]] = [_text(headline(alerts), size="Medium", weight="Bolder")]
    # The title takes at most 150 characters (900 bytes); the alerts share the rest.
    share = (MESSAGE_BUDGET - 1500) // len(shown)
    body += [fitted(a, share) for a in shown]
    rest = len(alerts) - len(shown)
    if rest:
        body.append(_text(f"+{rest} more in this batch, not listed", isSubtle=True))
    return {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": CARD_VERSION,
        "body": body,
        "msteams": {"width": "Full"},
    }


def message(alerts: list[dict[str, Any]], listed: int) -> dict[str, Any]:
    """The webhook body: a message with the card as its one attachment."""
    return {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card(alerts, listed),
            }
        ],
    }


class TeamsNotifier(HttpNotifier):
    """POSTs one card per batch; a Workflows webhook answers 202, an incoming webhook 200."""

    def __init__(self, config: TeamsConfig) -> None:
        super().__init__(config, config.ca_file)
        self.config = config
        self.url = config.url.get_secret_value()
        # The signature in the query (or the hook's path) is the credential: errors
        # show https://host/… only.
        self.keep_target_secrets(self.url)

    def send(self, alerts: list[dict[str, Any]]) -> None:
        self.post(self.url, encode(message(alerts, self.config.listed)))
