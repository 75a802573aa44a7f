"""The three partial-index predicates of a rule (docs/explanation/episodes.md), which
migrate builds its indexes with and the claim repeats word for word."""

from __future__ import annotations

from slawatch.config.rules import Rule
from slawatch.db import quoted


def predicates(rule: Rule) -> tuple[str, str, str]:
    """The SQL of the three index predicates, which the claim repeats word for word.

    - first: rows not yet notified for their current deadline value (never notified,
      or the deadline moved since: a new episode);
    - again: rows of an open episode (notified, or baselined), indexed by the time of
      their next re-notification: the claim reads the range due now, ``status`` counts
      the whole index (every open episode is overdue). An episode at its cap, acked,
      or of a rule without renotify has ``next`` NULL: it stays in the index, where
      the claim never reads, until it ends;
    - ended: rows whose episode ended (open_when turned false, or the deadline
      moved); the next scan closes the episode, and the row leaves this index.
    """
    d, seen = rule.deadline_sql(), quoted(rule.seen_column)
    open_when = f"({rule.open_when})"
    first = f"{seen} IS DISTINCT FROM {d} AND {open_when}"
    again = f"{seen} = {d} AND {open_when}"
    ended = f"{seen} IS NOT NULL AND ({seen} IS DISTINCT FROM {d} OR {open_when} IS NOT TRUE)"
    return first, again, ended
