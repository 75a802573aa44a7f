"""The Opsgenie notifier: Alert API v2, one request per alert, an Opsgenie alert per episode.

``alias`` is the episode, ``{rule}:{key}:e{episode}``: Opsgenie keeps one open
alert per alias, so a re-notification of the episode only raises the open
alert's count (no second page), and the episode's resolved notice closes it
(``POST /v2/alerts/{alias}/close?identifierType=alias``). The priority comes
from the severity (``priorities``; critical P1, warning P3, info P5 by default).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any
from urllib.parse import quote

from slawatch.config.notifiers import OpsgenieConfig
from slawatch.delivery.notifiers.base import cut, encode, is_resolved, is_summary
from slawatch.delivery.notifiers.http import HttpNotifier, endpoint

# Opsgenie's limits, in characters.
MESSAGE_LIMIT = 130
ALIAS_LIMIT = 512
DESCRIPTION_LIMIT = 15_000
ENTITY_LIMIT = 512
TAG_LIMIT = 50
DETAILS_LIMIT = 8000  # all keys and values together


def alias(alert: dict[str, Any]) -> str:
    """``order_unshipped:1042:e1``: the same for every notification of an episode and
    for its resolved notice; a key too long for 512 characters is hashed. A storm
    summary is an alert of its own: its id."""
    if is_summary(alert):
        return str(alert["id"])
    text = f"{alert['rule']}:{alert['key']}:e{alert['episode']}"
    if len(text) <= ALIAS_LIMIT:
        return text
    digest = hashlib.sha256(alert["key"].encode()).hexdigest()
    return f"{alert['rule']}:sha256-{digest}:e{alert['episode']}"


def _details(alert: dict[str, Any]) -> dict[str, str]:
    """Custom properties, a map of strings at most 8000 characters in all: each field
    cut at 500 characters, the last (the row; a summary's listed alert ids) cut to
    what is left."""
    if is_summary(alert):
        fields = {k: str(alert.get(k)) for k in ("id", "rule", "count", "since")}
        last = ("first", ", ".join(a["id"] for a in alert["first"]))
    else:
        fields = {k: str(alert.get(k)) for k in ("id", "rule", "key", "episode", "n")}
        fields |= {k: str(alert.get(k)) for k in ("deadline", "due_at")}
        last = ("row", json.dumps(alert.get("row"), default=str, ensure_ascii=False))
    out = {name: cut(value, 500) for name, value in fields.items()}
    used = sum(len(k) + len(v) for k, v in out.items()) + len(last[0])
    out[last[0]] = cut(last[1], DETAILS_LIMIT - used)
    return out


def create(alert: dict[str, Any], config: OpsgenieConfig) -> dict[str, Any]:
    """The create-alert body for one notification (or storm summary)."""
    if is_summary(alert):
        message = f"{alert['rule']}: {alert['count']:,} overdue (storm)"
        description = str(alert["description"])
        if alert.get("link"):
            description += f"\nAll of them: {alert['link']}"
    else:
        message = f"{alert['rule']}: key {alert['key']} overdue"
        since = alert["due_at"] or alert["fired_at"]
        description = (
            f"Overdue since {since} (episode {alert['episode']}, notification {alert['n']})"
        )
        if alert.get("description"):
            description += f"\n{alert['description']}"
        row = json.dumps(alert.get("row"), default=str, ensure_ascii=False)
        description += f"\n{row}"
    tags = ["slawatch", cut(alert["rule"], TAG_LIMIT), alert["severity"], *config.tags]
    if is_summary(alert):
        tags.append("storm")
    return {
        "message": cut(message, MESSAGE_LIMIT),
        "alias": alias(alert),
        "description": cut(description, DESCRIPTION_LIMIT),
        "priority": config.priorities.get(alert["severity"], "P3"),
        "source": config.source_,
        "entity": cut(alert["rule"], ENTITY_LIMIT),
        "tags": list(dict.fromkeys(tags)),
        "details": _details(alert),
    }


class OpsgenieNotifier(HttpNotifier):
    """POSTs each alert of a batch to ``{url}/v2/alerts`` (or its close); Opsgenie
    answers 202 and processes the request later."""

    def __init__(self, config: OpsgenieConfig) -> None:
        key = config.api_key.get_secret_value()
        super().__init__(config, config.ca_file, headers={"authorization": f"GenieKey {key}"})
        self.config = config
        self.url = endpoint(config.url, "/v2/alerts")
        # A URL through a proxy may carry credentials; the key is scrubbed as a
        # SecretStr of the config already.
        self.keep_url_secrets(config.url)

    def request(self, alert: dict[str, Any]) -> tuple[str, bytes]:
        """Where and what to POST for one alert: a create, or the episode's close."""
        if is_resolved(alert):
            # The alias may hold '/', '?' or '#' (a row's key): one path segment.
            where = f"{self.url}/{quote(alias(alert), safe='')}/close?identifierType=alias"
            note = f"Resolved: episode over by {alert['fired_at']}"
            return where, encode({"source": self.config.source_, "note": note})
        return self.url, encode(create(alert, self.config))

    def send(self, alerts: list[dict[str, Any]]) -> None:
        # Creates before closes: a close sent first would leave the create after it
        # to open the episode's alert again.
        ordered = sorted(alerts, key=is_resolved)
        self.post_each([self.request(a) for a in ordered], [str(a["id"]) for a in ordered])
