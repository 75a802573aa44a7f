"""Keys and values reach terminals and logs with their control characters written out:
the console notifier's lines and both log formats (slawatch/logs.py). A key that came
in a row or an event cannot retitle or clear a terminal, ring it, or forge a line."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from typing import Any

import pytest

from slawatch.config.notifiers import ConsoleConfig
from slawatch.delivery.notifiers.console import ConsoleNotifier
from slawatch.logs import JsonFormatter, TextFormatter, printable, setup

OSC = "\x1b]0;pwned\x07"  # retitles the terminal
CLEAR = "\x1b[2J\x1b[H"  # clears the screen
FORGED = "\r\n2026-11-27 10:00:00,000 INFO slawatch.activity: all good"
CSI = "\x9b2J"  # C1: a UTF-8 terminal may take it as ESC [
NASTY = f"k{OSC}{CLEAR}{FORGED}{CSI}\x00\x7f"
# No C0 but the line's own end, no DEL, no C1.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def alert(**more: Any) -> dict[str, Any]:
    return {
        "severity": "warning",
        "rule": "late",
        "n": 1,
        "key": NASTY,
        "due_at": "2026-11-27T10:00:00Z",
        "row": {"id": NASTY},
    } | more


def test_printable_writes_control_characters_out() -> None:
    assert printable("a\x1bb\x07c\r\nd\te\x9bf\x7fg") == "a\\x1bb\\x07c\\r\\nd\\te\\x9bf\\x7fg"
    assert printable("plain text, ünïcode, tabs\\x1b as written") == (
        "plain text, ünïcode, tabs\\x1b as written"
    )


def test_the_console_notifier_prints_one_inert_line_per_alert() -> None:
    out = io.StringIO()
    summary = alert(
        status="summary",
        description=f"3 alerts{FORGED}",
        first=[alert(), alert(n=2)],
    )
    ConsoleNotifier(ConsoleConfig(name="console", type="console"), out).send([alert(), summary])
    text = out.getvalue()
    assert not CONTROL.search(text), repr(text)
    lines = text.splitlines()
    # One line per alert, the summary's head and its two listed alerts: nothing forged.
    assert len(lines) == 4, lines
    assert lines[0].startswith("[warning] late #1 key=k\\x1b]0;pwned\\x07\\x1b[2J"), lines[0]
    assert "\\r\\n2026-11-27 10:00:00,000 INFO" in lines[0]
    assert lines[1] == "[warning] late storm: 3 alerts\\r\\n2026-11-27 10:00:00,000 INFO " + (
        "slawatch.activity: all good"
    )
    assert lines[2].startswith("  [warning] late #1 key=k\\x1b")


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise RuntimeError(f"bad key {NASTY}")
        except RuntimeError:
            info = sys.exc_info()
    return logging.LogRecord("slawatch.x", logging.WARNING, __file__, 1, message, args, info)


def test_text_log_lines_write_control_characters_out() -> None:
    formatter = TextFormatter("%(levelname)s %(name)s: %(message)s")
    line = formatter.format(record("event for key %s refused", NASTY))
    assert "\n" not in line and not CONTROL.search(line), repr(line)
    assert line.startswith("WARNING slawatch.x: event for key k\\x1b]0;pwned\\x07")
    # A traceback keeps its own line breaks; its message's are written out.
    lines = formatter.format(record("failed", exc=True)).split("\n")
    assert lines[0] == "WARNING slawatch.x: failed" and lines[1].startswith("Traceback")
    assert lines[-1].startswith("RuntimeError: bad key k\\x1b]0;pwned\\x07")
    assert not any(CONTROL.search(ln) for ln in lines), lines


def test_json_log_lines_escape_every_control_character() -> None:
    line = JsonFormatter().format(record("key %s", NASTY))
    assert "\n" not in line and not CONTROL.search(line), repr(line)
    assert json.loads(line)["message"] == f"key {NASTY}"  # the same text, escaped


def test_the_text_format_is_the_escaping_one(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []
    try:
        setup("INFO", "text")
        logging.getLogger("slawatch.test").info("key %s", NASTY)
    finally:
        root.handlers = handlers
        root.setLevel(level)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not CONTROL.search(err), repr(err)
