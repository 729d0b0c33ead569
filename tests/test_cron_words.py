"""Cron expressions in words (celeryapp.interfaces.cron_words), pure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.cron import CronExpression
from celeryapp.domain.cron_fields import CronError
from celeryapp.interfaces.cron_words import describe, ordinal


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("0 18 LW * *", "at 18:00 on the last weekday of the month"),
        ("0 2 * * 1#2", "at 02:00 on the second Monday of the month"),
        ("0 2 * * mon#2", "at 02:00 on the second Monday of the month"),
        ("0 0 * * 5L", "at 00:00 on the last Friday of the month"),
        ("59 23 L * *", "at 23:59 on the last day of the month"),
        ("0 9 15W * *", "at 09:00 on the weekday nearest the 15th of the month"),
        ("0 0 L 2 *", "at 00:00 on the last day of the month in February"),
        ("0 0 * * 1#1,5L", "at 00:00 on the first Monday and the last Friday of the month"),
        ("*/15 * * * *", "every 15 minutes"),
        ("* * * * *", "every minute"),
        ("30 2 * * *", "at 02:30 every day"),
        ("0 9,12,17 * * *", "at 09:00, 12:00 and 17:00 every day"),
        ("5 * * * *", "every hour at :05"),
        ("0 */6 * * *", "every 6 hours at :00"),
        ("0 9-17 * * mon-fri", "every hour from 09:00 to 17:00 on Monday to Friday"),
        ("*/5 9 * * *", "every 5 minutes from 09:00 to 09:59"),
        ("0 0 1,15 * *", "at 00:00 on the 1st and the 15th of the month"),
        ("0 0 13 * 5", "at 00:00 on the 13th of the month or on Friday"),  # POSIX: either day field
        ("0 0 1 jan,jul *", "at 00:00 on the 1st of the month in January and July"),
        ("0 0 * * 7", "at 00:00 on Sunday"),
        ("0-10/2 * * * *", "at minutes 0-10/2 of every hour every day"),
        ("0-10/2 1-5/2 * * *", "at minutes 0-10/2 of hours 1-5/2 every day"),  # no words of its own: quoted
    ],
)
def test_expressions_in_words(expr: str, words: str) -> None:
    assert describe(expr) == words


def test_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "23rd",
        "31st",
    ]


def test_an_invalid_expression_is_refused_not_described() -> None:
    with pytest.raises(CronError, match="day of week field"):
        describe("0 0 * * 1#6")


FIELD = st.sampled_from(["*", "*/2", "1", "1-5", "1,3", "2-4/2"])
DOM = st.sampled_from(["*", "L", "LW", "15W", "1", "1-7", "L,15", "*/3"])
DOW = st.sampled_from(["*", "5L", "1#2", "mon-fri", "sun", "1#1,5L", "*/2", "0-6/2"])


@settings(max_examples=300, deadline=None)
@given(minute=FIELD, hour=FIELD, dom=DOM, month=st.sampled_from(["*", "2", "jan-jun", "*/3", "1,7"]), dow=DOW)
def test_every_valid_expression_has_words(minute: str, hour: str, dom: str, month: str, dow: str) -> None:
    expr = f"{minute} {hour} {dom} {month} {dow}"
    try:
        CronExpression.parse(expr)
    except CronError:
        return
    words = describe(expr)
    assert words and words == words.strip() and "  " not in words
