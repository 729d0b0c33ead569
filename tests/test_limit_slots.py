"""Slots of shared limits taken and released in transactions, on SQLite and PostgreSQL: never more
held than a limit's slots (checked by a query while threads hammer it), all needs at once or none,
a fenced attempt releasing nothing of its successor's, a release admitting the next waiters first
come first served within a key and round-robin across keys, and no waiter left behind."""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from celeryapp.domain.shared_limits import parse_limit
from celeryapp.errors import InvalidArgument, InvalidTransition, NotFound
from celeryapp.execution.limit_slots import (
    Admitted,
    Demand,
    Holder,
    _decide,  # the pass alone, given what it locked
    acquire_or_wait,
    release,
    settle,
)
from celeryapp.execution.limit_store import delete_limit, limit_detail, limit_summaries, put_limit
from models import get_engine, transaction, utcnow
from models.limit_tables import LIMIT_HOLDS, LIMIT_WAITERS, LIMITS

pytestmark = pytest.mark.both_databases

_ids = itertools.count(1)


def holder(attempt: int = 1, worker_task_id: int | None = None) -> Holder:
    number = worker_task_id if worker_task_id is not None else next(_ids)
    return Holder(number, attempt, execution_id=1000 + number, step_name=f"step-{number}")


def define(url: str, **raw: Any) -> int:
    with transaction(url) as session:
        return put_limit(session, parse_limit(raw)).id


def acquire(url: str, who: Holder, *demands: Demand) -> tuple[bool, Admitted]:
    with transaction(url) as session:
        return acquire_or_wait(session, list(demands), who)


def give_back(url: str, who: Holder) -> tuple[int, tuple[Holder, ...]]:
    with transaction(url) as session:
        released = release(session, who.worker_task_id, who.attempt)
    return released.slots, released.admitted.started


def held(url: str) -> dict[str, int]:
    """Slots held per limit, counted from the holds, checked against each limit's ``in_use``."""
    with transaction(url, read_only=True) as session:
        counted = {
            name: int(slots)
            for name, slots in session.execute(
                select(LIMITS.c.name, func.coalesce(func.sum(LIMIT_HOLDS.c.slots), 0))
                .outerjoin(LIMIT_HOLDS, LIMIT_HOLDS.c.limit_id == LIMITS.c.id)
                .group_by(LIMITS.c.name)
            )
        }
        in_use = {name: n for name, n in session.execute(select(LIMITS.c.name, LIMITS.c.in_use))}
    assert counted == in_use
    return in_use


def waiting(url: str) -> int:
    with transaction(url, read_only=True) as session:
        return int(session.scalar(select(func.count()).select_from(LIMIT_WAITERS)) or 0)


def test_slots_are_taken_up_to_the_limit_then_waiters_wait_and_a_release_admits_the_oldest(database_url: str) -> None:
    define(database_url, name="warehouse", slots=2)
    first, second, third, fourth = (holder() for _ in range(4))
    assert acquire(database_url, first, Demand("warehouse"))[0]
    assert acquire(database_url, second, Demand("warehouse"))[0]
    assert not acquire(database_url, third, Demand("warehouse"))[0]
    assert not acquire(database_url, fourth, Demand("warehouse"))[0]
    # A redelivered message: the same answer, nothing taken twice.
    assert acquire(database_url, first, Demand("warehouse"))[0]
    assert not acquire(database_url, third, Demand("warehouse"))[0]
    assert (held(database_url), waiting(database_url)) == ({"warehouse": 2}, 2)
    assert give_back(database_url, second) == (1, (third,))
    assert give_back(database_url, second) == (0, ())
    assert give_back(database_url, first) == (1, (fourth,))
    assert (held(database_url), waiting(database_url)) == ({"warehouse": 2}, 0)
    with transaction(database_url, read_only=True) as session:
        detail = limit_detail(session, "warehouse")
        assert [h["step"] for h in detail["holders"]] == [third.step_name, fourth.step_name]
        assert detail["keys"] == {"": 2} and detail["waiters"] == []
        assert limit_summaries(session) == [
            {
                **parse_limit({"name": "warehouse", "slots": 2}).to_json(),
                **{"version": 1, "in_use": 2, "waiting": 0, "oldest_waiting_since": None},
            }
        ]


def test_all_needs_are_taken_at_once_or_none(database_url: str) -> None:
    define(database_url, name="warehouse", slots=3)
    define(database_url, name="erp", slots=1)
    erp_user, both = holder(), holder()
    assert acquire(database_url, erp_user, Demand("erp"))[0]
    assert not acquire(database_url, both, Demand("warehouse", slots=2), Demand("erp"))[0]
    # No partial hold: the warehouse's slots stay free while the waiter waits for the ERP.
    assert held(database_url) == {"warehouse": 0, "erp": 1}
    assert give_back(database_url, erp_user) == (1, (both,))
    assert held(database_url) == {"warehouse": 2, "erp": 1}


