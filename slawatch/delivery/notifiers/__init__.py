"""Notifiers: where alerts go. A notifier knows alerts (dicts), never SQL.

:func:`build` turns a notifier config (:mod:`slawatch.config.notifiers`) into a
sender whose ``send(alerts)`` returns only when the receiver accepted every
alert, and raises :class:`~slawatch.errors.DeliveryError` otherwise.
"""

from __future__ import annotations

from typing import Any, Protocol

from slawatch.config.notifiers import (
    AmqpConfig,
    ConsoleConfig,
    EmailConfig,
    KafkaConfig,
    NatsConfig,
    NotifierConfig,
    OpsgenieConfig,
    PagerDutyConfig,
    RedisConfig,
    RetrySettings,
    SlackConfig,
    StormSettings,
    TeamsConfig,
    WebhookConfig,
)


class Notifier(Protocol):
    """A configured destination for alerts."""

    name: str
    batch: int  # alerts per send
    timeout: float  # seconds one send may take
    retry: RetrySettings
    storm: StormSettings | None  # None: every alert is sent, however many

    def send(self, alerts: list[dict[str, Any]]) -> None:
        """Deliver all ``alerts`` or raise DeliveryError."""

    def scrub(self, text: str) -> str:
        """``text`` without this notifier's secrets, for error text we keep or log."""

    def close(self) -> None:
        """Release connections."""


# Each backend is imported when a notifier of its type is built: a process that
# sends no e-mail or queue messages never loads smtplib, pika, redis, nats or confluent_kafka.
def build(config: NotifierConfig) -> Notifier:
    """The sender for one notifier config."""
    if isinstance(config, ConsoleConfig):
        from slawatch.delivery.notifiers.console import ConsoleNotifier

        return ConsoleNotifier(config)
    if isinstance(config, WebhookConfig):
        from slawatch.delivery.notifiers.webhook import WebhookNotifier

        return WebhookNotifier(config)
    if isinstance(config, EmailConfig):
        from slawatch.delivery.notifiers.email import EmailNotifier

        return EmailNotifier(config)
    if isinstance(config, AmqpConfig):
        from slawatch.delivery.notifiers.amqp import AmqpNotifier

        return AmqpNotifier(config)
    if isinstance(config, RedisConfig):
        from slawatch.delivery.notifiers.redis import RedisNotifier

        return RedisNotifier(config)
    if isinstance(config, NatsConfig):
        from slawatch.delivery.notifiers.nats import NatsNotifier

        return NatsNotifier(config)
    if isinstance(config, KafkaConfig):
        from slawatch.delivery.notifiers.kafka import KafkaNotifier

        return KafkaNotifier(config)
    if isinstance(config, SlackConfig):
        from slawatch.delivery.notifiers.slack import SlackNotifier

        return SlackNotifier(config)
    if isinstance(config, PagerDutyConfig):
        from slawatch.delivery.notifiers.pagerduty import PagerDutyNotifier

        return PagerDutyNotifier(config)
    if isinstance(config, TeamsConfig):
        from slawatch.delivery.notifiers.teams import TeamsNotifier

        return TeamsNotifier(config)
    if isinstance(config, OpsgenieConfig):
        from slawatch.delivery.notifiers.opsgenie import OpsgenieNotifier

        return OpsgenieNotifier(config)
    from slawatch.delivery.notifiers.alertmanager import AlertmanagerNotifier

    return AlertmanagerNotifier(config)
