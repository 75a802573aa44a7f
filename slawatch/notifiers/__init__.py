"""Notifiers: where alerts go. A notifier knows alerts (dicts), never SQL.

Each ``notifiers/<name>.yaml`` is validated into one of the config models
below (chosen by ``type``); :func:`build` turns a config into a sender whose
``send(alerts)`` returns only when the receiver accepted every alert, and
raises :class:`~slawatch.errors.DeliveryError` otherwise.

``${VAR}`` in any string value is replaced by the environment variable VAR
before validation; secrets (webhook ``secret``, SMTP ``password``, broker
URLs) are kept as ``SecretStr`` and never printed.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import string
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, cast

import httpx
from pydantic import BeforeValidator, Field, FilePath, SecretStr, field_validator, model_validator

from slawatch.config import FileModel, load_dir
from slawatch.durations import PositiveDuration
from slawatch.errors import ConfigError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
TEMPLATE_FIELDS = {"rule", "severity", "key", "n"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Notifier(Protocol):
    """A configured destination for alerts."""

    name: str
    batch: int  # alerts per send
    timeout: float  # seconds one send may take
    retry: RetrySettings

    def send(self, alerts: list[dict[str, Any]]) -> None:
        """Deliver all ``alerts`` or raise DeliveryError."""

    def close(self) -> None:
        """Release connections."""


class RetrySettings(FileModel):
    """Capped doubling backoff between attempts: ``min(first * 2^(attempt-1), max)``."""

    first: PositiveDuration = timedelta(seconds=1)
    max: PositiveDuration = timedelta(minutes=10)
    attempts: int = Field(default=12, ge=1, le=1000)

    def delay(self, attempt: int) -> timedelta:
        """The wait after failed attempt number ``attempt`` (1-based), before jitter."""
        return min(self.first * (1 << min(attempt - 1, 30)), self.max)


class _Base(FileModel):
    name: str = Field(pattern=NAME_PATTERN)
    batch: int = Field(default=100, ge=1, le=10_000)
    timeout: PositiveDuration = timedelta(seconds=10)
    retry: RetrySettings = RetrySettings()


def _template(value: str) -> str:
    fields = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
    unknown = fields - TEMPLATE_FIELDS
    if unknown:
        raise ValueError(
            f"unknown placeholder {{{sorted(unknown)[0]}}} "
            f"(use {', '.join('{' + f + '}' for f in sorted(TEMPLATE_FIELDS))})"
        )
    return value


Template = Annotated[str, BeforeValidator(_template)]


class ConsoleConfig(_Base):
    """Prints one line per alert on standard output (for the demo and debugging)."""

    type: Literal["console"]


class WebhookConfig(_Base):
    """``POST {"alerts": [...]}`` as JSON, signed per Standard Webhooks when a secret is set."""

    type: Literal["webhook"]
    url: str
    secret: SecretStr | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    ca_file: FilePath | None = None  # PEM bundle to trust for https (default: the system's)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"{v!r} is not an http:// or https:// URL")
        try:
            httpx.URL(v)
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a valid URL: {exc}") from exc
        return v

    @field_validator("secret")
    @classmethod
    def _secret(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            raw = v.get_secret_value().removeprefix("whsec_")
            try:
                key = base64.b64decode(raw + "==", validate=False)
                base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
            except (binascii.Error, ValueError):
                key = b""
            if not key:
                raise ValueError(
                    "must be a Standard Webhooks secret: 'whsec_' and base64 "
                    '(make one: python3 -c "import base64,os; '
                    "print('whsec_' + base64.b64encode(os.urandom(24)).decode())\")"
                )
        return v


class EmailConfig(_Base):
    """One digest e-mail per batch (plain text + HTML), over SMTP."""

    type: Literal["email"]
    host: str
    port: int | None = Field(default=None, ge=1, le=65535)
    security: Literal["starttls", "tls", "none"] = "starttls"
    username: str | None = None
    password: SecretStr | None = None
    from_: str = Field(alias="from")
    to: list[str] = Field(min_length=1)
    subject_prefix: str = "[slawatch]"
    ca_file: FilePath | None = None  # PEM bundle to trust for TLS (default: the system's)

    @model_validator(mode="after")
    def _auth_pair(self) -> EmailConfig:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        return self

    @property
    def effective_port(self) -> int:
        return self.port or {"starttls": 587, "tls": 465, "none": 25}[self.security]


class AmqpConfig(_Base):
    """RabbitMQ: one persistent message per alert, confirmed by the broker."""

    type: Literal["amqp"]
    url: SecretStr = SecretStr("amqp://guest:guest@127.0.0.1:5672/%2F")
    exchange: str = "slawatch"
    exchange_type: Literal["topic", "direct", "fanout", "headers"] = "topic"
    routing_key: Template = "{rule}.{severity}"
    declare: bool = True  # declare the exchange (durable) if it does not exist


class RedisConfig(_Base):
    """Redis Streams: one XADD per alert, trimmed to about ``maxlen`` entries."""

    type: Literal["redis"]
    url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    stream: Template = "slawatch:alerts"
    maxlen: int = Field(default=100_000, ge=1)


class NatsConfig(_Base):
    """NATS JetStream: one publish per alert with ``Nats-Msg-Id`` = the alert id."""

    type: Literal["nats"]
    url: SecretStr = SecretStr("nats://127.0.0.1:4222")
    subject: Template = "slawatch.{rule}.{severity}"
    stream: str | None = None  # created (subjects: the subject's prefix + ".>") if missing


NotifierConfig = ConsoleConfig | WebhookConfig | EmailConfig | AmqpConfig | RedisConfig | NatsConfig
_BY_TYPE: dict[str, type[FileModel]] = {
    "console": ConsoleConfig,
    "webhook": WebhookConfig,
    "email": EmailConfig,
    "amqp": AmqpConfig,
    "redis": RedisConfig,
    "nats": NatsConfig,
}


def interpolate(value: Any, path: Path, field: str = "") -> Any:
    """Replace ``${VAR}`` in every string with the environment's value."""
    if isinstance(value, str):

        def lookup(m: re.Match[str]) -> str:
            var = m.group(1)
            if var not in os.environ:
                raise ConfigError(
                    f"{path}: {field or 'value'}: environment variable {var} is not set"
                )
            return os.environ[var]

        return _VAR.sub(lookup, value)
    if isinstance(value, dict):
        return {
            k: interpolate(v, path, f"{field}.{k}" if field else str(k)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [interpolate(v, path, f"{field}.{i}") for i, v in enumerate(value)]
    return value


def load_notifiers(directory: Path) -> list[NotifierConfig]:
    """Load ``directory/*.yaml``; a missing folder means no notifiers."""
    if not directory.exists():
        return []
    configs = load_dir(directory, _model_for, "notifiers", prepare=interpolate)
    return cast(list[NotifierConfig], configs)


def _model_for(data: dict[str, Any], path: Path) -> type[FileModel]:
    """The config model for a file, by its ``type``; errors then name that model's fields."""
    kind = data.get("type")
    if kind not in _BY_TYPE:
        known = ", ".join(_BY_TYPE)
        got = "is required" if kind is None else f"{kind!r} is not a notifier type"
        raise ConfigError(f"{path}: type: {got} (one of {known})")
    return _BY_TYPE[kind]


def build(config: NotifierConfig) -> Notifier:
    """The sender for one notifier config."""
    if isinstance(config, ConsoleConfig):
        from slawatch.notifiers.console import ConsoleNotifier

        return ConsoleNotifier(config)
    if isinstance(config, WebhookConfig):
        from slawatch.notifiers.webhook import WebhookNotifier

        return WebhookNotifier(config)
    if isinstance(config, EmailConfig):
        from slawatch.notifiers.email import EmailNotifier

        return EmailNotifier(config)
    if isinstance(config, AmqpConfig):
        from slawatch.notifiers.amqp import AmqpNotifier

        return AmqpNotifier(config)
    if isinstance(config, RedisConfig):
        from slawatch.notifiers.redis import RedisNotifier

        return RedisNotifier(config)
    from slawatch.notifiers.nats import NatsNotifier

    return NatsNotifier(config)
