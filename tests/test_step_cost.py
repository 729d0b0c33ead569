"""What one step costs the database: the statements correctness needs, nothing more."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, select

from celeryapp.app import ChordbeatCelery
from celeryapp.execution import runner
from celeryapp.interfaces import service
from models import WorkerTask, get_engine, transaction
from tests.helpers import step


def test_a_step_costs_four_statements_in_two_transactions(app: ChordbeatCelery) -> None:
    service.apply_schedule(app, {"name": "cost", "every": 3600, "steps": [step("a")]})
    execution_id = service.trigger_schedule(app, "cost")["execution_id"]
    with transaction(app.settings.database_url) as session:
        task_id = session.scalar(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id))
    assert task_id is not None
    statements: list[str] = []
    commits: list[int] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.startswith("BEGIN"):
            statements.append(statement.split()[0])

    engine = get_engine(app.settings.database_url)
    event.listen(engine, "before_cursor_execute", record)
    event.listen(engine, "commit", lambda _conn: commits.append(1))
    try:
        assert runner.run_step(app, task_id, 1, node="here") == {"status": "complete"}
    finally:
        event.remove(engine, "before_cursor_execute", record)
    # Claim (the attempt, with its step's definition) and open the activity; then close the
    # activity and drop the worker task. Each transaction commits before the next step of the work.
    assert statements == ["UPDATE", "INSERT", "UPDATE", "DELETE"], statements
    assert len(commits) == 2
