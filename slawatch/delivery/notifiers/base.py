"""What the notifiers share: payload encoding, secret scrubbing, error wording."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import orjson
from pydantic import SecretStr

from slawatch.config.notifiers import NotifierBase, RetrySettings, StormSettings
from slawatch.config.notifiers import tls_context as tls_context  # the notifiers' import


class BaseNotifier:
    """Holds the settings every notifier has; subclasses implement ``send``."""

    def __init__(self, config: NotifierBase) -> None:
        self.name = config.name
        self.batch = config.batch
        self.timeout = config.timeout.total_seconds()
        self.retry: RetrySettings = config.retry
        self.storm: StormSettings | None = config.storm
        # Every secret of the config, scrubbed from any error text we keep or log:
        # SecretStr values, and the passwords and query values of URLs in them.
        self._secrets: dict[str, str] = {}
        for value in config.__dict__.values():
            if isinstance(value, SecretStr):
                secret = value.get_secret_value()
                self.keep_secret(secret)
                if "://" in secret:
                    self.keep_url_secrets(secret)

    def keep_secret(self, secret: str, shown: str = "***") -> None:
        """Scrub ``secret`` (and its percent-decoded form) as ``shown`` from now on."""
        # Too short to be a secret, and replacing it would garble every message.
        for form in (secret, unquote(secret)):
            if len(form) >= 4:
                self._secrets.setdefault(form, shown)

    def keep_url_secrets(self, url: str) -> None:
        """Keep the parts of ``url`` that are secret: the password in its userinfo (or
        a userinfo without one: a token) and the values of its query."""
        try:
            parts = urlsplit(url)
            password = parts.password
        except ValueError:  # unparsable: the whole URL is kept already, if a secret
            return
        if password:
            self.keep_secret(password)
        elif parts.username:  # nats://TOKEN@host, redis://PASSWORD@host: a bare secret
            self.keep_secret(parts.username)
        for _, value in parse_qsl(parts.query, keep_blank_values=False):
            self.keep_secret(value)

    def scrub(self, text: str) -> str:
        """``text`` with every secret of this notifier replaced by ``***`` (or its
        public form, e.g. a webhook URL as ``scheme://host:port/…``)."""
        # Longest first: a whole URL goes before the password inside it.
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, self._secrets[secret])
        return text

    def close(self) -> None:
        pass


def number(alert: dict[str, Any]) -> str:
    """How a person reads the notification: ``#3``, ``resolved`` for the notice that
    a notified episode ended, ``storm`` for a storm summary."""
    if alert.get("status") in ("resolved", "summary"):
        return "storm" if is_summary(alert) else "resolved"
    return f"#{alert['n']}"


# What orjson would write its own way goes to ``default=str`` instead, as with json.dumps:
# a datetime as str() gives it, a dataclass as its text.
_AS_BEFORE = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def encode(value: Any) -> bytes:
    """An alert (or a message of alerts) as compact JSON, in UTF-8.

    orjson (a tenth of json.dumps' time for a batch of alerts); what it refuses
    (an integer over 64 bits, a key that is not a string) goes through json.dumps."""
    try:
        return orjson.dumps(value, default=str, option=_AS_BEFORE)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value, separators=(",", ":"), default=str).encode()


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, an ellipsis ending what was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render(template: str, alert: dict[str, Any]) -> str:
    """A routing key, stream or subject from a template with {rule} {severity} {key} {n}."""
    return template.format(
        rule=alert["rule"], severity=alert["severity"], key=alert["key"], n=alert["n"]
    )


def is_summary(alert: dict[str, Any]) -> bool:
    """A storm summary (slawatch/delivery/storm.py): ``count`` alerts of one rule sent as one;
    ``first`` holds the first ``listed`` of them, ``description`` says it in words."""
    return bool(alert.get("status") == "summary")


def is_resolved(alert: dict[str, Any]) -> bool:
    """A resolved notice (the episode ended), not a notification of an overdue row.
    Alerts from before the ``status`` field are notifications."""
    return bool(alert.get("status", "firing") == "resolved")
