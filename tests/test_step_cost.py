"""What one step costs the database: the statements correctness needs, nothing more."""

from __future__ import annotations

import json
import subprocess
from base64 import b64decode
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.exc import DataError, DBAPIError, OperationalError

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.decisions import Verdict
from celeryapp.domain.definition import StepSpec
from celeryapp.domain.effects import Effects, GroupDispatch, StepDispatch
from celeryapp.domain.names import STEPS_QUEUE
from celeryapp.execution.advancing import GroupState, advance_execution, advance_group, move_on, read_group
from celeryapp.execution.steps import claim_step, finish_step
from celeryapp.interfaces import service
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery.repair import requeue_attempt
from celeryapp.worker import database_patience, dispatch, firing, runner
from celeryapp.worker.heartbeat import StepWatch
from models import (
    ActivityStatus,
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    Trigger,
    WorkerTask,
    WorkerTaskStatus,
    get_engine,
    transaction,
    utcnow,
)
from models.session import autocommit, connection
from tests.support import processes
from tests.support.helpers import recorded_statements, step
from tests.support.servers import wait_for


def _group(app: ChordbeatCelery, execution_id: int, index: int) -> list[int]:
    with transaction(app.settings.database_url) as session:
        return list(
            session.scalars(
                select(WorkerTask.id)
                .where(WorkerTask.execution_id == execution_id, WorkerTask.step_index == index)
                .order_by(WorkerTask.id)
            )
        )


def _finish_group(app: ChordbeatCelery, execution_id: int, index: int) -> None:
    """The group's attempts claimed and finished, and no more: its advancement is left to the caller."""
    for task_id in _group(app, execution_id, index):
        with transaction(app.settings.database_url) as session:
            claim = claim_step(session.connection(), task_id, 1, node="here", now=utcnow())
            assert claim is not None
            assert finish_step(session.connection(), claim, ActivityStatus.COMPLETE, now=utcnow()).closed


def test_a_step_costs_two_statements_on_postgresql_five_on_sqlite(app: ChordbeatCelery) -> None:
    service.apply_schedule(app, {"name": "cost", "every": 3600, "steps": [[step("a"), step("b")]]})
    execution_id = service.trigger_schedule(app, "cost")["execution_id"]
    task_id, last_id = _group(app, execution_id, 0)
    commits: list[int] = []
    event.listen(get_engine(app.settings.database_url), "commit", lambda _conn: commits.append(1))
    with recorded_statements(app) as statements:
        assert runner.run_step(app, task_id, 1, node="here") == {"status": "complete"}
    # Claim (the attempt, with its step's definition) and open the activity; then drop the
    # worker task and close the activity (the lock order: task, then activity). Each is
    # committed before the next step of the work: on PostgreSQL one statement each, the outcome
    # committing by itself (no BEGIN and COMMIT). SQLite then counts the group's attempts left
    # (PostgreSQL, in the same statement).
    if app.settings.database_url.startswith("postgresql"):
        assert statements == ["WITH", "WITH"], statements
        assert len(commits) == 1
    else:
        assert statements == ["UPDATE", "INSERT", "DELETE", "UPDATE", "SELECT"], statements
        assert len(commits) == 2
    # The group's last step advances its run itself: here it ends it.
    assert runner.run_step(app, last_id, 1, node="here") == {"status": "complete"}
    with transaction(app.settings.database_url) as session:
        assert session.get_one(ScheduleExecution, execution_id).status is ExecutionStatus.COMPLETED


def test_a_claim_reads_its_steps_group_from_the_plan_not_the_whole_plan(app: ChordbeatCelery) -> None:
    """A plan grows with its schedule (up to 256 KB); sent and parsed whole for every step of the
    run, its parsing alone was a noticeable part of a step's cost (docs/performance.md)."""
    groups = [[step(f"g{g}s{s}") for s in range(3)] for g in range(40)]
    service.apply_schedule(app, {"name": "wide-plan", "every": 3600, "steps": groups})
    execution_id = service.trigger_schedule(app, "wide-plan")["execution_id"]
    task_id = _group(app, execution_id, 0)[1]
    with recorded_statements(app, words=None) as statements, transaction(app.settings.database_url) as session:
        claim = claim_step(session.connection(), task_id, 1, node="here", now=utcnow())
    assert claim is not None and claim.spec.name == "g0s1"
    reads = " ".join(statements)
    if app.settings.database_url.startswith("postgresql"):
        assert "schedule_executions.plan -> opened.step_index" in reads, reads
    else:
        assert 'json_extract(schedule_executions."plan", printf(' in reads, reads
    assert "schedule_executions.plan," not in reads and 'schedule_executions."plan")' not in reads, reads


