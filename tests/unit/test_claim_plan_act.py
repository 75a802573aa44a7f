"""A scan asks for its plan with the runner's action at every run: the copy is made
once, not at each scan (a copy renders its probe again)."""

from __future__ import annotations

from slawatch.actions.run import runner
from slawatch.config.rules import Rule
from slawatch.engine.claim import plan_claim


def rule(action: dict[str, str] | None) -> Rule:
    return Rule.model_validate(
        {
            "name": "job_hung",
            "table": "public.jobs",
            "key": "id",
            "deadline": "heartbeat_at",
            "after": "15m",
            "open_when": "status = 'running'",
            "notify": ["console"],
        }
        | ({} if action is None else {"action": action})
    )


def test_the_acting_copy_of_a_plan_is_made_once_per_act() -> None:
    for track in ("inline", "table"):
        plan = plan_claim(
            rule({"sql": "SELECT requeue(:id)"}).model_copy(update={"track": track}),
            "timestamp without time zone",
            key=["id"],
        )
        act, other = runner("on"), runner("off")
        acting = plan.with_act(act)
        assert acting is not plan and acting.act is act
        assert acting.table is None or acting.table.act is act
        assert plan.with_act(act) is acting  # the kept copy: its probe rendered once
        assert acting.with_act(act) is acting
        switched = plan.with_act(other)  # another act: another copy
        assert switched is not acting and switched.act is other
        assert plan.act is None  # the plan itself is unchanged


def test_a_plan_without_an_action_is_its_own_acting_plan() -> None:
    plan = plan_claim(rule(None), "timestamp without time zone", key=["id"])
    assert plan.with_act(runner("on")) is plan
