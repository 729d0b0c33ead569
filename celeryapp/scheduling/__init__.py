"""Schedules in the database and in beat: the schedule store and schedule files, beat with
RedBeat, its entries as stored in Redis and their reconcile with the database."""
