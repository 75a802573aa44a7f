"""The PagerDuty notifier: Events API v2, one event per alert, an incident per episode.

``dedup_key`` is the episode, ``{rule}:{key}:e{episode}``, not the notification's
id: PagerDuty keeps one open incident per dedup_key, so a re-notification of the
episode adds an alert to the incident already open (instead of paging again for
the same row), and the episode's resolved notice (``event_action: resolve``)
closes it. Repeats of the same event are harmless for the same reason.
"""

from __future__ import annotations

import hashlib
from typing import Any

from slawatch.config.notifiers import PagerDutyConfig
from slawatch.delivery.notifiers.base import cut, encode, is_resolved, is_summary
from slawatch.delivery.notifiers.http import HttpNotifier, endpoint

SUMMARY_LIMIT = 1024
DEDUP_LIMIT = 255
# slawatch's severities are PagerDuty's, less "error".
SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


def dedup_key(alert: dict[str, Any]) -> str:
    """``order_unshipped:1042:e1``: the same for every notification of an episode and
    for its resolved notice. A key too long for PagerDuty's 255 characters is hashed.
    A storm summary is an incident of its own: its id (``rule:storm:notifier:first``)."""
    if is_summary(alert):
        return str(alert["id"])  # at most 40 + 6 + 63 + 20 characters
    key = f"{alert['rule']}:{alert['key']}:e{alert['episode']}"
    if len(key) <= DEDUP_LIMIT:
        return key
    digest = hashlib.sha256(alert["key"].encode()).hexdigest()
    return f"{alert['rule']}:sha256-{digest}:e{alert['episode']}"


def summary(alert: dict[str, Any]) -> str:
    """What the incident's title says, at most 1024 characters."""
    if is_summary(alert):
        text = str(alert["description"])
        return cut(text, SUMMARY_LIMIT)
    key = cut(alert["key"], 200)
    since = alert["due_at"] or alert["fired_at"]
    text = f"{alert['rule']}: key {key} overdue since {since}"
    if alert.get("description"):
        text += f" ({alert['description']})"
    return cut(text, SUMMARY_LIMIT)


def event(alert: dict[str, Any], routing_key: str, source: str) -> dict[str, Any]:
    """The Events API v2 body for one alert: a trigger, or a resolve for a resolved notice."""
    if is_resolved(alert):
        return {
            "routing_key": routing_key,
            "event_action": "resolve",
            "dedup_key": dedup_key(alert),
        }
    details = {
        k: alert.get(k)
        for k in ("id", "rule", "key", "episode", "n", "deadline", "due_at", "description", "row")
    }
    links = []
    if is_summary(alert):
        # PagerDuty keeps 512 KB of details: the listed alerts by id, not whole.
        details = {k: alert.get(k) for k in ("id", "rule", "count", "since", "description")}
        details["first"] = [a["id"] for a in alert["first"]]
        if alert.get("link"):
            links = [{"href": alert["link"], "text": f"All {alert['count']:,} alerts"}]
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key(alert),
        "client": "slawatch",
        "payload": {
            "summary": summary(alert),
            "source": source,
            "severity": SEVERITY.get(alert["severity"], "error"),
            "timestamp": alert["fired_at"],
            "component": alert["rule"],
            "class": "storm" if is_summary(alert) else "overdue",
            "custom_details": details,
        },
    }
    if links:
        body["links"] = links
    return body


class PagerDutyNotifier(HttpNotifier):
    """POSTs each alert of a batch to ``{base_url}/v2/enqueue``; PagerDuty answers 202."""

    def __init__(self, config: PagerDutyConfig) -> None:
        super().__init__(config, config.ca_file)
        self.config = config
        self.url = endpoint(config.base_url, "/v2/enqueue")
        # A base URL may carry a proxy's credentials: errors must not show them.
        self.keep_url_secrets(config.base_url)
        self._routing_key = config.routing_key.get_secret_value()

    def send(self, alerts: list[dict[str, Any]]) -> None:
        # Triggers before resolves: a resolve sent first would leave the trigger
        # after it to open the episode's incident again.
        ordered = sorted(alerts, key=is_resolved)
        bodies = [event(a, self._routing_key, self.config.source_) for a in ordered]
        self.post_each(
            [(self.url, encode(b)) for b in bodies], [str(a["id"]) for a in ordered], "event"
        )
