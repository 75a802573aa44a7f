"""The Slack notifier: one incoming-webhook message per batch, in Block Kit.

A message is a header, one section per alert (up to ``listed``) and, when the
batch holds more, a last line counting the rest. Slack's limits hold whatever
the alerts contain: at most 50 blocks, 150 characters in a header, 3000 in a
section's text (a long row is cut), and ``text`` (the notification's words
and the fallback) at most 3000 characters.
"""

from __future__ import annotations

import json
from typing import Any

from slawatch.config.notifiers import SlackConfig
from slawatch.delivery.notifiers.base import cut, encode, is_resolved, is_summary
from slawatch.delivery.notifiers.http import HttpNotifier

HEADER_LIMIT = 150
TEXT_LIMIT = 3000
ICONS = {
    "critical": ":red_circle:",
    "warning": ":large_orange_circle:",
    "info": ":large_blue_circle:",
}
RESOLVED_ICON = ":white_check_mark:"
STORM_ICON = ":rotating_light:"


def escape(text: str) -> str:
    """Text as Slack's mrkdwn shows it literally: &, < and > are its markup."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str, limit: int) -> str:
    # Inline code cannot hold a backtick; an escape would be counted after the cut.
    return cut(escape(text.replace("`", "'")), limit)


def headline(alerts: list[dict[str, Any]]) -> str:
    """``order_unshipped: key 1042 overdue (critical)`` for one alert, ``12 overdue,
    2 resolved: order_unshipped, invoice_unpaid`` for a batch."""
    if len(alerts) == 1 and is_summary(alerts[0]):
        a = alerts[0]
        return cut(f"{a['rule']}: {a['count']:,} overdue (storm, {a['severity']})", HEADER_LIMIT)
    if len(alerts) == 1:
        a = alerts[0]
        state = "resolved" if is_resolved(a) else f"overdue ({a['severity']})"
        return cut(f"{a['rule']}: key {a['key']} {state}", HEADER_LIMIT)
    resolved = sum(1 for a in alerts if is_resolved(a))
    # A storm summary stands for `count` overdue rows.
    overdue = sum(a["count"] if is_summary(a) else 1 for a in alerts if not is_resolved(a))
    counts = [f"{overdue:,} overdue"] if resolved < len(alerts) else []
    counts += [f"{resolved} resolved"] if resolved else []
    rules = list(dict.fromkeys(a["rule"] for a in alerts))
    return cut(f"{', '.join(counts)}: {', '.join(rules)}", HEADER_LIMIT)


def storm_section(alert: dict[str, Any]) -> str:
    """A storm summary as mrkdwn: what it stands for, a link to all of them, and the
    keys of the listed alerts, at most 3000 characters."""
    head = f"{STORM_ICON} *storm* · *{escape(alert['rule'])}* · {alert['count']:,} overdue"
    lines = [head, cut(escape(alert["description"]), 1000)]
    if alert.get("link"):
        lines.append(f"<{alert['link']}|All of them>")
    keys = ", ".join(a["key"] for a in alert["first"])
    if keys:
        lines.append(f"First {alert['listed']}: `{_code(keys, TEXT_LIMIT)}`")
    return cut("\n".join(lines), TEXT_LIMIT)


def section(alert: dict[str, Any]) -> str:
    """One alert as mrkdwn, at most 3000 characters."""
    if is_summary(alert):
        return storm_section(alert)
    episode = f"episode {alert['episode']}"
    if is_resolved(alert):
        first = (
            f"{RESOLVED_ICON} *resolved* · *{escape(alert['rule'])}* · "
            f"key `{_code(alert['key'], 200)}`"
        )
        when = f"Ended by {alert['fired_at']} ({episode})"
    else:
        icon = ICONS.get(alert["severity"], ":grey_question:")
        first = (
            f"{icon} *{alert['severity']}* · *{escape(alert['rule'])}* · "
            f"key `{_code(alert['key'], 200)}`"
        )
        since = alert["due_at"] or alert["fired_at"]
        when = f"Overdue since {since} ({episode}, notification {alert['n']})"
    lines = [first, when]
    if alert.get("description"):
        lines.append(cut(escape(alert["description"]), 500))
    head = "\n".join(lines)
    row = json.dumps(alert.get("row"), default=str, ensure_ascii=False)
    # The head is at most about 900 characters (key 200, description 500): the row
    # gets the rest of the 3000.
    room = TEXT_LIMIT - len(head) - len("\n``````")
    return head + "\n```" + cut(escape(row.replace("```", "'''")), room) + "```"


def message(alerts: list[dict[str, Any]], listed: int) -> dict[str, Any]:
    """The incoming-webhook body for one batch: ``text`` and ``blocks``."""
    title = headline(alerts)
    shown = alerts[:listed]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title, "emoji": True}}
    ]
    blocks += [{"type": "section", "text": {"type": "mrkdwn", "text": section(a)}} for a in shown]
    rest = len(alerts) - len(shown)
    lines = [
        f"[storm] {a['rule']}: {a['count']:,} overdue"
        if is_summary(a)
        else f"[{'resolved' if is_resolved(a) else a['severity']}] {a['rule']} "
        f"key {cut(a['key'], 200)}"
        for a in shown
    ]
    if rest:
        more = f"+{rest} more in this batch, not listed"
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": more}]})
        lines.append(more)
    # `text` is what the notification (and a client without Block Kit) shows.
    text = cut(escape("\n".join([title, *lines])), TEXT_LIMIT)
    return {"text": text, "blocks": blocks}


class SlackNotifier(HttpNotifier):
    """POSTs one message per batch to a Slack incoming webhook; Slack answers 200 ``ok``."""

    def __init__(self, config: SlackConfig) -> None:
        super().__init__(config, config.ca_file)
        self.config = config
        self.url = config.url.get_secret_value()
        # The whole URL is the credential: errors show https://hooks.slack.com/… only.
        self.keep_target_secrets(self.url)

    def send(self, alerts: list[dict[str, Any]]) -> None:
        self.post(self.url, encode(message(alerts, self.config.listed)))
