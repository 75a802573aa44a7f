"""A notifier's ``concurrency``: batches in flight at once, bounded, 4 by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from slawatch.config.notifiers import WebhookConfig
from tests.unit.test_notifier_config import error_of, load

HOOK = "type: webhook\nurl: http://127.0.0.1:9/hook\n"


def test_four_batches_in_flight_unless_told() -> None:
    config = WebhookConfig(name="hook", type="webhook", url="http://127.0.0.1:9/hook")
    assert config.concurrency == 4
    assert config.model_copy(update={"concurrency": 1}).concurrency == 1


def test_a_given_concurrency_is_kept(tmp_path: Path) -> None:
    (config,) = load(tmp_path, HOOK + "concurrency: 16\n")
    assert getattr(config, "concurrency", None) == 16


@pytest.mark.parametrize("value", ["0", "17", "-1", "lots", "2.5"])
def test_a_concurrency_out_of_bounds_is_one_line_naming_file_and_field(
    tmp_path: Path, value: str
) -> None:
    message = error_of(tmp_path, HOOK + f"concurrency: {value}\n")
    assert "hook.yaml" in message and "concurrency" in message
    assert "\n" not in message
