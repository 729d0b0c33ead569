"""Advancement: the body of every step group's chord (and the link of re-queued steps)."""

from __future__ import annotations

from celeryapp import app
from celeryapp.dispatch import apply_effects
from celeryapp.lifecycle import advance_execution as advance_in_db
from models import transaction, utcnow


@app.task(name="chordbeat.advance_execution", acks_late=True, reject_on_worker_lost=True)
def advance_execution(execution_id: int, step_index: int, *_results: object) -> None:
    with transaction(app.settings.database_url) as session:
        effects = advance_in_db(session, execution_id, step_index, now=utcnow())
    apply_effects(app, effects)
