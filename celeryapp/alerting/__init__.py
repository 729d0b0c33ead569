"""Alerts that reach people: the channels file, sending the outbox's deliveries, the deadline watch."""
