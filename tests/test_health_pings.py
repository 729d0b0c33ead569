"""The health page's workers: the last answers to a ping, asked again in the background.

A ping waits its whole timeout (1 s) however fast the workers answer, so a page that pinged on
every request took over a second each time (and each browser refreshes it every 5 s)."""

from __future__ import annotations

from typing import Any

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces.web.broker_state import WorkerPings, broker_state
from tests.support.helpers import wait_for


def test_the_page_shows_the_last_answers_and_a_stale_one_is_asked_again_in_the_background(
    app: ChordbeatCelery, worker: Any
) -> None:
    pings = WorkerPings(max_age_s=3600)
    first = broker_state(app, [], pings)
    assert first.error is None and worker.hostname in first.workers
    answers = pings.answers(app)
    # Fresh answers are shown as they are: no second ping.
    assert pings.answers(app) is answers
    assert broker_state(app, [], pings).workers == first.workers

    pings.max_age_s = 0.0
    # Stale: still the last answers at once, and one ping sent behind them.
    assert pings.answers(app) is answers
    wait_for(lambda: pings.answers(app).asked_at > answers.asked_at, 10, what="a ping in the background")
    assert worker.hostname in pings.answers(app).workers
    assert broker_state(app, [], pings).workers_age_s < 3600
