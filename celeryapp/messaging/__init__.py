"""Redis and the broker: connections that ride out outages, key names, sending chords."""
