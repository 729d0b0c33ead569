"""The shared limits' service tasks: apply (audited once per change, invalid input naming every
field and storing nothing), list and get in the contract's shapes, delete refused while held
unless forced; through the registered task as a caller sends it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select, text

import tasks.service
from celeryapp.application import ChordbeatCelery
from celeryapp.domain.shared_limits import parse_limit
from celeryapp.errors import DefinitionError, InvalidArgument, InvalidTransition, NotFound
from celeryapp.execution.limit_slots import Demand, Holder, acquire_or_wait
from celeryapp.execution.limit_store import put_limit
from celeryapp.interfaces import limit_service, service
from celeryapp.states import AuditAction
from models import AuditEvent, transaction
from tests.support.servers import wait_for

WAREHOUSE = {"name": "warehouse", "slots": 2, "key": "{payload.customer}", "per_key_slots": 1, "max_wait": 600}


def audit(app: ChordbeatCelery) -> list[tuple[str, str, str | None, dict[str, Any] | None]]:
    with transaction(app.settings.database_url, read_only=True) as session:
        rows = session.execute(
            select(AuditEvent.action, AuditEvent.actor, AuditEvent.reason, AuditEvent.detail).order_by(AuditEvent.id)
        ).all()
    return [(action.value, actor, reason, detail) for action, actor, reason, detail in rows]


def hold(app: ChordbeatCelery, number: int, key: str) -> bool:
    with transaction(app.settings.database_url) as session:
        return acquire_or_wait(session, [Demand("warehouse", key)], Holder(number, 1, 50 + number, f"load-{number}"))[0]


def test_a_limit_is_applied_once_per_change_and_read_back_with_who_holds_and_waits(app: ChordbeatCelery) -> None:
    applied = limit_service.apply_limit(app, WAREHOUSE, actor="ops", reason="ERP falls over")
    assert applied == {
        **WAREHOUSE,
        "rate": None,
        "on_full": "queue",
        "version": 1,
        "in_use": 0,
        "waiting": 0,
        "oldest_waiting_since": None,
        "holders": [],
        "waiters": [],
        "keys": {},
    }
    limit_service.apply_limit(app, WAREHOUSE, actor="ops")  # unchanged: no second row
    assert [(a, who, why) for a, who, why, _ in audit(app)] == [("limit_applied", "ops", "ERP falls over")]
    assert hold(app, 1, "acme") and hold(app, 2, "globex") and not hold(app, 3, "acme")
    detail = limit_service.get_limit(app, "warehouse")
    assert (detail["in_use"], detail["waiting"], detail["keys"]) == (2, 1, {"acme": 1, "globex": 1})
    assert [(h["execution_id"], h["step"], h["key"]) for h in detail["holders"]] == [
        (51, "load-1", "acme"),
        (52, "load-2", "globex"),
    ]
    assert [(w["step"], w["key"], w["slots"]) for w in detail["waiters"]] == [("load-3", "acme", 1)]
    assert detail["waiters"][0]["since"].endswith("Z")
    since = detail["waiters"][0]["since"]  # the only waiter is the oldest
    assert detail["oldest_waiting_since"] == since
    assert limit_service.list_limits(app) == [
        {
            **WAREHOUSE,
            **{"rate": None, "on_full": "queue", "version": 1, "in_use": 2, "waiting": 1},
            "oldest_waiting_since": since,
        }
    ]


def test_an_invalid_definition_names_every_field_and_stores_nothing(app: ChordbeatCelery) -> None:
    with pytest.raises(DefinitionError) as caught:
        limit_service.apply_limit(app, {"name": "wh", "slots": True, "rate": "5/fortnight", "per_key_slots": 1})
    assert {e.field for e in caught.value.errors} == {"slots", "rate", "per_key_slots"}
    with pytest.raises(InvalidArgument, match="actor"):
        limit_service.apply_limit(app, WAREHOUSE, actor="x" * 101)
    assert limit_service.list_limits(app) == [] and audit(app) == []
    with pytest.raises(NotFound, match="'warehouse'"):
        limit_service.get_limit(app, "warehouse")


def test_a_held_limit_is_deleted_only_with_force_and_the_delete_is_audited(app: ChordbeatCelery) -> None:
    limit_service.apply_limit(app, WAREHOUSE)
    assert hold(app, 1, "acme")
    with pytest.raises(InvalidTransition, match="held"):
        limit_service.delete_limit(app, "warehouse", actor="ops")
    with pytest.raises(InvalidArgument, match="force"):
        limit_service.delete_limit(app, "warehouse", force="yes")
    assert limit_service.delete_limit(app, "warehouse", True, actor="ops", reason="moved") == {
        "name": "warehouse",
        "deleted": True,
    }
    assert audit(app)[-1] == (
        "limit_deleted",
        "ops",
        "moved",
        {"limit": "warehouse", "force": True, "held_slots": 1, "dropped_waiters": 0},
    )
    with pytest.raises(NotFound):
        limit_service.delete_limit(app, "warehouse", True)


def test_a_larger_limit_admits_its_waiters_at_once(app: ChordbeatCelery) -> None:
    limit_service.apply_limit(app, {"name": "warehouse", "slots": 1})
    load = {"name": "load", "task": "chordbeat.examples.sleep", "uses": ["warehouse"]}
    service.apply_schedule(app, {"name": "loads", "every": 3600, "overlap": "allow", "steps": [load]})
    runs = [service.trigger_schedule(app, "loads")["execution_id"] for _ in range(2)]
    # No worker: the admitted step stays queued, holding its slot.
    assert [service.get_execution(app, run)["tasks"][0]["status"] for run in runs] == ["queued", "waiting_for_limit"]
    assert limit_service.apply_limit(app, {"name": "warehouse", "slots": 2})["in_use"] == 2
    assert service.get_execution(app, runs[1])["tasks"][0]["status"] == "queued"


def answer(task: Any, **kwargs: Any) -> Any:
    """A service task run in-process as a worker runs it; the answer as the caller reads it."""
    return task.apply(kwargs=kwargs).get().__json__()


def test_the_registered_tasks_answer_as_the_contract_says(app: ChordbeatCelery) -> None:
    stored = answer(tasks.service.apply_limit, definition={"name": "erp", "slots": 3}, actor="svc")
    assert (stored["name"], stored["slots"]) == ("erp", 3)
    assert [limit["name"] for limit in answer(tasks.service.list_limits)] == ["erp"]
    assert answer(tasks.service.get_limit, name="erp")["in_use"] == 0
    assert answer(tasks.service.delete_limit, name="erp") == {"name": "erp", "deleted": True}
    assert [row[0] for row in audit(app)] == [AuditAction.LIMIT_APPLIED.value, AuditAction.LIMIT_DELETED.value]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_two_changes_of_one_limit_at_once_never_lose_one(app: ChordbeatCelery) -> None:
    """PostgreSQL, two real transactions: both callers read version 1, one makes the limit larger,
    the other gives it a rate, each sending the whole definition back with the version it read.
    The second waits for the first's lock, then finds version 2 and is refused: it does not write
    the slots back as it read them. Read again, its change goes in beside the first."""
    url = app.settings.database_url
    read = limit_service.apply_limit(app, {"name": "warehouse", "slots": 2}, actor="ops")
    assert read["version"] == 1
    definition = {field: read[field] for field in ("name", "slots", "rate", "key", "per_key_slots", "on_full")}
    locked, commit = threading.Event(), threading.Event()

    def larger() -> None:
        with transaction(url) as session:
            put_limit(session, parse_limit({**definition, "slots": 5}), expected_version=1)
            locked.set()
            commit.wait(30)  # the change stays uncommitted until the other waits for its lock

    outcome: dict[str, Any] = {}

    def rated() -> None:
        try:
            outcome["stored"] = limit_service.apply_limit(
                app, {**definition, "rate": "10/min"}, actor="ops", expected_version=1
            )
        except InvalidTransition as exc:
            outcome["refused"] = str(exc)

    first = threading.Thread(target=larger)
    first.start()
    assert locked.wait(20)
    second = threading.Thread(target=rated)
    second.start()
    wait_for(lambda: waits_for_a_lock(url), 20, what="the second change to wait for the first's lock")
    commit.set()
    first.join(30)
    second.join(30)
    assert outcome == {"refused": "limit 'warehouse' changed meanwhile (version 2, not the 1 read); read it again"}
    now = limit_service.get_limit(app, "warehouse")
    assert (now["slots"], now["rate"], now["version"]) == (5, None, 2)
    again = limit_service.apply_limit(app, {**definition, "slots": 5, "rate": "10/min"}, expected_version=2)
    assert (again["slots"], again["rate"], again["version"]) == (5, "10/min", 3)
    with pytest.raises(InvalidArgument, match="expected_version"):
        limit_service.apply_limit(app, definition, expected_version=True)


def waits_for_a_lock(url: str) -> bool:
    with transaction(url, read_only=True) as session:
        waiting = session.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        )
    return bool(waiting)
