"""The workers of a notifier claiming for each other (dispatcher._Workers): how many
batches a claim leases, and which batch claimed ahead a worker may still send."""

from __future__ import annotations

import time
import uuid

from slawatch.config.notifiers import NatsConfig, WebhookConfig
from slawatch.delivery.dispatcher import _Batch, _Workers
from slawatch.delivery.notifiers import build


def webhook(timeout: str = "10s") -> _Workers:
    config = WebhookConfig(
        name="hook", type="webhook", url="http://127.0.0.1:9/hook", timeout=timeout
    )
    return _Workers(build(config), 4)


def batch() -> _Batch:
    return _Batch(uuid.uuid4(), [{"id": 1, "alert_id": 1}])


def test_a_claim_leases_a_batch_for_each_worker_without_one() -> None:
    group = webhook()
    assert group.reserve() == 4  # the first claim: one for each of the four workers
    assert group.reserve() == 1  # while it runs, three are on their way
    group.put(4, [batch(), batch()], time.monotonic() + 60)  # it found two more
    group.put(1, [], time.monotonic() + 60)
    assert group.reserve() == 2  # two waiting: the other two workers have none


def test_a_notifier_whose_send_may_outlast_its_timeout_claims_one_batch() -> None:
    config = NatsConfig(name="bus", type="nats", url="nats://127.0.0.1:9", subject="s")
    assert _Workers(build(config), 4).reserve() == 1


def test_a_batch_claimed_ahead_is_sent_only_with_a_whole_send_left_on_its_lease() -> None:
    group = webhook()
    stale, fresh = batch(), batch()
    now = time.monotonic()
    group.put(group.reserve(), [stale], now + 5)
    group.ready.append((now + 30, fresh))
    assert group.take(12.0) is fresh  # the stale one (5 s left) is dropped, not sent
    assert group.take(12.0) is None
