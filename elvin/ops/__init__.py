"""Operating a router: its status as data, Prometheus metrics,
and the status page and metrics served over HTTP (docs/operations.md)."""
