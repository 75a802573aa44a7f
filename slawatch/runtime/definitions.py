"""Whether each rule this process runs has the definition migrate recorded.

The claims' gate (engine/generation.py) is what keeps an instance running another
definition of a rule from changing anything for it; this is what the process
knows of it: the recorded definitions, read again every :data:`REREAD` seconds
(one statement for every rule) and at once after a gate refused, so that a
rule found stale is skipped without a probe, ``/readyz`` and
``slawatch_rule_generation_mismatch`` say so while the rule is idle too, and the
log has one line when a rule turns stale and one when it matches again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.engine.generation import Recorded, mismatch, recorded, refusal
from slawatch.errors import SlawatchError

log = logging.getLogger(__name__)

# Seconds a read of the recorded definitions is trusted: how soon a rule whose
# record moved (to this process's definition, or away from it) is seen while idle.
REREAD = 10.0


class Definitions:
    """The recorded definitions as last read, and the rules found stale (by name, with
    the one line that says why). ``changed(rule, stale)`` is told each turn."""

    def __init__(
        self,
        db: Database,
        changed: Callable[[str, bool], None] = lambda rule, stale: None,
        reread: float = REREAD,
    ) -> None:
        self.db, self.changed, self.reread = db, changed, reread
        self._lock = threading.Lock()
        self._records: dict[str, Recorded] = {}
        self._read_at: float | None = None
        self._stale: dict[str, str] = {}

    @property
    def stale(self) -> dict[str, str]:
        """The rules not claimed now, with why."""
        with self._lock:
            return dict(self._stale)

    def invalidate(self) -> None:
        """Read the records again before the next check (a reload, a refusal)."""
        with self._lock:
            self._read_at = None

    def check(self, rule: Rule) -> bool:
        """Whether ``rule`` may be claimed, as far as the records tell (reads them again
        when they are old); raises what the read raises."""
        with self._lock:
            fresh = self._read_at is not None and time.monotonic() - self._read_at < self.reread
        if not fresh:
            records = self.db.run("reading the rules' recorded definitions", recorded)
            with self._lock:
                self._records, self._read_at = records, time.monotonic()
        with self._lock:
            why = mismatch(rule, self._records.get(rule.name))
        self._set(rule.name, why)
        return why is None

    def refused(self, rule: Rule, exc: BaseException) -> bool:
        """Whether ``exc`` is the claims' gate refusing ``rule``: then the rule is marked
        stale (for a refusal of its definition) or left for the next scan (migrate was
        recording one), and the records are read again before the next check."""
        kind = refusal(exc)
        if kind is None:
            return False
        self.invalidate()
        if kind == "busy":
            log.debug(
                "rule %s: migrate was recording its definition; the next scan claims", rule.name
            )
            return True
        try:
            self.check(rule)  # the record as it is now, and the parts that differ
        except SlawatchError:
            self._set(rule.name, str(exc).split(": ", 1)[-1])  # the gate's own words
        return True

    def forget(self, name: str) -> None:
        """``name`` is no longer run (a reload removed it)."""
        self._set(name, None)

    def _set(self, name: str, why: str | None) -> None:
        with self._lock:
            before = self._stale.get(name)
            if why is None:
                self._stale.pop(name, None)
            elif before is None:
                self._stale[name] = why
        if before is None and why is not None:
            log.warning("%s", why, extra={"rule": name, "definition": "stale"})
            self.changed(name, True)
        elif before is not None and why is None:
            log.info(
                "rule %s: its definition is the recorded one again; claiming it",
                name,
                extra={"rule": name, "definition": "current"},
            )
            self.changed(name, False)