def fire_statements(app: ChordbeatCelery, name: str) -> list[str]:
    """The statements of one regular fire of ``name``, an hourly schedule applied just now."""
    with transaction(app.settings.database_url) as session:
        anchor = session.scalar(select(Schedule.updated_at).where(Schedule.name == name))
    assert anchor is not None
    with recorded_statements(app, words=3) as statements:
        answer = firing.fire(app, name, nominal_at=anchor + timedelta(seconds=3600), trigger=Trigger.INTERVAL)
    assert answer["status"] == "in_progress", answer
    return statements


@pytest.mark.parametrize("overlap", ["allow", "skip"])
def test_a_fire_that_starts_a_run_costs_eight_statements_nine_if_it_checks_overlap(
    app: ChordbeatCelery, overlap: str
) -> None:
    service.apply_schedule(
        app, {"name": "fired", "every": 3600, "overlap": overlap, "steps": [step("a"), [step("b"), step("c")]]}
    )
    statements = fire_statements(app, "fired")
    # Lock and read the schedule's row, claim the slot, (skip: look for an active run), the
    # schedule with its steps in one statement, the execution (a conflict inserts nothing: no
    # savepoint, no look-up first), its worker tasks, the schedule's last run, the slot record
    # and its counter. The row lock is not taken twice; allow reads no active run.
    kinds = [s.split()[0] for s in statements]
    expected = ["SELECT", "UPDATE", "SELECT", "INSERT", "INSERT", "UPDATE", "INSERT", "INSERT"]
    if overlap == "skip":
        expected.insert(2, "SELECT")
    assert kinds == expected, statements


@pytest.mark.parametrize("width", [1, 6])
def test_an_advancement_costs_two_statements_on_postgresql_whatever_the_width_of_its_group(
    app: ChordbeatCelery, width: int
) -> None:
    groups = [[step(f"{g}{i}") for i in range(width)] for g in "ab"]
    service.apply_schedule(app, {"name": "wide", "every": 3600, "steps": groups})
    execution_id = service.trigger_schedule(app, "wide")["execution_id"]
    _finish_group(app, execution_id, 0)
    commits: list[int] = []
    event.listen(get_engine(app.settings.database_url), "commit", lambda _conn: commits.append(1))
    with recorded_statements(app) as statements:
        effects = advance_group(app.settings.database_url, execution_id, 0, now=utcnow())
    # The run at this group with its unfinished count and the group's outcomes in one statement
    # (alone: what it reads of a finished group no longer changes), then the compare-and-set to
    # the next group with the next group queued and returned for its chord: on PostgreSQL one
    # statement, committing by itself (no BEGIN, no COMMIT); on SQLite two, in a transaction.
    if app.settings.database_url.startswith("postgresql"):
        assert statements == ["SELECT", "WITH"], statements
        assert not commits
    else:
        assert statements == ["SELECT", "UPDATE", "UPDATE"], statements
        assert len(commits) == 2  # the group read (read-only) and the compare-and-set
    [sent] = effects.dispatch
    assert sent.step_index == 1 and [s.spec.name for s in sent.steps] == [f"b{i}" for i in range(width)]
    assert [s.worker_task_id for s in sent.steps] == sorted(s.worker_task_id for s in sent.steps)
    with transaction(app.settings.database_url) as session:
        assert session.get_one(ScheduleExecution, execution_id).current_step_index == 1
        queued = session.scalars(select(WorkerTask.status).where(WorkerTask.execution_id == execution_id)).all()
    assert queued == [WorkerTaskStatus.QUEUED] * width


def test_an_advancement_that_lost_its_race_after_reading_queues_nothing(app: ChordbeatCelery) -> None:
    """Between the read and the compare-and-set another advancement moved the run on (the chord's
    body racing the last step): the stale one changes nothing and sends nothing."""
    service.apply_schedule(app, {"name": "race", "every": 3600, "steps": [step("a"), step("b"), step("c")]})
    execution_id = service.trigger_schedule(app, "race")["execution_id"]
    url = app.settings.database_url
    _finish_group(app, execution_id, 0)
    with autocommit(url, read_only=True) as conn:
        state = read_group(conn, execution_id, 0)
    assert state is not None and state.outcome().verdict is Verdict.ADVANCE
    assert advance_group(url, execution_id, 0, now=utcnow()).dispatch
    with autocommit(url) as conn:
        assert move_on(conn, execution_id, 0, state, now=utcnow()) == Effects()
    with transaction(url) as session:
        assert session.get_one(ScheduleExecution, execution_id).current_step_index == 1
        rows = session.execute(
            select(WorkerTask.step_index, WorkerTask.status).where(WorkerTask.execution_id == execution_id)
        ).all()
    assert sorted(rows) == [(1, WorkerTaskStatus.QUEUED), (2, WorkerTaskStatus.WAITING)]


