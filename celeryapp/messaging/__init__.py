"""Redis and the broker: connections that ride out outages, key names, the reference clock."""
