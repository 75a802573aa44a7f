"""slawatch/logs.py: the JSON formatter and the choice of format."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from slawatch.logs import JsonFormatter, setup


def record(**extra: object) -> logging.LogRecord:
    rec = logging.LogRecord(
        "slawatch.runtime.scheduler",
        logging.INFO,
        __file__,
        1,
        "rule %s: %d claimed",
        ("late", 3),
        None,
    )
    rec.__dict__.update(extra)
    return rec


def test_a_json_line_has_the_fields_and_the_extras() -> None:
    line = JsonFormatter().format(record(rule="late", claimed=3, where=Path("/x")))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "INFO" and doc["logger"] == "slawatch.runtime.scheduler"
    assert doc["message"] == "rule late: 3 claimed"
    assert doc["time"].endswith("Z") and doc["time"][10] == "T"
    assert (doc["rule"], doc["claimed"], doc["where"]) == ("late", 3, "/x")
    # Nothing of LogRecord's own attributes besides.
    assert set(doc) == {"time", "level", "logger", "message", "rule", "claimed", "where"}


def test_a_traceback_stays_on_the_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    doc = json.loads(JsonFormatter().format(rec))
    assert "RuntimeError: boom" in doc["exc"] and doc["message"] == "failed"


@pytest.mark.parametrize(("fmt", "is_json"), [("json", True), ("text", False), ("auto", True)])
def test_the_format_follows_the_setting(
    fmt: str, is_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []  # basicConfig configures only a root without handlers
    try:
        setup("INFO", fmt)  # type: ignore[arg-type]
        logging.getLogger("slawatch.test").info("hello %s", "there", extra={"rule": "late"})
    finally:
        root.handlers = handlers
        root.setLevel(level)
    err = capsys.readouterr().err.strip()
    if is_json:  # "auto": pytest's captured stderr is no terminal
        assert json.loads(err)["rule"] == "late"
    else:
        assert err.endswith("INFO slawatch.test: hello there")