def test_ending_a_run_costs_eight_statements_and_loads_no_steps(app: ChordbeatCelery) -> None:
    service.apply_schedule(app, {"name": "ends", "every": 3600, "steps": [step("a"), step("b")]})
    execution_id = service.trigger_schedule(app, "ends")["execution_id"]
    for index in range(2):
        _finish_group(app, execution_id, index)
        with recorded_statements(app, words=None) as statements, transaction(app.settings.database_url) as session:
            advance_execution(session, execution_id, index, now=utcnow())
    # The last group's check (run and outcomes), the run's row, the schedule's row lock, the
    # compare-and-set to completed, its worker tasks dropped, its metrics (attempts read, one
    # upsert: last, the lock order), and the schedule's counters with the columns its retry
    # policy needs (RETURNING).
    kinds = [s.split()[0] for s in statements]
    assert kinds == ["SELECT", "SELECT", "SELECT", "UPDATE", "DELETE", "SELECT", "INSERT", "UPDATE"], kinds
    assert not [s for s in statements if "schedule_steps" in s], statements
    with transaction(app.settings.database_url) as session:
        assert session.scalar(select(Schedule.run_count).where(Schedule.name == "ends")) == 1


def test_a_manual_run_reads_and_locks_its_schedule_in_one_statement(app: ChordbeatCelery) -> None:
    service.apply_schedule(app, {"name": "manual", "every": 3600, "steps": [step("a"), [step("b"), step("c")]]})
    with recorded_statements(app, words=None) as statements:
        assert service.trigger_schedule(app, "manual")["status"] == "in_progress"
    # The schedule locked and read, its steps, its active run (the default overlap is skip), the
    # execution, its worker tasks, the schedule's last run, the slot record and its counter, and
    # (issue 24, who did what) the trigger's audit row.
    kinds = [" ".join(s.split()[:3]) if s.startswith("INSERT") else s.split()[0] for s in statements]
    inserts = [f"INSERT INTO {table}" for table in ("schedule_executions", "worker_tasks")]
    after = [f"INSERT INTO {table}" for table in ("schedule_slots", "metric_counts", "audit_events")]
    assert kinds == ["SELECT", "SELECT", "SELECT", *inserts, "UPDATE", *after], statements
    if app.settings.database_url.startswith("postgresql"):
        assert statements[0].startswith("SELECT schedules.id") and statements[0].endswith("FOR UPDATE"), statements[0]


@pytest.mark.parametrize("timeout", [None, 3])
def test_a_last_step_advances_its_run_unless_its_time_limit_is_near(app: ChordbeatCelery, timeout: int | None) -> None:
    """Near its soft time limit (a step with a timeout shorter than the margin always is), the step
    leaves the advancement to the chord's body: the limit's exception must not land mid-send."""
    first = step("a", **({"timeout": timeout} if timeout else {}))
    service.apply_schedule(app, {"name": "near", "every": 3600, "steps": [first, step("b")]})
    execution_id = service.trigger_schedule(app, "near")["execution_id"]
    [task_id] = _group(app, execution_id, 0)
    assert runner.run_step(app, task_id, 1, node="here") == {"status": "complete"}
    with transaction(app.settings.database_url) as session:
        index = session.get_one(ScheduleExecution, execution_id).current_step_index
    assert index == (0 if timeout else 1)


