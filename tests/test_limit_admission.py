"""The admission decision of shared limits, pure: hypothesis checks that it never over-admits, admits
every waiter that fits unless an earlier one of its own queue waits, keeps each queue first come
first served, gives the same answer for any input order, and serves keys round-robin."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.limit_admission import (
    Admission,
    Bucket,
    LimitState,
    Need,
    Waiter,
    admit,
    full_bucket,
    order,
    turn_of,
)

NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)
KEYS = ("acme", "globex", "initech")


@st.composite
def limit_states(draw: st.DrawFn) -> LimitState:
    slots = draw(st.integers(1, 6))
    per_key = draw(st.none() | st.integers(1, slots))
    held: Counter[str] = Counter()
    for key in KEYS:
        room = min(slots - sum(held.values()), per_key if per_key is not None else slots)
        held[key] = draw(st.integers(0, max(0, room)))
    bucket = draw(
        st.none()
        | st.builds(
            Bucket,
            capacity=st.integers(1, 4),
            per_s=st.sampled_from([0.5, 1.0, 10.0]),
            level=st.floats(0, 4),
            at=st.sampled_from([NOW - timedelta(seconds=1), NOW, NOW + timedelta(seconds=1)]),
        )
    )
    if bucket is not None:
        bucket = Bucket(bucket.capacity, bucket.per_s, min(bucket.level, bucket.capacity), bucket.at)
    return LimitState(slots, sum(held.values()), per_key, {k: n for k, n in held.items() if n}, bucket)


@st.composite
def situations(draw: st.DrawFn) -> tuple[dict[str, LimitState], list[Waiter]]:
    limits = {name: draw(limit_states()) for name in draw(st.sets(st.sampled_from("abc"), min_size=1))}
    names = [*sorted(limits), "gone"]
    waiters = []
    for holder in range(draw(st.integers(0, 14))):
        # Now and then a limit deleted since the waiter came.
        used = draw(st.sets(st.sampled_from(names), min_size=1, max_size=3))
        needs = frozenset(Need(limit, draw(st.sampled_from(KEYS)), draw(st.integers(1, 3))) for limit in used)
        waiters.append(Waiter(holder, draw(st.integers(0, 4)), 1000 + holder, needs))
    return limits, waiters


def held_after(limits: dict[str, LimitState], waiters: list[Waiter], admission: Admission) -> dict[str, LimitState]:
    return {name: admission.limits.get(name, state) for name, state in limits.items()}


@given(situations())
@settings(max_examples=150, deadline=None)
def test_never_over_admits(situation: tuple[dict[str, LimitState], list[Waiter]]) -> None:
    limits, waiters = situation
    admission = admit(limits, waiters, NOW)
    after = held_after(limits, waiters, admission)
    by_holder = {waiter.holder: waiter for waiter in waiters}
    for name, state in limits.items():
        needs = [need for holder in admission.admitted for need in by_holder[holder].needs if need.limit == name]
        keys = Counter(dict(state.key_in_use))
        for need in needs:
            keys[need.key] += need.slots
        assert after[name].in_use == state.in_use + sum(need.slots for need in needs) <= state.slots
        assert dict(after[name].key_in_use) == {k: n for k, n in keys.items() if n or k in after[name].key_in_use}
        if state.per_key_slots is not None:
            assert all(n <= state.per_key_slots for n in keys.values())
        if state.bucket is not None:
            # One token per start, never below zero.
            assert len(needs) <= state.bucket.level_at(NOW) + 1e-9
            bucket_after = after[name].bucket
            assert bucket_after is not None and bucket_after.level_at(NOW) >= -1e-9


@given(situations())
@settings(max_examples=150, deadline=None)
def test_admits_whenever_it_fits_and_no_earlier_waiter_of_its_queue_waits(
    situation: tuple[dict[str, LimitState], list[Waiter]],
) -> None:
    limits, waiters = situation
    admission = admit(limits, waiters, NOW)
    after = held_after(limits, waiters, admission)
    admitted, impossible = set(admission.admitted), set(admission.impossible)
    waiting_queues: set[frozenset[tuple[str, str]]] = set()
    for waiter in order(waiters):
        never = any(n.limit not in limits or n.slots > limits[n.limit].capacity() for n in waiter.needs)
        assert (waiter.holder in impossible) == never
        if never:
            continue
        if waiter.holder in admitted:
            # First come, first served within a queue: nothing admitted behind one that waits.
            assert waiter.queue not in waiting_queues
            continue
        fits_at_end = all(
            after[n.limit].room(n.key) >= n.slots
            and (after[n.limit].bucket is None or after[n.limit].bucket.level_at(NOW) >= 1.0)  # type: ignore[union-attr]
            for n in waiter.needs
        )
        assert waiter.queue in waiting_queues or not fits_at_end
        waiting_queues.add(waiter.queue)


@given(situations(), st.randoms(use_true_random=False))
@settings(max_examples=100, deadline=None)
def test_the_answer_does_not_depend_on_the_input_order(
    situation: tuple[dict[str, LimitState], list[Waiter]], shuffler: random.Random
) -> None:
    limits, waiters = situation
    shuffled = list(waiters)
    shuffler.shuffle(shuffled)
    assert admit(limits, shuffled, NOW) == admit(limits, waiters, NOW)


def _arrive(waiting: list[Waiter], holder: int, key: str, last_turn: dict[str, int]) -> Waiter:
    oldest = min((w.turn for w in waiting), default=None)
    waiter = Waiter(holder, turn_of(oldest, last_turn.get(key)), holder, frozenset({Need("warehouse", key)}))
    last_turn[key] = waiter.turn
    waiting.append(waiter)
    return waiter


@given(st.lists(st.sampled_from(KEYS), min_size=1, max_size=40), st.integers(1, 3))
@settings(max_examples=100, deadline=None)
def test_keys_are_served_round_robin_whatever_order_they_arrived_in(arrivals: list[str], slots: int) -> None:
    """All waiters arrive while the limit is full; then each release admits one: while two keys
    both wait, neither is served twice before the other once."""
    waiting: list[Waiter] = []
    last_turn: dict[str, int] = {}
    for holder, key in enumerate(arrivals):
        _arrive(waiting, holder, key, last_turn)
    served: list[str] = []
    order_served: list[int] = []
    state = LimitState(slots, in_use=slots)
    keys_of = {w.holder: next(iter(w.needs)).key for w in waiting}
    while waiting:
        state = LimitState(slots, in_use=state.in_use - 1)  # one release
        admission = admit({"warehouse": state}, waiting, NOW)
        assert len(admission.admitted) == 1
        state = admission.limits["warehouse"]
        served.append(keys_of[admission.admitted[0]])
        order_served.append(admission.admitted[0])
        waiting = [w for w in waiting if w.holder not in admission.admitted]
    total = Counter(arrivals)
    for index, key in enumerate(served):
        before = Counter(served[:index])
        for other in total:
            # ``other`` still had waiters and was served less: ``key`` may lead it by one only.
            if other != key and before[other] < total[other]:
                assert before[key] <= before[other], (served, index)
    # First come, first served within a key.
    for key in total:
        mine = [holder for holder in order_served if keys_of[holder] == key]
        assert mine == sorted(mine)


def test_a_newcomer_key_goes_second_not_after_the_whole_backlog() -> None:
    waiting: list[Waiter] = []
    last_turn: dict[str, int] = {}
    for holder in range(100):
        _arrive(waiting, holder, "acme", last_turn)
    admitted = admit({"warehouse": LimitState(1)}, waiting, NOW).admitted
    assert admitted == (0,)
    waiting = waiting[1:]
    newcomer = _arrive(waiting, 100, "globex", last_turn)
    assert admit({"warehouse": LimitState(1)}, waiting, NOW).admitted == (1,)
    waiting = waiting[1:]
    assert admit({"warehouse": LimitState(1)}, waiting, NOW).admitted == (newcomer.holder,)


def test_all_at_once_or_nothing_and_a_waiter_that_can_never_fit_is_reported() -> None:
    limits = {"warehouse": LimitState(3, in_use=2), "erp": LimitState(2)}
    both = Waiter(1, 0, 1, frozenset({Need("warehouse", "", 2), Need("erp", "", 1)}))
    erp_only = Waiter(2, 0, 2, frozenset({Need("erp", "", 2)}))
    huge = Waiter(3, 0, 3, frozenset({Need("erp", "", 3)}))
    admission = admit(limits, [both, erp_only, huge], NOW)
    assert (admission.admitted, admission.impossible) == ((2,), (3,))
    assert "warehouse" not in admission.limits and admission.limits["erp"].in_use == 2


def test_a_rate_admits_its_burst_then_says_when_the_next_token_comes() -> None:
    bucket = full_bucket(2, 1 / 30, NOW)  # 2/min
    waiters = [Waiter(h, 0, h, frozenset({Need("api", f"k{h}")})) for h in range(4)]
    admission = admit({"api": LimitState(10, bucket=bucket)}, waiters, NOW)
    assert admission.admitted == (0, 1)
    assert admission.wake_at == NOW + timedelta(seconds=30)
    later = admit(admission.limits, waiters[2:], NOW + timedelta(seconds=30))
    assert later.admitted == (2,)
    # The reference clock going back gives no token.
    assert admit(later.limits, waiters[3:], NOW).admitted == ()


def test_turns_follow_their_queue_and_never_fall_behind_the_oldest_waiting() -> None:
    assert turn_of(None, None) == 0
    assert turn_of(None, 7) == 8
    assert turn_of(5, None) == 5
    assert turn_of(5, 9) == 10
    assert turn_of(5, 2) == 5
