"""The notifiers' JSON encoder (slawatch/delivery/notifiers/base.py): orjson, with what
json.dumps wrote for values orjson would write its own way or refuses."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from slawatch.delivery.notifiers.base import encode

ALERT = {
    "id": "late:1:e1:n1",
    "status": "firing",
    "n": 1,
    "deadline": "2026-03-01T12:00:00Z",
    "row": {"id": 1, "total": 10.25, "paid": True, "note": None, "tags": ["a", "b"]},
}


def dumped(value: Any) -> bytes:
    """What encode() wrote before orjson."""
    return json.dumps(value, separators=(",", ":"), default=str).encode()


@dataclass
class Point:
    x: int


class Code(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"alerts": [ALERT, ALERT]},
        {"at": datetime(2026, 3, 1, 12, tzinfo=UTC)},  # str(), not orjson's isoformat
        {"amount": Decimal("12.50")},
        {"point": Point(1)},  # str(), not orjson's dict
        {"code": Code("x")},
        {"big": 2**70},  # orjson refuses integers over 64 bits
        {1: "a key that is not a string"},  # and keys that are not strings
        {"broken": "\udc80"},  # and strings that are not Unicode
    ],
    ids=repr,
)
def test_the_bytes_are_json_dumps_for_ascii_text(value: Any) -> None:
    assert encode(value) == dumped(value)


def test_other_text_is_utf8_and_reads_back_alike() -> None:
    value = {"row": {"name": "Zoë 東京 🚚"}}
    assert encode(value) == '{"row":{"name":"Zoë 東京 🚚"}}'.encode()
    assert json.loads(encode(value)) == json.loads(dumped(value))
