"""The pure domain: definitions and their validation, cadences and cron, limits, the decisions
and the effects they leave to do, names and times. It reads no clock, opens no connection and
imports nothing of chordbeat above it."""
