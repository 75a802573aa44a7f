"""slawatch: alerts for things that did not happen in time, found in PostgreSQL."""

from __future__ import annotations

__version__ = "0.1.0"
