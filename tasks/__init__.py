"""Celery tasks: thin wrappers naming the contract's tasks; the logic lives in ``celeryapp``."""