def test_a_fenced_attempt_releases_nothing_of_its_successors(database_url: str) -> None:
    define(database_url, name="warehouse", slots=1)
    lost, retry = holder(attempt=1, worker_task_id=7), holder(attempt=2, worker_task_id=7)
    waiter = holder()
    assert acquire(database_url, lost, Demand("warehouse"))[0]
    # Recovery found attempt 1 lost and released its slot; attempt 2 took it.
    assert give_back(database_url, lost) == (1, ())
    assert acquire(database_url, retry, Demand("warehouse"))[0]
    assert not acquire(database_url, waiter, Demand("warehouse"))[0]
    # Attempt 1's late finish releases what it holds: nothing any more.
    assert give_back(database_url, lost) == (0, ())
    assert (held(database_url), waiting(database_url)) == ({"warehouse": 1}, 1)
    assert give_back(database_url, retry) == (1, (waiter,))


def test_a_release_serves_keys_round_robin_and_each_key_first_come_first_served(database_url: str) -> None:
    define(database_url, name="warehouse", slots=1, key="{payload.customer}")
    running = holder()
    assert acquire(database_url, running, Demand("warehouse", "acme"))[0]
    acme = [holder() for _ in range(4)]
    for who in acme:
        assert not acquire(database_url, who, Demand("warehouse", "acme"))[0]
    globex = [holder() for _ in range(2)]
    for who in globex:
        assert not acquire(database_url, who, Demand("warehouse", "globex"))[0]
    served = []
    current = running
    while True:
        _slots, started = give_back(database_url, current)
        if not started:
            break
        (current,) = started
        served.append(current)
    assert served == [acme[0], globex[0], acme[1], globex[1], acme[2], acme[3]]


def test_per_key_slots_bound_each_key_and_a_full_key_does_not_block_the_others(database_url: str) -> None:
    define(database_url, name="warehouse", slots=3, key="{payload.customer}", per_key_slots=1)
    a1, a2, b1 = holder(), holder(), holder()
    assert acquire(database_url, a1, Demand("warehouse", "acme"))[0]
    assert not acquire(database_url, a2, Demand("warehouse", "acme"))[0]
    assert acquire(database_url, b1, Demand("warehouse", "globex"))[0]
    assert give_back(database_url, b1) == (1, ())
    assert give_back(database_url, a1) == (1, (a2,))


def test_unknown_limits_and_needs_that_can_never_fit_are_refused_and_store_nothing(database_url: str) -> None:
    define(database_url, name="warehouse", slots=2)
    with pytest.raises(NotFound, match="'nope'"):
        acquire(database_url, holder(), Demand("nope"))
    with pytest.raises(InvalidArgument, match="uses"):
        acquire(database_url, holder(), Demand("warehouse", slots=3))
    with pytest.raises(InvalidArgument, match="twice"):
        acquire(database_url, holder(), Demand("warehouse"), Demand("warehouse"))
    with pytest.raises(InvalidArgument, match="key"):
        acquire(database_url, holder(), Demand("warehouse", "k" * 201))
    assert (held(database_url), waiting(database_url)) == ({"warehouse": 0}, 0)


def test_a_resize_never_preempts_and_a_larger_limit_admits_on_settle(database_url: str) -> None:
    limit_id = define(database_url, name="warehouse", slots=2)
    a, b, c = holder(), holder(), holder()
    assert acquire(database_url, a, Demand("warehouse"))[0] and acquire(database_url, b, Demand("warehouse"))[0]
    assert not acquire(database_url, c, Demand("warehouse"))[0]
    define(database_url, name="warehouse", slots=1)
    assert held(database_url) == {"warehouse": 2}
    assert give_back(database_url, a) == (1, ())  # still one held of one
    define(database_url, name="warehouse", slots=3)
    with transaction(database_url) as session:
        assert settle(session, [limit_id]).started == (c,)


def test_a_held_limit_is_deleted_only_with_force(database_url: str) -> None:
    define(database_url, name="warehouse", slots=1)
    a, b = holder(), holder()
    assert acquire(database_url, a, Demand("warehouse"))[0]
    assert not acquire(database_url, b, Demand("warehouse"))[0]
    with pytest.raises(InvalidTransition, match="held"), transaction(database_url) as session:
        delete_limit(session, "warehouse", force=False)
    with transaction(database_url) as session:
        deleted = delete_limit(session, "warehouse", force=True)
    assert (deleted.held_slots, deleted.dropped_waiters) == (1, ((b.worker_task_id, b.attempt),))
    assert (held(database_url), waiting(database_url)) == ({}, 0)
    assert give_back(database_url, a) == (0, ())


