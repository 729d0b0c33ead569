"""``uses`` in schedule definitions: parsed with the limits' own rules (hostile values refused
naming their place), checked against the limits defined when applied (an unknown limit, or more
slots than it has, refused naming the field), stored with the definition, and copied onto a run's
plan combined with the schedule's own ``uses``."""

from __future__ import annotations

from typing import Any

import pytest

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.definition import LimitUse
from celeryapp.domain.validation import parse_definition, parse_definitions
from celeryapp.errors import DefinitionError, NotFound
from celeryapp.interfaces import limit_service, service
from celeryapp.scheduling.schedule_file import apply_definitions
from models import transaction
from models.audit import BEAT
from models.versions import VersionOrigin

#: Who a direct apply of definitions is recorded as, in their versions.
ORIGIN = VersionOrigin.of(BEAT, None, file="teams.yaml")


def schedule(**fields: Any) -> dict[str, Any]:
    steps = fields.pop("steps", [{"name": "load", "task": "chordbeat.examples.sleep", "uses": ["warehouse"]}])
    return {"name": "finance-nightly", "cron": "0 2 * * *", "steps": steps, **fields}


@pytest.mark.parametrize(
    ("uses", "field"),
    [
        ("warehouse", "steps[0].uses"),
        ([""], "steps[0].uses[0]"),
        (["w\u0430rehouse"], "steps[0].uses[0]"),  # a Cyrillic a
        ([{"limit": "warehouse", "slots": 0}], "steps[0].uses[0].slots"),
        ([{"limit": "warehouse", "slots": True}], "steps[0].uses[0].slots"),
        ([{"limit": "warehouse", "slots": float("nan")}], "steps[0].uses[0].slots"),
        ([{"limit": "warehouse", "slots": 10**9}], "steps[0].uses[0].slots"),
        ([{"limit": "warehouse", "extra": 1}], "steps[0].uses[0].extra"),
        (["warehouse", "warehouse"], "steps[0].uses[1]"),
        ([f"l{i}" for i in range(17)], "steps[0].uses"),
        ([7], "steps[0].uses[0]"),
    ],
)
def test_hostile_uses_are_refused_naming_their_place(uses: Any, field: str) -> None:
    with pytest.raises(DefinitionError) as refused:
        parse_definition(schedule(steps=[{"name": "load", "task": "chordbeat.examples.sleep", "uses": uses}]))
    assert field in {error.field for error in refused.value.errors}


def test_a_schedules_uses_and_a_steps_are_combined_on_the_plan() -> None:
    definition = parse_definition(
        schedule(
            uses=["warehouse", "erp"],
            steps=[
                [
                    {"name": "load", "task": "chordbeat.examples.sleep", "uses": [{"limit": "warehouse", "slots": 2}]},
                    {"name": "mail", "task": "chordbeat.examples.sleep"},
                ]
            ],
        )
    )
    assert definition.uses == (LimitUse("warehouse"), LimitUse("erp"))
    assert definition.groups[0][0].uses == (LimitUse("warehouse", 2),)
    plan = definition.plan()
    assert plan[0][0]["uses"] == ["erp", {"limit": "warehouse", "slots": 2}]
    assert plan[0][1]["uses"] == ["warehouse", "erp"]
    with pytest.raises(DefinitionError) as refused:
        parse_definition(
            schedule(
                uses=[f"s{i}" for i in range(10)],
                steps=[{"name": "load", "task": "chordbeat.examples.sleep", "uses": [f"t{i}" for i in range(10)]}],
            )
        )
    assert [error.field for error in refused.value.errors] == ["steps[0].uses"]


def test_unknown_limits_are_refused_when_applied_and_known_ones_stored(app: ChordbeatCelery) -> None:
    limit_service.apply_limit(app, {"name": "warehouse", "slots": 3}, actor="ops")
    unknown = schedule(
        uses=["erp"],
        steps=[[{"name": "load", "task": "chordbeat.examples.sleep", "uses": [{"limit": "warehouse", "slots": 4}]}]],
    )
    with pytest.raises(DefinitionError) as refused:
        service.apply_schedule(app, unknown)
    assert {error.field for error in refused.value.errors} == {"uses[0]", "steps[0][0].uses[0].slots"}
    with pytest.raises(NotFound):
        service.get_schedule(app, "finance-nightly")  # nothing stored
    stored = service.apply_schedule(app, schedule(uses=["warehouse"]))
    assert stored["uses"] == ["warehouse"]
    assert stored["steps"][0]["uses"] == ["warehouse"]
    again = service.get_schedule(app, "finance-nightly")
    assert (again["uses"], again["steps"][0]["uses"]) == (["warehouse"], ["warehouse"])


def test_a_schedule_files_unknown_limits_are_refused_naming_the_schedule(app: ChordbeatCelery) -> None:
    limit_service.apply_limit(app, {"name": "warehouse", "slots": 3}, actor="ops")
    definitions = parse_definitions(
        [
            schedule(),
            schedule(name="sales", steps=[{"name": "load", "task": "chordbeat.examples.sleep", "uses": ["erp"]}]),
        ]
    )
    for dry_run in (True, False):
        with transaction(app.settings.database_url) as session, pytest.raises(DefinitionError) as refused:
            apply_definitions(session, definitions, source="teams.yaml", origin=ORIGIN, dry_run=dry_run)
        assert [error.field for error in refused.value.errors] == ["schedules[1] (sales).steps[0].uses[0]"]
