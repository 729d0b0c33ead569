"""The rules of alert delivery (celeryapp.domain.alert_delivery) and the messages' bounds, as properties."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from celeryapp.alerting import messages
from celeryapp.alerting.messages import AlertText
from celeryapp.domain.alert_delivery import (
    FIRST_BACKOFF_S,
    MAX_BACKOFF_S,
    RATE_WINDOW_S,
    backoff_s,
    gives_up,
    next_try_at,
    plan_channel,
)

T0 = datetime(2026, 11, 24, 2, 0, tzinfo=UTC)
attempts = st.integers(min_value=-5, max_value=10_000)
retry_for = st.floats(min_value=3600, max_value=30 * 86400)
elapsed = st.floats(min_value=0, max_value=60 * 86400)


@given(attempts)
def test_the_backoff_grows_and_stays_within_its_bounds(n: int) -> None:
    assert FIRST_BACKOFF_S <= backoff_s(n) <= MAX_BACKOFF_S
    assert backoff_s(n) <= backoff_s(n + 1)


def test_the_backoff_doubles_from_five_seconds_to_ten_minutes() -> None:
    assert [backoff_s(n) for n in range(1, 10)] == [5, 10, 20, 40, 80, 160, 320, 600, 600]


@given(attempts, retry_for, elapsed)
def test_a_failed_delivery_is_tried_again_within_the_retry_time_or_given_up(n: int, for_s: float, e: float) -> None:
    now = T0 + timedelta(seconds=e)
    later = next_try_at(T0, now, n, for_s)
    if later is None:
        assert gives_up(T0, now, for_s) and e >= for_s
    else:
        assert not gives_up(T0, now, for_s)
        assert now < later <= T0 + timedelta(seconds=for_s)
        assert later <= now + timedelta(seconds=backoff_s(n))


@given(retry_for)
def test_a_receiver_down_for_the_whole_retry_time_is_tried_until_its_end(for_s: float) -> None:
    """Whatever the backoff, the tries reach the end of the retry time, and the one there gives up."""
    now, n = T0, 0
    while (later := next_try_at(T0, now, n + 1, for_s)) is not None:
        now, n = later, n + 1
    assert now == T0 + timedelta(seconds=for_s) and n >= 1


@given(
    st.integers(min_value=-3, max_value=1000),
    st.integers(min_value=0, max_value=100),
    st.booleans(),
    st.integers(min_value=1, max_value=100),
)
def test_a_window_carries_at_most_the_limit_and_one_summary(due: int, sent: int, summarised: bool, limit: int) -> None:
    plan = plan_channel(due, sent, summarised, limit)
    assert min(plan.send, plan.summarise, plan.hold) >= 0
    assert plan.send + plan.summarise + plan.hold == max(due, 0)
    assert sent + plan.send <= max(limit, sent)  # never more alerts than the limit
    assert plan.summarise == 0 or not summarised  # one summary per window
    # Nothing held back that the window had room for.
    assert plan.send == min(max(due, 0), max(limit - sent, 0))
    assert plan.hold == 0 or summarised


def test_the_rate_window_is_a_minute() -> None:
    assert RATE_WINDOW_S == 60


text = st.text(alphabet=st.characters(codec="utf-8"), max_size=300)


@given(kind=st.sampled_from(["failed", "late", "test"]), schedule=text, message=st.text(max_size=10_000))
def test_a_subject_is_one_bounded_line_and_every_body_is_bounded(kind: str, schedule: str, message: str) -> None:
    alert = AlertText(key="k", kind=kind, schedule_name=schedule, message=message, at=T0, slot_at=T0)
    subject = messages.subject(alert)
    assert subject.startswith(f"[chordbeat] {kind}") and len(subject) <= messages.SUBJECT_CHARS
    assert not any(c in subject for c in "\r\n\x00\x0b\x0c\x85\u2028\u2029")
    assert all(c.isprintable() for c in subject)
    slack = messages.slack_body(alert, "https://chordbeat.example.com")
    assert len(slack.decode()) <= messages.SLACK_TEXT_CHARS + 100  # JSON's quoting of the bounded text
    email = messages.email(alert, sender="chordbeat@example.com", to=("ops@example.com",), dashboard_url=None)
    assert email["Subject"] == subject and email["To"] == "ops@example.com"


@given(st.text(max_size=20_000), st.integers(min_value=0, max_value=5000))
def test_a_cut_text_fits_its_bound_and_says_it_was_cut(value: str, limit: int) -> None:
    out = messages.cut(value, limit)
    assert out == value if len(value) <= limit else out.endswith(messages.CUT_MARK)
    assert len(out) <= max(limit, len(messages.CUT_MARK))
