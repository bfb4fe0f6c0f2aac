"""Operating a router (issue 19): its status as data, Prometheus metrics,
and the status page and metrics served over HTTP (docs/operations.md)."""
