"""Which event a ping sends (slawatch/operate/api/events.py), and what it keeps."""

from __future__ import annotations

import orjson
import pytest

from slawatch.config.rules import Events
from slawatch.events.ingest import MAX_DATA
from slawatch.operate.api.events import ping_data, ping_type

KEY = {"key": "5f0c2b9e-81d4-4a7c-9b3e-2d6f1a8c4e70"}
RUN = Events.model_validate(
    {"start": "began", "stop": "ended", "fail": "failed", "within": "10m", "ping": KEY}
)
BEAT = Events.model_validate({"beat": "beat", "fail": "failed", "within": "1h", "ping": KEY})


@pytest.mark.parametrize(
    ("action", "run", "beat"),
    [
        ("", "ended", "beat"),
        ("0", "ended", "beat"),
        ("start", "began", None),
        ("log", None, None),
        ("fail", "failed", "failed"),
        ("1", "failed", "failed"),
        ("255", "failed", "failed"),
    ],
)
def test_each_action_sends_its_event(action: str, run: str | None, beat: str | None) -> None:
    assert ping_type(RUN, action) == run
    assert ping_type(BEAT, action) == beat


@pytest.mark.parametrize("action", ["256", "1000", "-1", "²", "\u0661", "stop", "FAIL", "success"])
def test_anything_else_is_unknown(action: str) -> None:
    with pytest.raises(ValueError):
        ping_type(RUN, action)


def test_the_data_keeps_the_exit_status_the_run_id_and_what_fits_of_the_body() -> None:
    assert ping_data(b"", "3", "r-1") == {"exit_status": 3, "rid": "r-1"}
    assert ping_data(b"ok\x00\xff", "", None) == {"body": "ok\ufffd\ufffd"}
    big = ping_data(b"\x01" * 100_000, "fail", None)  # each byte 6 characters as JSON
    assert big["body_truncated"] is True
    assert len(orjson.dumps(big)) <= MAX_DATA
