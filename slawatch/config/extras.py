"""The optional parts of slawatch (``pip install 'slawatch[amqp]'``) and the one line
that names the extra a configuration needs but this install lacks."""

from __future__ import annotations

import importlib
from pathlib import Path

from slawatch.errors import ConfigError

# A notifier's or source's type -> (the module it needs, the extra that installs it).
BY_TYPE = {
    "amqp": ("pika", "amqp"),
    "redis": ("redis", "redis"),
    "nats": ("nats", "nats"),
    "kafka": ("confluent_kafka", "kafka"),
}


def require_extra(kind: str, path: Path) -> None:
    """ConfigError naming ``path`` and the extra when ``kind`` needs a module that does
    not import here. Imported, not just looked up: a broken install counts as missing,
    and the notifier or source imports it anyway once built."""
    if kind not in BY_TYPE:
        return
    module, extra = BY_TYPE[kind]
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{path}: type {kind} needs the {module} package, not installed:"
            f" pip install 'slawatch[{extra}]'"
        ) from None
