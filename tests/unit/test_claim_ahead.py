"""The workers of a notifier claiming for each other (dispatcher._Workers): how many
batches a claim leases, and which batch claimed ahead a worker may still send."""

from __future__ import annotations

import threading
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
    group.put(1, [], time.monotonic() + 60, True)
    group.put(4, [batch(), batch()], time.monotonic() + 60, True)  # it found two more
    assert group.reserve() == 2  # two waiting: the other two workers have none


def test_a_notifier_whose_send_may_outlast_its_timeout_claims_one_batch() -> None:
    config = NatsConfig(name="bus", type="nats", url="nats://127.0.0.1:9", subject="s")
    assert _Workers(build(config), 4).reserve() == 1


def test_a_batch_claimed_ahead_is_sent_only_with_a_whole_send_left_on_its_lease() -> None:
    group = webhook()
    stale, fresh = batch(), batch()
    now = time.monotonic()
    group.put(group.reserve(), [stale], now + 5, True)
    group.ready.append((now + 30, fresh))
    assert group.take(12.0, 1.0) == (fresh, False)  # the stale one (5 s left) is dropped
    assert group.take(12.0, 1.0) == (None, False)


def waiting_take(group: _Workers) -> tuple[threading.Thread, list[tuple[_Batch | None, bool]]]:
    """A worker's take in a thread, once it waits for the claim under way."""
    got: list[tuple[_Batch | None, bool]] = []
    worker = threading.Thread(target=lambda: got.append(group.take(12.0, 30.0)))
    worker.start()
    deadline = time.monotonic() + 30
    while group.promised != 1:
        assert time.monotonic() < deadline, "the worker never waited"
        time.sleep(0.01)
    return worker, got


def test_a_worker_waits_for_the_batch_a_claim_under_way_leases_for_it() -> None:
    group = webhook()
    reserved = group.reserve()  # a claim for four under way
    assert group.take(12.0, 30.0) == (None, False)  # one claim: another may run beside it
    other = group.reserve()  # a second (for one: three are on their way)
    worker, got = waiting_take(group)  # a third worker waits for theirs
    mine = batch()
    group.put(other, [], time.monotonic() + 60, True)
    group.put(reserved, [mine], time.monotonic() + 60, True)
    worker.join(30)
    assert got == [(mine, False)]


def test_a_worker_that_waited_for_a_claim_that_found_nothing_more_ends_its_pass() -> None:
    group = webhook()
    reserved, other = group.reserve(), group.reserve()
    worker, got = waiting_take(group)
    group.put(other, [], time.monotonic() + 60, True)
    group.put(reserved, [], time.monotonic() + 60, False)
    worker.join(30)
    assert got == [(None, True)]
