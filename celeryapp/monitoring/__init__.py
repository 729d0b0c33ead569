"""What operators watch: liveness files, overload counters and the Prometheus exporter."""