def test_a_rate_admits_its_burst_then_the_next_start_when_its_token_comes(database_url: str) -> None:
    limit_id = define(database_url, name="api", slots=10, rate="2/min")
    start = utcnow()
    first, second, third = holder(), holder(), holder()
    with transaction(database_url) as session:
        assert acquire_or_wait(session, [Demand("api")], first, now=start)[0]
        assert acquire_or_wait(session, [Demand("api")], second, now=start)[0]
    with transaction(database_url) as session:
        is_held, admitted = acquire_or_wait(session, [Demand("api")], third, now=start)
    # The bucket was stored: the third start waits for the token due 30 s after the burst.
    assert not is_held and admitted.wake_at == start + timedelta(seconds=30)
    with transaction(database_url) as session:
        assert settle(session, [limit_id], now=start + timedelta(seconds=29)).started == ()
    with transaction(database_url) as session:
        assert settle(session, [limit_id], now=start + timedelta(seconds=30)).started == (third,)


def test_releasing_a_waiter_removes_its_wait_and_gives_back_nothing(database_url: str) -> None:
    define(database_url, name="warehouse", slots=1)
    running, cancelled, next_one = holder(), holder(), holder()
    assert acquire(database_url, running, Demand("warehouse"))[0]
    assert not acquire(database_url, cancelled, Demand("warehouse"))[0]
    assert not acquire(database_url, next_one, Demand("warehouse"))[0]
    assert give_back(database_url, cancelled) == (0, ())
    assert waiting(database_url) == 1
    assert give_back(database_url, running) == (1, (next_one,))


def test_a_waiter_a_smaller_limit_can_never_admit_is_reported_and_removed(database_url: str) -> None:
    limit_id = define(database_url, name="warehouse", slots=3)
    running, big, small = holder(), holder(), holder()
    assert acquire(database_url, running, Demand("warehouse", slots=2))[0]
    assert not acquire(database_url, big, Demand("warehouse", slots=3))[0]
    assert not acquire(database_url, small, Demand("warehouse"))[0]
    define(database_url, name="warehouse", slots=2)
    with transaction(database_url) as session:
        admitted = settle(session, [limit_id])
    assert (admitted.started, admitted.impossible) == ((), (big,))
    assert waiting(database_url) == 1
    assert give_back(database_url, running) == (2, (small,))


def test_deleting_a_limit_drops_every_wait_of_its_waiters_so_none_starts_with_a_part(database_url: str) -> None:
    define(database_url, name="warehouse", slots=1)
    erp = define(database_url, name="erp", slots=1)
    running, both = holder(), holder()
    assert acquire(database_url, running, Demand("warehouse"))[0]
    assert not acquire(database_url, both, Demand("warehouse"), Demand("erp"))[0]
    with transaction(database_url) as session:
        assert delete_limit(session, "warehouse", force=True).dropped_waiters == ((both.worker_task_id, 1),)
    # Its ERP wait went too: a pass on the free ERP does not start it with the ERP alone.
    with transaction(database_url) as session:
        assert settle(session, [erp]).started == ()
    assert (held(database_url), waiting(database_url)) == ({"erp": 0}, 0)


def test_a_pass_that_did_not_lock_a_waiters_other_limit_leaves_it_waiting(database_url: str) -> None:
    """A waiter that arrived needing a limit a pass has not locked (between the pass's look and its
    locks) is left to a later pass: neither started nor judged impossible, whatever it asks of it."""
    warehouse = define(database_url, name="warehouse", slots=1)
    erp = define(database_url, name="erp", slots=3)
    running, both = holder(), holder()
    assert acquire(database_url, running, Demand("warehouse"))[0]
    assert not acquire(database_url, both, Demand("warehouse"), Demand("erp", slots=2))[0]
    with transaction(database_url) as session:
        decided = _decide(session, {warehouse}, utcnow())  # the ERP left unlocked
    assert (decided.started, decided.impossible, decided.recheck) == ((), (), frozenset({erp}))
    assert waiting(database_url) == 2


