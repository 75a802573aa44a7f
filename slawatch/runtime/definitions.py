"""Whether each rule this process runs has the definition migrate recorded.

The claims' gate (engine/generation.py) is what keeps an instance running another
definition of a rule from changing anything for it; this is what the process
knows of it: the recorded generations, read again every :data:`REREAD` seconds
(one statement for every rule, by one scan: the others meanwhile go by the records
as last read) and at once after a gate refused, so that a
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
from slawatch.engine.generation import (
    generation,
    mismatch,
    recorded_generations,
    recorded_one,
    refusal,
)
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
        # Held by the one scan reading the records: with a thousand rules at `every: 5s`
        # the records go old while 200 scans a second look at them, and each reading
        # them (every row) would make the cost grow with the square of the rules.
        self._reading = threading.Lock()
        # Each rule's recorded generation, by name: a few bytes a rule, read every
        # REREAD seconds (the definitions themselves only name the parts that differ).
        self._records: dict[str, str] = {}
        # The line saying why a rule is stale, by name, with the generations it is of
        # (recorded, this process's): made from its recorded definition once.
        self._whys: dict[str, tuple[str, str, str | None]] = {}
        self._read_at: float | None = None
        self._stale: dict[str, str] = {}
        # Each rule's generation (a hash of its definition), by name, with the rule it
        # is of: a scan compares, it does not hash the rule again.
        self._generations: dict[str, tuple[Rule, str]] = {}

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
        when they are old); raises what the read raises.

        Records merely old (:data:`REREAD`) are read again by one scan while the others
        go by them as they are; records never read, or set aside by :meth:`invalidate`,
        are read before any check answers."""
        with self._lock:
            read_at = self._read_at
        if read_at is None or time.monotonic() - read_at >= self.reread:
            self._read(wait=read_at is None)
        with self._lock:
            recorded = self._records.get(rule.name)
            mine = self._generation(rule)
        why = None if recorded is None or recorded == mine else self._why(rule, recorded, mine)
        self._set(rule.name, why)
        return why is None

    def _generation(self, rule: Rule) -> str:
        """``rule``'s generation, computed once per rule object (a reload's new rule is
        hashed anew)."""
        mine = self._generations.get(rule.name)
        if mine is None or mine[0] is not rule:
            mine = self._generations[rule.name] = (rule, generation(rule))
        return mine[1]

    def _why(self, rule: Rule, recorded: str, mine: str) -> str | None:
        """Why ``rule`` (of generation ``mine``) is not claimed where ``recorded`` is
        recorded: :func:`~slawatch.engine.generation.mismatch` of its recorded
        definition, read once per pair of generations (a stale rule is checked at each
        of its scans)."""
        with self._lock:
            made = self._whys.get(rule.name)
        if made is not None and made[:2] == (recorded, mine):
            return made[2]
        record = self.db.run(
            f"reading rule {rule.name}'s recorded definition",
            lambda conn: recorded_one(conn, rule.name),
        )
        why = mismatch(rule, record)
        if record is not None:
            with self._lock:
                self._whys[rule.name] = (record.generation, mine, why)
        return why

    def _read(self, wait: bool) -> None:
        """Read the records, unless another scan is reading them: then wait for it
        (``wait``) or go on without."""
        if not self._reading.acquire(blocking=wait):
            return
        try:
            with self._lock:
                read_at = self._read_at
            if read_at is not None and time.monotonic() - read_at < self.reread:
                return  # read by the scan that held the lock before this one
            records = self.db.run("reading the rules' recorded definitions", recorded_generations)
            with self._lock:
                self._records, self._read_at = records, time.monotonic()
        finally:
            self._reading.release()

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
        with self._lock:
            self._generations.pop(name, None)
            self._whys.pop(name, None)
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
