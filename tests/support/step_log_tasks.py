"""A step task that talks and fails, loaded by subprocess workers
(``CHORDBEAT_TASK_MODULES=tests.support.step_log_tasks``): what its activity keeps of it, and Flower shows."""

from __future__ import annotations

import logging

from celeryapp import app

logger = logging.getLogger("hr.bank")

#: The raising line, as the traceback shows it.
RAISING_LINE = 'raise ConnectionError(f"bank refused {url}")'


@app.task(name="steplog.chatty_fail")
def chatty_fail(lines: int = 200, url: str = "postgresql://bank:hunter2@bank.example/upload") -> None:
    for number in range(lines):
        logger.info("uploading record %s", number)
    print("giving up on the bank")  # a worker logs its steps' prints too (celery.redirected)
    raise ConnectionError(f"bank refused {url}")
