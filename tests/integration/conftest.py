"""Fixtures for the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from slawatch.db import Database
from tests.integration.helpers import Conn, shop
from tests.receivers import WebhookReceiver

if TYPE_CHECKING:
    from tests.faultharness import FaultRun


@pytest.fixture(params=["inline", "table"])
def track(request: pytest.FixtureRequest) -> str:
    """Both ways to track (docs/explanation/tracking.md): a test that takes it runs once with each.
    A test of one way only overrides it with ``@pytest.mark.parametrize("track", [...])``."""
    return str(request.param)


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    """slawatch's pool on the test's database (two connections). A test module that needs
    another pool defines its own ``db``."""
    with Database(dsn, size=2, timeout=10) as d:
        yield d


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    """A real HTTP receiver in a thread (tests/receivers.py), closed afterwards."""
    with WebhookReceiver() as r:
        yield r


@pytest.fixture
def schema(conn: Conn) -> Conn:
    """The test's connection, with the demo shop's tables, migrated for the example rules
    (:func:`tests.integration.helpers.shop`)."""
    shop(conn)
    return conn


@pytest.fixture
def fault_runs() -> Iterator[list[FaultRun]]:
    """The fault harness's runs a test makes (tests/faultharness.py; test_faults.py,
    test_harness_checks.py), each closed afterwards whatever happened."""
    made: list[FaultRun] = []
    yield made
    for run in made:
        run.close()
