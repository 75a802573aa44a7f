"""Fixtures for the integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["inline", "table"])
def track(request: pytest.FixtureRequest) -> str:
    """Both ways to track (docs/explanation/tracking.md): a test that takes it runs once with each.
    A test of one way only overrides it with ``@pytest.mark.parametrize("track", [...])``."""
    return str(request.param)
