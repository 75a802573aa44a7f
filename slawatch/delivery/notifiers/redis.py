"""The Redis notifier: one XADD per alert into a stream, trimmed approximately."""

from __future__ import annotations

from typing import Any

import redis
import redis.exceptions

from slawatch.config.notifiers import RedisConfig
from slawatch.delivery.notifiers.base import BaseNotifier, encode, render
from slawatch.errors import DeliveryError


class RedisNotifier(BaseNotifier):
    def __init__(self, config: RedisConfig) -> None:
        super().__init__(config)
        self.config = config
        self._client: redis.Redis = redis.Redis.from_url(
            config.url.get_secret_value(),
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
        )

    def send(self, alerts: list[dict[str, Any]]) -> None:
        try:
            # One round trip; MULTI/EXEC so the batch is all in or all out.
            pipe = self._client.pipeline(transaction=True)
            for alert in alerts:
                pipe.xadd(
                    render(self.config.stream, alert),
                    {"id": alert["id"], "rule": alert["rule"], "alert": encode(alert)},
                    maxlen=self.config.maxlen,
                    approximate=True,
                )
            ids = pipe.execute()
        except redis.exceptions.RedisError as exc:
            raise DeliveryError(self.scrub(f"{type(exc).__name__}: {exc}")) from exc
        if len(ids) != len(alerts) or not all(ids):
            raise DeliveryError(f"redis accepted {len(ids)} of {len(alerts)} entries")

    def close(self) -> None:
        self._client.close()
