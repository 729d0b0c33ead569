"""One run in the database: its start and the slot records, claiming and finishing steps,
advancing after a group, its end and cancellation."""
