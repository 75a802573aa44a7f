"""A deadline expression as PostgreSQL's parser reads it: one row's value, or one line
saying why not (the database's part is in tests/integration/test_deadline_expr.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slawatch.config.rules import load_rules, qualify
from tests.unit.test_rules import error_of

RULE = """\
table: public.tickets
key: id
deadline: "{}"
open_when: "status = 'open'"
notify: [console]
"""

OTHER_TABLE = (
    "a deadline is computed from the row's own columns; for a value from another table,"
    " keep the deadline in a column of this table that a trigger fills in, or use an"
    " event rule (docs/how-to/watch-a-table.md)"
)


@pytest.mark.parametrize(
    ("deadline", "expected"),
    [
        (
            "opened + (SELECT max(rental_duration) FROM film) * interval '1 day'",
            f"tickets.yaml: deadline: must not contain a subquery: {OTHER_TABLE}",
        ),
        (
            "opened + film.rental_duration * interval '1 day'",
            "tickets.yaml: deadline: film.rental_duration is another table's column: "
            + OTHER_TABLE,
        ),
        ("tickets.opened", "tickets.yaml: deadline: write tickets.opened as opened"),
        ("t.*", "tickets.yaml: deadline: must not read a whole row (*): name the columns"),
        (
            "opened; DROP TABLE tickets",
            "tickets.yaml: deadline: must be one SQL expression, without ';'",
        ),
        ("opened -- later", "tickets.yaml: deadline: must not contain SQL comments"),
        ("opened) OR (true", "tickets.yaml: deadline: not one SQL expression"),
        ("count(*)", "tickets.yaml: deadline: must be one row's value"),
        ("max(opened) OVER ()", "tickets.yaml: deadline: must be one row's value"),
    ],
)
def test_bad_deadline_expressions_name_file_and_field(
    tmp_path: Path, deadline: str, expected: str
) -> None:
    message = error_of(tmp_path, RULE.format(deadline), "tickets.yaml")
    assert message.startswith(f"{tmp_path / 'tickets.yaml'}:"), message
    assert message.removeprefix(f"{tmp_path}/").startswith(expected), message
    assert "\n" not in message


def test_a_column_stays_a_column_and_an_expression_reads_its_columns(tmp_path: Path) -> None:
    (tmp_path / "tickets.yaml").write_text(RULE.format("promised_at"))
    (column,) = load_rules(tmp_path)
    assert (column.deadline_column, column.deadline_sql(), column.deadline_sql("t")) == (
        "promised_at",
        '"promised_at"',
        '"t"."promised_at"',
    )
    text = "(created_at AT TIME ZONE 'UTC') + make_interval(hours => \\\"SLA\\\")"
    (tmp_path / "tickets.yaml").write_text(RULE.format(text))
    (expr,) = load_rules(tmp_path)
    assert expr.deadline_column is None
    assert expr.deadline_columns == ["created_at", "SLA"]
    assert expr.alert_columns(["id"]) == ["id", "created_at", "SLA"]
    # Qualified where the state table is in scope too; 'hours' is no column, the
    # string literal is left as written.
    assert expr.deadline_sql("t") == (
        '("t".created_at AT TIME ZONE \'UTC\') + make_interval(hours => "t"."SLA"))'
    ).replace('("t".c', '(("t".c', 1)


def test_qualify_counts_characters_not_bytes() -> None:
    assert qualify("(a AT TIME ZONE 'Åsgårdstrand') + b", "t") == (
        '("t".a AT TIME ZONE \'Åsgårdstrand\') + "t".b'
    )
