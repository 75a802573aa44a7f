"""Which action statements have a set form (config/batched.py), and the batch of a
rule whose action runs one row at a time (config/rules.py ONE_BY_ONE_BATCH)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slawatch.config.batched import set_form
from slawatch.config.rules import ONE_BY_ONE_BATCH, action_statement, load_rules
from slawatch.errors import ConfigError
from tests.unit.test_actions import GOOD

ONE_BY_ONE = [
    "insert into restarts default values",
    "insert into restarts (job_id, kind) values (:id, default)",
    "insert into restarts (job_id, kind) values (:id, 'x')"
    " on conflict (job_id) do update set kind = :kind",
    "update slawatch_p set kind = 'x' where id = :id",
]
SET = [
    "update jobs set status = 'queued' where id = :id",
    "delete from jobs where id = :id and kind = :kind",
    "insert into restarts (job_id, kind) values (:id, :kind) on conflict do nothing",
    "insert into restarts (job_id, kind) select id, kind from jobs where id = :id",
    "select requeue(:id)",
]


@pytest.mark.parametrize("sql", ONE_BY_ONE)
def test_shapes_without_a_set_form(sql: str) -> None:
    assert set_form(*action_statement(sql)) is None


@pytest.mark.parametrize("sql", SET)
def test_shapes_with_a_set_form(sql: str) -> None:
    form = set_form(*action_statement(sql))
    assert form is not None and form.arity == len(action_statement(sql)[1])


def rule_file(tmp_path: Path, sql: str, batch: int | None) -> Path:
    extra = "" if batch is None else f"batch: {batch}\n"
    (tmp_path / "jobs.yaml").write_text(GOOD + extra + f"action: {json.dumps({'sql': sql})}\n")
    return tmp_path


@pytest.mark.parametrize("sql", ONE_BY_ONE[:3])
def test_a_one_by_one_action_caps_its_rules_batch(tmp_path: Path, sql: str) -> None:
    assert load_rules(rule_file(tmp_path, sql, None))[0].batch == ONE_BY_ONE_BATCH
    assert load_rules(rule_file(tmp_path, sql, 20))[0].batch == 20
    assert load_rules(rule_file(tmp_path, SET[0], None))[0].batch == 10_000
    with pytest.raises(ConfigError) as exc:
        load_rules(rule_file(tmp_path, sql, ONE_BY_ONE_BATCH + 1))
    assert f"batch: {ONE_BY_ONE_BATCH + 1} is more than {ONE_BY_ONE_BATCH}" in str(exc.value)