def test_reading_a_group_gives_its_steps_and_latest_outcomes_not_the_whole_plan(app: ChordbeatCelery) -> None:
    groups = [[step("a", max_attempts=2), step("b")], [step("c")], [step("d")]]
    service.apply_schedule(app, {"name": "read", "every": 3600, "steps": groups})
    execution_id = service.trigger_schedule(app, "read")["execution_id"]
    url = app.settings.database_url

    def read(index: int) -> GroupState | None:
        with autocommit(url, read_only=True) as conn:
            return read_group(conn, execution_id, index)

    started = read(0)
    assert started is not None
    assert [s["name"] for s in started.group] == ["a", "b"]
    assert started.next_group is not None and [s["name"] for s in started.next_group] == ["c"]
    assert (started.schedule_name, started.unfinished, started.results) == ("read", 2, {})
    assert started.outcome().verdict is Verdict.WAIT
    assert read(1) is None  # not at that group
    # a's first attempt is lost (its worker gone) and its second completes; b fails.
    a_id, b_id = _group(app, execution_id, 0)
    with transaction(url) as session:
        assert claim_step(session.connection(), a_id, 1, node="here", now=utcnow()) is not None
    with transaction(url) as session:
        requeue_attempt(session, a_id, 1, reason="worker lost", now=utcnow())
    for task_id, attempt, status in ((a_id, 2, ActivityStatus.COMPLETE), (b_id, 1, ActivityStatus.FAILED_WITH_ERROR)):
        with transaction(url) as session:
            claim = claim_step(session.connection(), task_id, attempt, node="here", now=utcnow())
            assert claim is not None
            finish_step(session.connection(), claim, status, now=utcnow(), error="boom" if status.failed else None)
    ended = read(0)
    assert ended is not None and ended.unfinished == 0
    assert {name: r.status for name, r in ended.results.items()} == {
        "a": ActivityStatus.COMPLETE,  # the latest attempt's, not the lost one's
        "b": ActivityStatus.FAILED_WITH_ERROR,
    }
    assert ended.outcome().verdict is Verdict.FAIL


def test_a_groups_last_step_advances_its_run_without_reading_the_group_again_on_postgresql(
    app: ChordbeatCelery,
) -> None:
    service.apply_schedule(app, {"name": "hop", "every": 3600, "steps": [[step("a"), step("b")], step("c")]})
    execution_id = service.trigger_schedule(app, "hop")["execution_id"]
    first_id, last_id = _group(app, execution_id, 0)
    assert runner.run_step(app, first_id, 1, node="here") == {"status": "complete"}
    with recorded_statements(app) as statements:
        assert runner.run_step(app, last_id, 1, node="here") == {"status": "complete"}
    # The claim; the outcome, which, the group's last, also reads what advancing needs in its
    # snapshot; the compare-and-set to the next group. SQLite reads the group after the outcome.
    if app.settings.database_url.startswith("postgresql"):
        assert statements == ["WITH", "WITH", "WITH"], statements
    else:
        assert statements == ["UPDATE", "INSERT", "DELETE", "UPDATE", "SELECT", "SELECT", "UPDATE", "UPDATE"]
    with transaction(app.settings.database_url) as session:
        assert session.get_one(ScheduleExecution, execution_id).current_step_index == 1


def test_a_groups_last_outcome_reads_the_group_as_a_read_after_it_would(app: ChordbeatCelery) -> None:
    """The latest attempt's outcome of each step, the one being recorded with them, the next group."""
    groups = [[step("a", max_attempts=2), step("b")], [step("c")]]
    service.apply_schedule(app, {"name": "same", "every": 3600, "steps": groups})
    execution_id = service.trigger_schedule(app, "same")["execution_id"]
    url = app.settings.database_url
    a_id, b_id = _group(app, execution_id, 0)
    with transaction(url) as session:
        assert claim_step(session.connection(), a_id, 1, node="here", now=utcnow()) is not None
    with transaction(url) as session:
        requeue_attempt(session, a_id, 1, reason="worker lost", now=utcnow())
    recorded = []
    for task_id, attempt, status in ((b_id, 1, ActivityStatus.FAILED_WITH_ERROR), (a_id, 2, ActivityStatus.COMPLETE)):
        with autocommit(url) as conn:
            claim = claim_step(conn, task_id, attempt, node="here", now=utcnow())
            assert claim is not None
            error = "boom" if status.failed else None
            recorded.append(finish_step(conn, claim, status, now=utcnow(), error=error))
    assert [(r.closed, r.last_of_group) for r in recorded] == [(True, False), (True, True)]
    assert recorded[0].group is None
    with autocommit(url, read_only=True) as conn:
        after = read_group(conn, execution_id, 0)
    assert after is not None and after.outcome().verdict is Verdict.FAIL
    if url.startswith("postgresql"):
        assert recorded[1].group == after
    else:
        assert recorded[1].group is None  # two statements there: the advancement reads it


