"""What a worker does with each message: fire a slot, run a step, and after commit carry out
what the run in the database decided (send chords, stop steps, rewrite beat entries)."""
