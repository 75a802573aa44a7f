"""Which notifiers post over HTTP, and where: what `check` compares with slawatch's own
admin API (runtime/boot.check_not_own_api)."""

from __future__ import annotations

from typing import Any

import pytest

from slawatch.config.notifiers import (
    AlertmanagerConfig,
    AmqpConfig,
    ConsoleConfig,
    EmailConfig,
    OpsgenieConfig,
    PagerDutyConfig,
    SlackConfig,
    TeamsConfig,
    WebhookConfig,
)

URL = "http://127.0.0.1:8181/in"


@pytest.mark.parametrize(
    ("model", "fields", "target"),
    [
        (WebhookConfig, {"type": "webhook", "url": URL}, ("url", URL)),
        (AlertmanagerConfig, {"type": "alertmanager", "url": URL}, ("url", URL)),
        (OpsgenieConfig, {"type": "opsgenie", "url": URL, "api_key": "k" * 32}, ("url", URL)),
        (SlackConfig, {"type": "slack", "url": URL}, ("url", URL)),
        (TeamsConfig, {"type": "teams", "url": URL}, ("url", URL)),
        (
            PagerDutyConfig,
            {"type": "pagerduty", "base_url": "http://127.0.0.1:8181", "routing_key": "r" * 32},
            ("base_url", "http://127.0.0.1:8181"),
        ),
        (ConsoleConfig, {"type": "console"}, None),
        (AmqpConfig, {"type": "amqp"}, None),
        (
            EmailConfig,
            {"type": "email", "host": "127.0.0.1", "from": "a@example.com", "to": ["b@x.org"]},
            None,
        ),
    ],
)
def test_each_http_notifier_names_where_it_posts(
    model: Any, fields: dict[str, Any], target: tuple[str, str] | None
) -> None:
    config = model.model_validate({"name": "n", **fields})
    assert config.http_target() == target