def test_reading_the_last_group_gives_no_next_one(app: ChordbeatCelery) -> None:
    service.apply_schedule(app, {"name": "last", "every": 3600, "steps": [step("a"), step("b")]})
    execution_id = service.trigger_schedule(app, "last")["execution_id"]
    _finish_group(app, execution_id, 0)
    assert advance_group(app.settings.database_url, execution_id, 0, now=utcnow()).dispatch
    _finish_group(app, execution_id, 1)
    with autocommit(app.settings.database_url, read_only=True) as conn:
        last = read_group(conn, execution_id, 1)
    assert last is not None and last.next_group is None
    assert last.outcome().verdict is Verdict.COMPLETE


def test_the_broker_channel_sends_through_one_client_per_connection_pool(app: ChordbeatCelery) -> None:
    # kombu built a Redis client for every publish, acknowledgement and record of an
    # unacknowledged message: several a step, in the worker and in its pool.
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        client = channel._create_client()
        assert channel._create_client() is client
        queue = conn.SimpleQueue("cost-client")
        queue.put({"n": 1})
        message = queue.get(timeout=5)
        assert message.payload == {"n": 1}
        message.ack()
        assert channel._create_client() is client
        channel._pool = None  # as kombu leaves it after closing a connection that broke
        fresh = channel._create_client()
        assert fresh is not client and fresh.connection_pool is channel.pool
        queue.close()


def test_a_groups_chord_is_counted_by_the_result_backend_and_subscribes_to_no_result(app: ChordbeatCelery) -> None:
    # Celery's chord().apply_async() builds a group result for a caller to wait on, which subscribes
    # to each part's result channel (and unsubscribes once it is collected): nobody waits on them.
    spec = StepSpec.from_json({"name": "a", "task": "chordbeat.examples.sleep"})
    steps = (StepDispatch(7, 11, 1, spec, 0x2A), StepDispatch(7, 12, 1, spec, 0x2A))
    group = GroupDispatch(7, 1, steps, schedule_name="s")
    client = get_redis(app.settings.broker_url)

    def subscribed() -> int:
        return int(client.info("commandstats").get("cmdstat_subscribe", {}).get("calls", 0))

    before = subscribed()
    dispatch.send_group(app, group)
    assert subscribed() == before
    queue = [key for key in client.keys(f"{STEPS_QUEUE}*") if client.type(key) == "list"]
    messages = [json.loads(raw) for key in queue for raw in client.lrange(key, 0, -1)]
    parts = sorted((m["headers"]["group_index"], m["headers"]) for m in messages)
    assert [(index, headers["id"]) for index, headers in parts] == [
        (0, "chordbeat-e7-wt11-a1-r2a"),
        (1, "chordbeat-e7-wt12-a1-r2a"),
    ]
    group_id = parts[0][1]["group"]
    assert parts[1][1]["group"] == group_id
    assert client.get(f"celery-taskset-meta-{group_id}.s") == "2"  # the backend counts the parts against it
    for message in messages:
        _args, _kwargs, embed = json.loads(b64decode(message["body"]))
        body = embed["chord"]
        assert (body["task"], body["args"], body["options"]["group_id"]) == (dispatch.ADVANCE, [7, 1], group_id)


def test_a_worker_loads_the_database_driver_before_its_pool_forks(settings: Settings, tmp_path: Path) -> None:
    # Loaded by each pool process at its first step, the driver (with its bundled libpq) was a
    # private copy in every process; loaded before the fork, its pages are shared.
    if not settings.database_url.startswith("postgresql"):
        pytest.skip("SQLite's driver is part of the standard library, loaded with it")
    with processes.worker(settings, tmp_path, concurrency=1) as worker:
        wait_for(lambda: "ready" in worker.output(), 60, interval=0.1, what="the worker to be ready")

        def child() -> int | None:
            found = subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True, text=True).stdout.split()
            return int(found[0]) if found else None

        pid = wait_for(child, 10, interval=0.05, what="the pool process")
        # It has run no step: whatever of the driver it maps, it had from its parent.
        assert "psycopg" in Path(f"/proc/{pid}/maps").read_text()


