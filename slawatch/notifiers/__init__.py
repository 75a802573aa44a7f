"""Notifiers: where alerts go. A notifier knows alerts (dicts), never SQL.

Each notifier file (``notifiers/<name>.yaml``) is validated into a config
model; :func:`build` turns a config into a sender with ``send(alerts)``, which
returns only when the receiver accepted every alert, and raises otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field

from slawatch.config import FileModel, load_dir


class Notifier(Protocol):
    """A configured destination for alerts."""

    name: str
    batch: int  # alerts per send

    def send(self, alerts: list[dict[str, Any]]) -> None:
        """Deliver all ``alerts``; raise on any failure."""

    def close(self) -> None:
        """Release connections."""


class ConsoleConfig(FileModel):
    """Prints one line per alert on standard output (for the demo and debugging)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    type: Literal["console"]
    batch: int = Field(default=100, ge=1, le=10_000)


NotifierConfig = ConsoleConfig


def load_notifiers(directory: Path) -> list[NotifierConfig]:
    """Load ``directory/*.yaml``; a missing folder means no notifiers."""
    if not directory.exists():
        return []
    return load_dir(directory, ConsoleConfig, "notifiers")


def build(config: NotifierConfig) -> Notifier:
    """The sender for one notifier config."""
    from slawatch.notifiers.console import ConsoleNotifier

    return ConsoleNotifier(config)
