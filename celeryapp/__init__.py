"""chordbeat: scheduled multi-step executions on Celery chords.

``celery -A celeryapp worker`` finds the application as ``celeryapp.app``.
"""

from celeryapp.app import ChordbeatCelery, create_app

app: ChordbeatCelery = create_app()

__all__ = ["app", "create_app"]