def test_the_step_paths_driver_statements_fail_as_sqlalchemys_would(app: ChordbeatCelery) -> None:
    # On PostgreSQL the claim and the outcome go straight to the driver (celeryapp.execution.
    # driver_sql): the runner still tells a database away (tried again) from a refused statement.
    url = app.settings.database_url
    if not url.startswith("postgresql"):
        pytest.skip("SQLite's step path runs through SQLAlchemy")
    service.apply_schedule(app, {"name": "errors", "every": 3600, "steps": [step("a")]})
    execution_id = service.trigger_schedule(app, "errors")["execution_id"]
    (task_id,) = _group(app, execution_id, 0)
    with pytest.raises(DataError) as refused, connection(url) as conn:
        claim_step(conn, task_id, 2**40, node="here", now=utcnow())  # no such integer
    assert refused.value.orig is not None and not database_patience.transient(refused.value)
    with pytest.raises(OperationalError) as away, connection(url) as conn:
        backend = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with autocommit(url) as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
        claim_step(conn, task_id, 1, node="here", now=utcnow())
    assert isinstance(away.value, DBAPIError) and away.value.connection_invalidated
    assert database_patience.transient(away.value)
    with connection(url) as conn:  # a new connection, and the attempt is still there to claim
        assert claim_step(conn, task_id, 1, node="here", now=utcnow()) is not None


def test_an_advancements_statements_go_to_the_driver_on_postgresql(app: ChordbeatCelery) -> None:
    # The chord's body reads every group, and the compare-and-set moves every run on: like the
    # claim and the outcome, sent to the driver (SQLAlchemy's listeners see them before, its
    # execution does not run: no after_cursor_execute).
    url = app.settings.database_url
    if not url.startswith("postgresql"):
        pytest.skip("SQLite's advancement runs through SQLAlchemy")
    service.apply_schedule(app, {"name": "driven", "every": 3600, "steps": [[step("a"), step("b")], step("c")]})
    execution_id = service.trigger_schedule(app, "driven")["execution_id"]
    _finish_group(app, execution_id, 0)
    executed: list[str] = []
    engine = get_engine(url)

    def listener(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        executed.append(statement.split()[0])

    event.listen(engine, "after_cursor_execute", listener)
    try:
        with recorded_statements(app) as statements:
            assert advance_group(url, execution_id, 0, now=utcnow()).dispatch
    finally:
        event.remove(engine, "after_cursor_execute", listener)
    assert statements == ["SELECT", "WITH"], statements
    assert executed == [], executed


def test_a_message_taken_and_acknowledged_costs_one_redis_command_each(app: ChordbeatCelery) -> None:
    # kombu records a message taken (its time in unacked_index, the message in unacked) and forgets
    # it once acknowledged, each in a MULTI/EXEC transaction: four commands and replies each time.
    client = get_redis(app.settings.broker_url)

    def calls(command: str) -> int:
        return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))

    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue("cost-unacked")
        queue.put({"n": 0})
        queue.get(timeout=5).ack()  # this Redis has now seen the scripts (no NOSCRIPT and load)
        queue.put({"n": 1})
        transactions, scripts = calls("multi"), calls("evalsha")
        message = queue.get(timeout=5)
        tag = message.delivery_tag
        assert client.zscore("unacked_index", tag) is not None
        assert json.loads(client.hget("unacked", tag) or "null")[2] == "cost-unacked"  # the routing key
        message.ack()
        assert client.zscore("unacked_index", tag) is None and client.hget("unacked", tag) is None
        assert (calls("multi"), calls("evalsha")) == (transactions, scripts + 2)
        queue.close()


def test_a_steps_pickup_and_first_heartbeat_are_one_redis_command_each(app: ChordbeatCelery) -> None:
    # Each was a pipeline of two commands: the pickup lease written and the dispatch marker
    # deleted (in the worker's main process), the first heartbeat written and the operator's stop
    # flag read (in the pool process, as the step starts).
    client = get_redis(app.settings.broker_url)

    def calls(command: str) -> int:
        return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))

    dispatch.take_message(app, 5, 1, 0x2A)  # this Redis has now seen the scripts (no NOSCRIPT and load)
    with StepWatch(client, heartbeat_key="hb:5", cancel_key="cancel:5", stop_key="stop:5", ttl_s=30):
        pass
    client.set(keys.dispatch_marker_key(6, 1, 0x2A), "1")
    client.set("stop:6", "stopped by hand")
    scripts = calls("evalsha")  # (the commands a script runs count as themselves too)
    dispatch.take_message(app, 6, 1, 0x2A)
    assert client.pttl(keys.pickup_key(6, 1, 0x2A)) > 0 and not client.exists(keys.dispatch_marker_key(6, 1, 0x2A))
    watch = StepWatch(client, heartbeat_key="hb:6", cancel_key="cancel:6", stop_key="stop:6", ttl_s=30)
    with watch:
        assert watch.stopped == "stopped by hand" and client.pttl("hb:6") > 0
    assert calls("evalsha") == scripts + 2
