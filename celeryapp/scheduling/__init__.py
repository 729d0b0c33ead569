"""When schedules are due: definitions and their limits, cadences and cron, the schedule store,
schedule files, beat (RedBeat entries, reconcile) and firing a slot."""
