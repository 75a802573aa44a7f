"""The NATS notifier: JetStream publish, acknowledged, de-duplicated by alert id.

``Nats-Msg-Id`` is the alert id, so the stream drops a repeat that arrives
within its duplicate window. nats-py is asyncio: the notifier runs its own
event loop in a thread and keeps one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client

from slawatch.config.notifiers import NatsConfig
from slawatch.delivery.notifiers.base import BaseNotifier, encode, render
from slawatch.errors import DeliveryError


def stream_subjects(subject: str) -> list[str]:
    """The subjects a created stream should take: the template's fixed prefix + ``.>``."""
    prefix = subject.split("{", 1)[0].rstrip(".")
    return [f"{prefix}.>"] if prefix else [">"]


class NatsNotifier(BaseNotifier):
    def __init__(self, config: NatsConfig) -> None:
        super().__init__(config)
        self.config = config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"nats-{config.name}", daemon=True
        )
        self._thread.start()
        self._nc: Client | None = None

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.timeout * 3)

    async def _connect(self) -> Client:
        if self._nc is not None and self._nc.is_connected:
            return self._nc
        if self._nc is not None:
            await self._nc.close()
        # One attempt: nats-py's max_reconnect_attempts=0 means "try for ever" (a
        # coroutine left connecting, and logging, after send() gave up). The
        # dispatcher's backoff retries; the attempt's own error is what it reports.
        failures: list[Exception] = []

        async def failed(exc: Exception) -> None:
            failures.append(exc)

        try:
            nc = await nats.connect(
                self.config.url.get_secret_value(),
                connect_timeout=max(int(self.timeout), 1),
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                error_cb=failed,
            )
        except nats.errors.NoServersError as exc:
            raise (failures[-1] if failures else exc) from exc
        if self.config.stream:
            js = nc.jetstream(timeout=self.timeout)
            try:
                await js.stream_info(self.config.stream)
            except nats.js.errors.NotFoundError:
                await js.add_stream(
                    name=self.config.stream, subjects=stream_subjects(self.config.subject)
                )
        self._nc = nc
        return nc

    async def _publish(self, alerts: list[dict[str, Any]]) -> None:
        nc = await self._connect()
        js = nc.jetstream(timeout=self.timeout)
        acks = [
            js.publish(
                render(self.config.subject, alert),
                encode(alert),
                headers={"Nats-Msg-Id": alert["id"]},
            )
            for alert in alerts
        ]
        await asyncio.gather(*acks)  # each resolves on the stream's PubAck

    def send(self, alerts: list[dict[str, Any]]) -> None:
        try:
            self._run(self._publish(alerts))
        except nats.js.errors.NoStreamResponseError as exc:
            raise DeliveryError(
                f"no JetStream stream takes subject {render(self.config.subject, alerts[0])!r}"
            ) from exc
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            self._run_quietly(self._drop())
            raise DeliveryError(self.scrub(f"{type(exc).__name__}: {exc}")) from exc

    async def _drop(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None:
            await nc.close()

    def _run_quietly(self, coro: Any) -> None:
        with contextlib.suppress(Exception):  # a broken connection: nothing more to do
            self._run(coro)

    def close(self) -> None:
        self._run_quietly(self._drop())
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()
