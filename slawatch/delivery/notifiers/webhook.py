"""The webhook notifier: one signed JSON POST per batch (Standard Webhooks).

``webhook-id`` is derived from the batch's alert ids, so a retried batch keeps
its id; each alert also carries its own idempotency ``id``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Any

from slawatch.config.notifiers import WebhookConfig
from slawatch.delivery.notifiers.base import encode
from slawatch.delivery.notifiers.http import HttpNotifier


def signing_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (``whsec_`` + base64)."""
    raw = secret.removeprefix("whsec_")
    return base64.b64decode(raw + "=" * (-len(raw) % 4))


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify(secret: str, headers: dict[str, str], body: bytes, tolerance: float = 300) -> bool:
    """What a receiver does: recompute the signature and compare in constant time.

    ``headers`` with lower-case names. Rejects timestamps more than ``tolerance``
    seconds away (replays).
    """
    try:
        msg_id, ts = headers["webhook-id"], int(headers["webhook-timestamp"])
        signatures = headers["webhook-signature"].split()
    except (KeyError, ValueError):
        return False
    if abs(time.time() - ts) > tolerance:
        return False
    expected = sign(signing_key(secret), msg_id, ts, body)
    return any(hmac.compare_digest(expected, s) for s in signatures)


class WebhookNotifier(HttpNotifier):
    """POSTs ``{"alerts": [...]}``; any 2xx accepts the whole batch."""

    def __init__(self, config: WebhookConfig) -> None:
        super().__init__(config, config.ca_file, config.headers)
        self.config = config
        self._key = signing_key(config.secret.get_secret_value()) if config.secret else None
        # The URL (its password, path and query) and every header value, since
        # they are where receivers want tokens (Authorization: Bearer ...).
        self.keep_target_secrets(config.url, config.headers)

    def send(self, alerts: list[dict[str, Any]]) -> None:
        body = encode({"alerts": alerts})
        ids = ",".join(sorted([a["id"] for a in alerts]))
        msg_id = "msg_" + hashlib.sha256(ids.encode()).hexdigest()[:32]
        headers = {"webhook-id": msg_id}
        if self._key is not None:
            ts = int(time.time())
            headers["webhook-timestamp"] = str(ts)
            headers["webhook-signature"] = sign(self._key, msg_id, ts, body)
        self.post(self.config.url, body, headers)
