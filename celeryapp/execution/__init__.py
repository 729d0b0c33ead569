"""One run from start to finish: pure decisions, the run's lifecycle in the database (start, steps,
advance) and running a step (runner, heartbeat, step kinds and their policy)."""