@contextmanager
def statements_of(url: str) -> Iterator[list[str]]:
    """The first word of each statement sent to ``url``'s engine inside the block (BEGIN left out)."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.startswith("BEGIN"):
            sent.append(statement.split()[0])

    engine = get_engine(url)
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_a_slot_with_room_is_taken_in_four_statements_and_given_back_in_four(database_url: str) -> None:
    """The uncontended path (nobody waits, the limit and the key have room), the cost of
    bench/limits.py's cycles: the limit locked and read, the hold made under its conditions, the
    count guarded, the admission counted; given back: what the attempt holds, the lock, the hold
    deleted, the count guarded (with whether anyone waits, so no pass runs). Fails if it grows."""
    define(database_url, name="customers", slots=10, key="{payload.customer}", per_key_slots=1)
    who = holder()
    with statements_of(database_url) as acquiring:
        assert acquire(database_url, who, Demand("customers", "acme")) == (True, Admitted())
    with statements_of(database_url) as releasing:
        assert give_back(database_url, who) == (1, ())
    assert acquiring == ["SELECT", "INSERT", "UPDATE", "INSERT"]
    assert releasing == ["SELECT", "SELECT", "DELETE", "UPDATE"]
    assert (held(database_url), waiting(database_url)) == ({"customers": 0}, 0)


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


class Hammer:
    """Threads taking and giving back slots, each waiter woken as a release's caller wakes it (by
    the admissions the release returns), while another thread checks by a query, every few
    milliseconds, that nothing is over its limit."""

    def __init__(self, url: str, stop: threading.Event, over: Callable[[Session], str | None]) -> None:
        self.url, self.stop, self.over = url, stop, over
        self.woken: dict[Holder, threading.Event] = {}
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.most_held = 0

    def wake(self, admitted: Admitted) -> None:
        started = admitted.started
        if admitted.recheck:
            with transaction(self.url) as session:
                started += settle(session, admitted.recheck).started
        with self.lock:
            for who in started:
                self.woken.setdefault(who, threading.Event()).set()

    def watch(self) -> None:
        while not self.stop.is_set():
            with transaction(self.url, read_only=True) as session:
                problem = self.over(session)
                held_now = session.scalar(select(func.coalesce(func.sum(LIMIT_HOLDS.c.slots), 0))) or 0
            self.most_held = max(self.most_held, held_now)
            if problem is not None:
                self.errors.append(AssertionError(problem))
                return
            self.stop.wait(0.002)  # a query every few milliseconds leaves the workers the processor

    def work(self, seed: int, cycles: int, choose: Callable[[random.Random], list[Demand]]) -> None:
        chooser = random.Random(seed)
        try:
            for _ in range(cycles):
                who = holder()
                with self.lock:
                    self.woken[who] = threading.Event()
                is_held, admitted = acquire(self.url, who, *choose(chooser))
                self.wake(admitted)
                if not is_held and not self.woken[who].wait(60):
                    raise AssertionError(f"{who} was never admitted")
                with transaction(self.url) as session:
                    released = release(session, who.worker_task_id, who.attempt)
                self.wake(released.admitted)
        except BaseException as exc:
            self.errors.append(exc)

    def run(self, threads: int, cycles: int, choose: Callable[[random.Random], list[Demand]]) -> None:
        watcher = threading.Thread(target=self.watch, daemon=True)
        watcher.start()
        workers = [threading.Thread(target=self.work, args=(seed, cycles, choose)) for seed in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        self.stop.set()
        watcher.join()
        assert self.errors == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_threads_hammering_a_limit_never_hold_more_than_its_slots_and_leave_nothing_behind(
    database_url: str, stop: threading.Event
) -> None:
    define(database_url, name="warehouse", slots=3, key="{payload.customer}", per_key_slots=2)

    def over(session: Session) -> str | None:
        per_key = session.execute(select(func.sum(LIMIT_HOLDS.c.slots)).group_by(LIMIT_HOLDS.c.key)).scalars().all()
        in_use = session.scalar(select(LIMITS.c.in_use)) or 0
        if sum(per_key) > 3 or in_use > 3 or any(n > 2 for n in per_key):
            return f"over the limit: {sum(per_key)} held, in_use {in_use}, per key {per_key}"
        return None

    hammer = Hammer(database_url, stop, over)
    hammer.run(5, 200, lambda chooser: [Demand("warehouse", chooser.choice(["acme", "globex", "initech"]))])
    assert hammer.most_held >= 2  # the limit was contended, not run one at a time
    assert (held(database_url), waiting(database_url)) == ({"warehouse": 0}, 0)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_threads_needing_overlapping_sets_of_limits_never_deadlock_nor_over_admit(
    database_url: str, stop: threading.Event
) -> None:
    """Waiters needing one limit, the other or both: the locks are always taken in one order
    (PostgreSQL would abort a deadlock's victim, and the test would see it), all needs at once,
    and every waiter is admitted in the end, rechecks included."""
    for name in ("erp", "warehouse"):
        define(database_url, name=name, slots=2)
    choices = [("erp",), ("warehouse",), ("erp", "warehouse"), ("warehouse", "erp")]

    def over(session: Session) -> str | None:
        totals = session.execute(select(func.sum(LIMIT_HOLDS.c.slots)).group_by(LIMIT_HOLDS.c.limit_id)).scalars().all()
        return f"over a limit: {totals}" if any(total > 2 for total in totals) else None

    Hammer(database_url, stop, over).run(4, 100, lambda chooser: [Demand(name) for name in chooser.choice(choices)])
    assert (held(database_url), waiting(database_url)) == ({"erp": 0, "warehouse": 0}, 0)
