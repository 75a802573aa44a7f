"""What the notifiers share: payload encoding, secret scrubbing, error wording."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from slawatch.notifiers import RetrySettings, _Base


class BaseNotifier:
    """Holds the settings every notifier has; subclasses implement ``send``."""

    def __init__(self, config: _Base) -> None:
        self.name = config.name
        self.batch = config.batch
        self.timeout = config.timeout.total_seconds()
        self.retry: RetrySettings = config.retry
        # Every secret value of the config: scrubbed from any error text we keep or log.
        self._secrets = [
            v.get_secret_value()
            for v in config.__dict__.values()
            if isinstance(v, SecretStr) and v.get_secret_value()
        ]

    def scrub(self, text: str) -> str:
        """``text`` with every secret of this notifier replaced by ``***``."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def close(self) -> None:
        pass


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """Certificate-verifying TLS, trusting ``ca_file`` instead of the system's CAs if given."""
    return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)


def encode(alert: dict[str, Any]) -> bytes:
    """One alert as compact JSON."""
    return json.dumps(alert, separators=(",", ":"), default=str).encode()


def render(template: str, alert: dict[str, Any]) -> str:
    """A routing key, stream or subject from a template with {rule} {severity} {key} {n}."""
    return template.format(
        rule=alert["rule"], severity=alert["severity"], key=alert["key"], n=alert["n"]
    )
