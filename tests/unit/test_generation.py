"""A rule's generation (engine/generation.py): what decides its episodes changes it,
what only shapes its pages does not, and no secret goes into the record."""

from __future__ import annotations

from typing import Any

import yaml

from slawatch.config.calendars import Calendar
from slawatch.config.rules import Rule
from slawatch.engine.generation import PARTS, definition, differing, generation

BASE = """\
table: public.jobs
key: id
deadline: heartbeat_at
after: 15m
open_when: "status = 'running'"
notify: [console]
renotify: {every: 15m, max: 4}
action:
  webhook: {url: "https://ops.example/restart", secret: whsec_MDEyMzQ1Njc4OWFiY2RlZmdoaWprbG1u}
"""

HOOK = "https://ops.example/restart"


def rule(**change: Any) -> Rule:
    data = yaml.safe_load(BASE) | {"name": "job_hung"}
    for key, value in change.items():
        if key == "action":
            data["action"] = data["action"] | value
        else:
            data[key] = value
    return Rule.model_validate(data)


def office(hours: str) -> Calendar:
    return Calendar.model_validate(
        {"name": "office", "timezone": "Europe/Berlin", "hours": {"mon-fri": hours}}
    )


def test_what_decides_episodes_changes_the_generation_and_nothing_else_does() -> None:
    base = generation(rule())
    for same in (
        rule(severity="critical"),
        rule(notify=["console", "pager"]),
        rule(renotify={"every": "1h", "max": 4}),
        rule(resolve=True),
        rule(every="5s"),
        rule(description="other words"),
        # How the webhook authenticates is not whether it acts.
        rule(action={"webhook": {"url": HOOK, "secret": "whsec_bm1sa2ppaGdmZWRjYmE5ODc2NTQzMjEw"}}),
        rule(action={"webhook": {"url": HOOK, "headers": {"Authorization": "Bearer t0k3n"}}}),
    ):
        assert generation(same) == base
    for other, part in (
        (rule(open_when="status IN ('running', 'stuck')"), "open_when"),
        (rule(after="20m"), "after"),
        (rule(deadline="created_at"), "deadline"),
        (rule(key=["id", "worker"]), "key"),
        (rule(track="table"), "track"),
        (rule(timezone="Europe/Berlin"), "timezone"),
        (rule(table="public.tasks"), "table"),
        (rule(action={"on": 2}), "action"),
        (rule(action={"webhook": {"url": "https://ops.example/kill"}}), "action"),
    ):
        assert generation(other) != base, part
        mine = definition(other)
        assert [p for p in PARTS if mine[p] != definition(rule())[p]] == [part]


def test_a_calendars_hours_are_part_of_its_rules_definition() -> None:
    nine, ten = rule(calendar="office"), rule(calendar="office")
    nine.use_calendar(office("09:00-17:00"))
    ten.use_calendar(office("10:00-17:00"))
    assert generation(nine) != generation(ten)
    assert generation(nine) != generation(rule())


def test_the_record_names_parts_by_hash_and_holds_no_secret() -> None:
    recorded = definition(rule())
    assert set(recorded) == set(PARTS)
    assert all(len(v) == 8 for v in recorded.values())
    assert "whsec_" not in repr(recorded) and "ops.example" not in repr(recorded)


def test_differing_names_every_part_when_the_record_names_none() -> None:
    from datetime import UTC, datetime

    from slawatch.engine.generation import Recorded

    other = Recorded("0" * 16, {}, datetime(2026, 1, 1, tzinfo=UTC))
    assert differing(rule(), other) == list(PARTS)
    same_but_after = Recorded("0" * 16, definition(rule(after="1h")), other.at)
    assert differing(rule(), same_but_after) == ["after"]
