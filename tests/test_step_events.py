"""What monitors are told about a step, without a worker: the event a runner's answer becomes, and
Flower's own search engine (flower.utils.search, what its /tasks box and /api/tasks?search= use)
over the names and reprs chordbeat gives steps, with the queries docs/flower.md tells people to type.
Flower itself, with real workers, is in tests/test_flower.py."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from flower.utils.search import And, TaskSearchEngine, Term, parse_query

from celeryapp.worker import step_events
from models import ActivityStatus

DOCS = Path(__file__).parent.parent / "docs" / "flower.md"


def flower_task(
    execution_id: int, step_index: int, step: str, worker_task: int, schedule: str = "payroll-export"
) -> Any:
    """A task as Flower's state holds it after the runner's task-received event."""
    return SimpleNamespace(
        uuid=f"chordbeat-e{execution_id}-wt{worker_task}-a1",
        name=step_events.shadow_name("payroll-export", step),
        state="SUCCESS",
        worker=None,
        args=step_events.args_repr(execution_id, step_index, 1),
        kwargs=step_events.kwargs_repr(execution_id, step_index, 1, worker_task),
        result="complete",
    )


@pytest.fixture
def engine() -> TaskSearchEngine:
    engine = TaskSearchEngine()
    tasks = [flower_task(5, 0, "extract", 1), flower_task(5, 1, "Upload to bank", 2)]
    tasks += [flower_task(n, 0, "extract", 10 + n) for n in range(50, 60)]
    tasks += [flower_task(n, 1, "Upload to bank", 100 + n) for n in range(50, 60)]
    for task in tasks:
        engine.upsert(task)
    return engine


def test_kwargs_execution_is_an_exact_match(engine: TaskSearchEngine) -> None:
    assert engine.matching_ids("kwargs:execution=5") == {"chordbeat-e5-wt1-a1", "chordbeat-e5-wt2-a1"}
    assert engine.matching_ids("kwargs:execution=5 kwargs:group=2") == {"chordbeat-e5-wt2-a1"}
    assert len(engine.matching_ids("kwargs:execution=50")) == 2


def test_a_name_with_spaces_is_found_in_quotes(engine: TaskSearchEngine) -> None:
    found = engine.matching_ids('name:"payroll-export/Upload to bank"')
    assert len(found) == 11
    assert engine.matching_ids('name:"payroll-export/Upload to bank" kwargs:execution=5') == {"chordbeat-e5-wt2-a1"}


def _doc_queries() -> list[str]:
    """The search-box queries docs/flower.md gives, as written there (inline code with a field)."""
    text = DOCS.read_text()
    return re.findall(r"`((?:name|kwargs|args|state):[^`]+)`", text)


def test_every_search_the_docs_give_is_one_query_flower_accepts_as_meant(engine: TaskSearchEngine) -> None:
    queries = _doc_queries()
    assert 'name:"payroll-export/Upload to bank"' in queries  # the issue's own example, quoted
    assert "kwargs:execution=41" in queries
    for query in queries:
        parsed = parse_query(query)  # raises on what Flower refuses
        terms = parsed.children if isinstance(parsed, And) else (parsed,)
        # Each field:value typed is one term: nothing split off at a space.
        assert [f"{t.field}:" for t in terms] == re.findall(r"\b(?:name|kwargs|args|state):", query), query
        assert all(isinstance(t, Term) for t in terms)


@pytest.mark.parametrize(
    ("returned", "event", "fields"),
    [
        (
            {"status": "failed_with_error", "error": "ConnectionError: no", "traceback": "Traceback ...\nraise X\n"},
            "task-failed",
            {"exception": "failed_with_error: ConnectionError: no", "traceback": "Traceback ...\nraise X\n"},
        ),
        # The run's cancel closed the activity first: the runner answers what it stored.
        (
            {"status": "cancelled", "error": "cancelled by admin (web): wrong payload", "superseded": True},
            "task-revoked",
            {
                "exception": "cancelled: cancelled by admin (web): wrong payload",
                "terminated": False,
                "expired": False,
                "signum": None,
            },
        ),
        (
            {"status": "fenced"},
            "task-revoked",
            {
                "exception": f"cancelled: {step_events.FENCED_TEXT}",
                "terminated": False,
                "expired": False,
                "signum": None,
            },
        ),
    ],
)
def test_the_event_tells_a_traceback_and_a_cancel_recorded_by_someone_else(
    returned: dict[str, Any], event: str, fields: dict[str, Any]
) -> None:
    assert step_events.event_for(repr(returned)) == (event, fields)


def test_a_step_result_carries_its_traceback_and_a_stored_cancel_reads_back() -> None:
    result = step_events.step_result(ActivityStatus.FAILED_WITH_ERROR, "E: x", None, "Traceback\n")
    assert result == {"status": "failed_with_error", "error": "E: x", "traceback": "Traceback\n"}
    # The whole of a bounded traceback and error fit the result's repr, read back from it.
    big = step_events.step_result(ActivityStatus.FAILED_WITH_ERROR, "é" * 2000, None, "\\" * 16 * 1024)
    assert len(repr(big)) <= step_events.RESULT_REPR_CHARS
