"""The Alertmanager notifier: ``POST {url}/api/v2/alerts``, a list of postable alerts.

Alertmanager identifies an alert by its labels. slawatch's are ``alertname``
(the rule), ``rule``, ``key``, ``episode`` and ``severity`` (plus the configured
``labels``): one Alertmanager alert per episode of a row, so re-notifications
update it and its grouping, inhibition and silences apply as to any other alert.
A notification number is no label (``n`` is an annotation), or each
re-notification would be a new alert.

Alertmanager expects its clients to re-send active alerts; an alert not heard
of again ends at its ``endsAt``. slawatch sends one notice per notification, so
a firing notice sets ``endsAt`` ``firing_for`` (24h) ahead, and a resolved
notice sets it to when the episode was found ended: Alertmanager resolves it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from slawatch.config.notifiers import AlertmanagerConfig
from slawatch.delivery.notifiers.base import cut, encode, is_resolved, is_summary
from slawatch.delivery.notifiers.http import HttpNotifier, endpoint

# A row is an annotation for people to read, not a store: a huge one is cut.
ROW_LIMIT = 8192


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def postable(
    alert: dict[str, Any],
    now: datetime,
    firing_for: timedelta,
    extra_labels: dict[str, str] | None = None,
    generator_url: str | None = None,
) -> dict[str, Any]:
    """One slawatch alert as an Alertmanager ``postableAlert``."""
    if is_summary(alert):
        return _storm(alert, now, firing_for, extra_labels, generator_url)
    labels = {
        **(extra_labels or {}),
        "alertname": alert["rule"],
        "rule": alert["rule"],
        "key": alert["key"],
        "episode": str(alert["episode"]),
        "severity": alert["severity"],
    }
    row = json.dumps(alert.get("row"), default=str, ensure_ascii=False)
    since = alert["due_at"] or alert["fired_at"]
    annotations = {
        "summary": f"{alert['rule']}: key {alert['key']} overdue since {since}",
        "description": alert.get("description") or f"{alert['rule']} is overdue",
        "id": alert["id"],
        "n": str(alert["n"]),
        "row": cut(row, ROW_LIMIT),
    }
    # Annotations are strings; a deadline of -infinity has none.
    annotations |= {k: alert[k] for k in ("deadline", "due_at") if alert.get(k)}
    if is_resolved(alert):
        # The claim that found the episode over is its end.
        ends = _parse(alert["fired_at"])
        annotations["summary"] = f"{alert['rule']}: key {alert['key']} no longer overdue"
    else:
        ends = now + firing_for
    # The episode began when the row fell due: every notice of it starts there.
    starts = min(_parse(since), ends)
    body: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(starts),
        "endsAt": _iso(ends),
    }
    if generator_url:
        body["generatorURL"] = generator_url.format(
            **{f: quote(str(alert[f]), safe="") for f in ("rule", "severity", "key", "n")}
        )
    return body


def _storm(
    alert: dict[str, Any],
    now: datetime,
    firing_for: timedelta,
    extra_labels: dict[str, str] | None,
    generator_url: str | None,
) -> dict[str, Any]:
    """A storm summary as one alert of its own: labelled by rule and ``storm`` (its
    key, ``storm:<notifier>:<first alert id>``), not by row; the keys it stands for are
    an annotation."""
    labels = {
        **(extra_labels or {}),
        "alertname": alert["rule"],
        "rule": alert["rule"],
        "storm": alert["key"],
        "severity": alert["severity"],
    }
    keys = json.dumps([a["key"] for a in alert["first"]], ensure_ascii=False)
    annotations = {
        "summary": f"{alert['rule']}: {alert['count']:,} overdue (storm)",
        "description": alert["description"],
        "id": alert["id"],
        "count": str(alert["count"]),
        "first": cut(keys, ROW_LIMIT),
    }
    ends = now + firing_for
    body: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(min(_parse(alert["since"]), ends)),
        "endsAt": _iso(ends),
    }
    # The list of its alerts is where a person goes from it; else the configured link.
    link = alert.get("link") or (
        generator_url.format(
            **{f: quote(str(alert[f]), safe="") for f in ("rule", "severity", "key", "n")}
        )
        if generator_url
        else None
    )
    if link:
        body["generatorURL"] = link
    return body


class AlertmanagerNotifier(HttpNotifier):
    """POSTs a batch as one list; Alertmanager answers 200 (400 if any alert is invalid)."""

    def __init__(self, config: AlertmanagerConfig) -> None:
        super().__init__(config, config.ca_file, config.headers)
        self.config = config
        self.url = endpoint(config.url, "/api/v2/alerts")
        self.keep_target_secrets(config.url, config.headers)
        self.keep_target_secrets(self.url)

    def send(self, alerts: list[dict[str, Any]]) -> None:
        now = datetime.now(UTC)
        # Firing before resolved: Alertmanager merges a list in order, so a firing
        # notice after the resolved one of its episode would open it again.
        ordered = sorted(alerts, key=is_resolved)
        body = [
            postable(a, now, self.config.firing_for, self.config.labels, self.config.generator_url)
            for a in ordered
        ]
        self.post(self.url, encode(body))
