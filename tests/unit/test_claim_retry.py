"""A claim that met a conflict a new attempt resolves runs again at once."""

from __future__ import annotations

import psycopg
import pytest

from slawatch.db import retry_conflicts as _retrying
from slawatch.errors import DatabaseError


def failing(errors: list[psycopg.Error]) -> tuple[list[int], object]:
    calls: list[int] = []

    def work() -> int:
        calls.append(1)
        if errors:
            error = errors.pop(0)
            raise DatabaseError("claim for rule x: conflict") from error
        return 7

    return calls, work


def test_a_row_moved_to_another_partition_or_a_deadlock_is_tried_again() -> None:
    calls, work = failing(
        [psycopg.errors.SerializationFailure(), psycopg.errors.DeadlockDetected()]
    )
    assert _retrying(work) == 7  # type: ignore[arg-type]
    assert len(calls) == 3


def test_other_errors_and_a_third_conflict_are_raised() -> None:
    _, work = failing([psycopg.errors.UndefinedTable()])
    with pytest.raises(DatabaseError):
        _retrying(work)  # type: ignore[arg-type]
    calls, work = failing([psycopg.errors.SerializationFailure()] * 3)
    with pytest.raises(DatabaseError):
        _retrying(work)  # type: ignore[arg-type]
    assert len(calls) == 3
